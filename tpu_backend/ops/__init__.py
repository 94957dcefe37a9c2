"""The ATen -> JAX lowering table, split by op family; importing this package fills it.

`JAX_LOWERINGS` (from `registry.py`) maps each ATen overload to its lowering.
`covered_overloads()` lists them, for parity suites and coverage reports;
`coverage_by_family()` counts them per family file.
`DATA_DEPENDENT` names the lowerings whose output shape depends on tensor values
(nonzero, masked_select, unique...): they read their inputs on the host, so they
cannot run inside `jax.jit`; the device must call them eagerly (a sync point).
`DATA_DEPENDENT_WHEN` maps ops that are data-dependent only for some arguments
(`index.Tensor` with a bool mask) to a predicate `(args, kwargs) -> bool`.
`FUNCTIONALIZED` maps ATen ops that mutate an input besides `self`/`out`
(`native_batch_norm`'s running stats) to the functional lowering to run and the
outputs to write back (see `norm.py`).
"""

from __future__ import annotations

from tpu_backend.ops import (  # noqa: F401  (each import registers a family)
    activation,
    attention,
    conv,
    creation,
    foreach,
    indexing,
    linalg,
    loss,
    norm,
    pointwise,
    pooling,
    random,
    reduction,
    sampling,
    shape,
    sort,
)
from tpu_backend.ops._common import DATA_DEPENDENT, DATA_DEPENDENT_WHEN
from tpu_backend.ops.norm import FUNCTIONALIZED, Functionalized
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering, jax_dtype, lowers, torch_dtype


def covered_overloads() -> list:
    """Every ATen overload with a JAX lowering, sorted by name."""
    return sorted(JAX_LOWERINGS, key=str)


def coverage_by_family() -> dict[str, int]:
    """How many overloads each family file lowers (module name -> count)."""
    counts: dict[str, int] = {}
    for lowering in JAX_LOWERINGS.values():
        family = lowering.fn.__module__.rsplit(".", 1)[-1]
        counts[family] = counts.get(family, 0) + 1
    return dict(sorted(counts.items()))


__all__ = [
    "DATA_DEPENDENT",
    "DATA_DEPENDENT_WHEN",
    "FUNCTIONALIZED",
    "Functionalized",
    "JAX_LOWERINGS",
    "Lowering",
    "coverage_by_family",
    "covered_overloads",
    "jax_dtype",
    "lowers",
    "torch_dtype",
]
