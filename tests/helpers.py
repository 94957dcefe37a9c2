"""Test helpers shared by every converter test: convert, run in LiteRT, compare.

    from tests.helpers import assert_converts
    edge = assert_converts(torch.nn.Conv2d(3, 8, 3), (torch.randn(1, 3, 16, 16),))

The error metric, used everywhere in this project:

    max relative error = max|litert - torch| / max(max|torch|, 1e-12)

i.e. the worst absolute difference scaled by the largest magnitude of the reference
output (not element-wise: elements near zero would make element-wise ratios blow up).
An output passes when its max relative error <= rtol OR its max absolute error <= atol.
Integer and boolean outputs must match exactly.

Sentinels (mask constants such as -1e9 or -inf, any |value| >= SENTINEL_MAGNITUDE) are
compared apart: they must sit at exactly the same positions in both outputs and agree
there to float32 rounding; the metric above then runs on the other elements only, scaled
by THEIR largest magnitude (one -1e9 would otherwise scale every real error away).

`assert_converts` also runs the converted model on fresh inputs drawn like the sample
ones (same shapes and dtypes, other values), so a model that baked its export input into
a constant fails.
"""

from __future__ import annotations

import numpy as np
import torch

import litert_torch
from litert_torch.edge_model import EdgeModel
from runtimes.litert import max_relative_error  # the metric (see the module docstring)

SENTINEL_MAGNITUDE = 1e8  # masks use -1e9, -1e30, finfo.min or -inf; real activations stay far below
SENTINEL_RTOL = 1e-6  # float32 rounding of the sum of a sentinel and a real value


def max_abs_error(actual, expected) -> float:
    a, b = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def torch_outputs(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> list[np.ndarray]:
    """PyTorch's outputs, flattened like the converted model's, as numpy (CPU, float32 for bf16)."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(*args, **(kwargs or {}))
    finally:
        module.train(was_training)
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    result = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().to("cpu")
            result.append((t.float() if t.dtype == torch.bfloat16 else t).numpy())
        elif isinstance(leaf, (int, float, bool)):
            result.append(np.asarray(leaf))
    return result


def compare_outputs(actual: list, expected: list, *, rtol: float, atol: float, label: str = "") -> list[str]:
    """Human-readable problems (empty when every output matches)."""
    problems = []
    if len(actual) != len(expected):
        return [f"{label}LiteRT returned {len(actual)} output(s), PyTorch {len(expected)}"]
    for i, (a, b) in enumerate(zip(actual, expected)):
        a, b = np.asarray(a), np.asarray(b)
        name = f"{label}output {i}"
        if a.shape != b.shape:
            problems.append(f"{name}: shape {a.shape} in LiteRT, {b.shape} in PyTorch")
            continue
        if b.dtype.kind in "biu" or a.dtype.kind in "biu":
            if a.dtype.kind != b.dtype.kind and not {a.dtype.kind, b.dtype.kind} <= {"i", "u"}:
                problems.append(f"{name}: dtype {a.dtype} in LiteRT, {b.dtype} in PyTorch")
            elif not np.array_equal(a, b):
                bad = np.argwhere(a != b)
                idx = tuple(bad[0])
                problems.append(
                    f"{name}: {len(bad)} of {b.size} elements differ "
                    f"(first at {idx}: LiteRT {a[idx]}, PyTorch {b[idx]})"
                )
            continue
        if np.isnan(b).any() or np.isnan(a).any():
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                problems.append(
                    f"{name}: NaNs in different places (LiteRT {int(np.isnan(a).sum())}, "
                    f"PyTorch {int(np.isnan(b).sum())})"
                )
                continue
            a, b = np.where(np.isnan(a), 0, a), np.where(np.isnan(b), 0, b)
        sentinel_problem = compare_sentinels(a, b)
        if sentinel_problem:
            problems.append(f"{name}: {sentinel_problem}")
            continue
        real = np.abs(b.astype(np.float64)) < SENTINEL_MAGNITUDE
        a, b = a[real], b[real]  # flat from here on
        if not b.size:
            continue
        abs_err, rel_err = max_abs_error(a, b), max_relative_error(a, b)
        if rel_err <= rtol or abs_err <= atol:
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        worst = int(np.argmax(diff))
        idx = tuple(int(k) for k in np.argwhere(real)[worst])
        problems.append(
            f"{name} {list(real.shape)} {b.dtype}: max relative error {rel_err:.3g} > rtol {rtol:g} "
            f"(max abs error {abs_err:.3g} > atol {atol:g}); worst at {idx}: "
            f"LiteRT {a[worst]!r}, PyTorch {b[worst]!r}"
        )
    return problems


def compare_sentinels(actual: np.ndarray, expected: np.ndarray) -> str:
    """A problem with the sentinel elements (|value| >= SENTINEL_MAGNITUDE, inf included)
    of two float outputs, or "": same positions, same values to float32 rounding."""
    a, b = actual.astype(np.float64), expected.astype(np.float64)
    in_a, in_b = np.abs(a) >= SENTINEL_MAGNITUDE, np.abs(b) >= SENTINEL_MAGNITUDE
    if not np.array_equal(in_a, in_b):
        where = tuple(int(k) for k in np.argwhere(in_a != in_b)[0])
        return (
            f"sentinel (|x| >= {SENTINEL_MAGNITUDE:g}) positions differ: {int(in_a.sum())} in LiteRT, "
            f"{int(in_b.sum())} in PyTorch; first at {where}: LiteRT {a[where]!r}, PyTorch {b[where]!r}"
        )
    sa, sb = a[in_b], b[in_b]
    infinite = np.isinf(sb) | np.isinf(sa)
    with np.errstate(invalid="ignore"):  # inf - inf: those elements are compared by equality
        bad = np.where(infinite, sa != sb, np.abs(sa - sb) > SENTINEL_RTOL * np.abs(sb))
    if bad.any():
        where = tuple(int(k) for k in np.argwhere(in_b)[int(np.argmax(bad))])
        return f"sentinel values differ: {int(bad.sum())} of {sb.size}; first at {where}: LiteRT {a[where]!r}, PyTorch {b[where]!r}"
    return ""


def fresh_inputs(args: tuple, seed: int = 1234) -> tuple:
    """`args` with every floating tensor's values shuffled (same shape, dtype and value
    range, so quantization ranges and domains such as "positive" still hold; other
    positions). Integer and boolean tensors (ids, positions, masks) keep their values:
    their structure often matters (a mask row never fully masked)."""
    generator = torch.Generator().manual_seed(seed)

    def fresh(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1:
            order = torch.randperm(value.numel(), generator=generator)
            return value.detach().reshape(-1)[order].reshape(value.shape).clone()
        return value

    return tuple(torch.utils._pytree.tree_map(fresh, a) for a in args)


def assert_converts(
    module: torch.nn.Module,
    sample_args,
    sample_kwargs: dict | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    check_inputs: list | None = None,
    check_fresh: bool = True,
    **convert_kwargs,
) -> EdgeModel:
    """Convert `module`, run it in LiteRT on `sample_args`, on fresh inputs drawn like them
    (`fresh_inputs`; `check_fresh=False` only where the values themselves are the test's
    structure) and on each extra input tuple in `check_inputs` (e.g. other batch sizes for
    dynamic shapes), compare every output with PyTorch, and return the EdgeModel. Raises
    AssertionError with a diff."""
    args = sample_args if isinstance(sample_args, tuple) else (sample_args,)
    edge = litert_torch.convert(module, args, sample_kwargs, **convert_kwargs)
    runs = [(args, sample_kwargs, "")]
    fresh = fresh_inputs(args)
    if check_fresh and any(f is not a for f, a in zip(fresh, args)):
        runs.append((fresh, sample_kwargs, "fresh inputs: "))
    runs += [
        ((c if isinstance(c, tuple) else (c,)), None, f"check_inputs[{k}] ") for k, c in enumerate(check_inputs or [])
    ]
    problems = []
    for run_args, run_kwargs, label in runs:
        expected = torch_outputs(module, run_args, run_kwargs)
        actual = edge(*run_args, **(run_kwargs or {}))
        actual = list(actual) if isinstance(actual, tuple) else [actual]
        problems += compare_outputs(actual, expected, rtol=rtol, atol=atol, label=label)
    if problems:
        ops = ""
        if edge.ir_model is not None:
            ops = "\nconverted graph:\n" + "\n".join(str(g) for g in edge.ir_model.graphs)
            if len(ops) > 4000:
                ops = ops[:4000] + "\n  ..."
        raise AssertionError(
            f"{type(module).__name__} converted but LiteRT disagrees with PyTorch:\n  " + "\n  ".join(problems) + ops
        )
    return edge


def compile_for_tpu(fn, *args, chip: str = "v5e", static_argnums=()):
    """`jax.jit(fn)` compiled for one TPU chip ("v5e", "v6e", "v5p") on this machine, with
    libtpu's whole compiler (XLA's TPU passes and Mosaic's), so whatever the chip refuses
    raises here, not only on the chip. `args`: arrays or `jax.ShapeDtypeStruct`s (e.g. an
    `Exported`'s `in_avals`, to compile `exported.call`). The Pallas kernels inside take
    their compiled TPU path. Skips the test, saying why, only where libtpu is not installed.
    Returns the `jax.stages.Compiled` (`.memory_analysis()`, `.cost_analysis()`)."""
    import pytest

    from kernels import tpu

    if tpu.libtpu_version() is None:
        pytest.skip("compiling for a TPU needs libtpu (tools/setup.sh installs the version JAX pins)")
    return tpu.compile_for(chip, fn, *args, static_argnums=static_argnums)
