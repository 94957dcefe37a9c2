"""The ATen -> JAX lowering table, split by op family; importing this package fills it.

`LOWERINGS` (from `registry.py`) maps each ATen overload to its one `Lowering` record:
the JAX function, its kind (op / view / graph primitive), whether it needs RNG, is data
dependent (and when), or is functionalized (see `registry.py`).
`JAX_LOWERINGS` is its "op" part (the eager kernels); `covered_overloads()` lists them,
for parity suites and coverage reports; `coverage_by_family()` counts them per family
file. `DATA_DEPENDENT`, `DATA_DEPENDENT_WHEN` and `FUNCTIONALIZED` are read-only views
of the records' fields (nonzero/unique run eagerly on host values; `index.Tensor` only
with a bool mask; `native_batch_norm` writes its running statistics back).
"""

from __future__ import annotations

from tpu_backend import chip_limits
from tpu_backend.ops import (  # noqa: F401  (each import registers a family)
    activation,
    amp,
    attention,
    conv,
    creation,
    foreach,
    indexing,
    linalg,
    loss,
    norm,
    optimizers,
    pointwise,
    pooling,
    random,
    reduction,
    sampling,
    shape,
    sort,
    spectral,
    views,
)
from tpu_backend.ops.registry import (
    DATA_DEPENDENT,
    DATA_DEPENDENT_WHEN,
    FUNCTIONALIZED,
    JAX_LOWERINGS,
    LOWERINGS,
    Functionalized,
    Lowering,
    jax_dtype,
    lowers,
    torch_dtype,
)

chip_limits.guard_table()  # ops the TPU compiler refuses on some dtypes (tpu_backend/chip_limits.py)


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
    "LOWERINGS",
    "Lowering",
    "coverage_by_family",
    "covered_overloads",
    "jax_dtype",
    "lowers",
    "torch_dtype",
]
