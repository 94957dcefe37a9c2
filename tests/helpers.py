"""Test helpers shared by every converter test: convert, run in LiteRT, compare.

    from tests.helpers import assert_converts
    edge = assert_converts(torch.nn.Conv2d(3, 8, 3), (torch.randn(1, 3, 16, 16),))

The error metric, used everywhere in this project:

    max relative error = max|litert - torch| / max(max|torch|, 1e-12)

i.e. the worst absolute difference scaled by the largest magnitude of the reference
output (not element-wise: elements near zero would make element-wise ratios blow up).
An output passes when its max relative error <= rtol OR its max absolute error <= atol.
Integer and boolean outputs must match exactly.
"""

from __future__ import annotations

import numpy as np
import torch

import litert_torch
from litert_torch.edge_model import EdgeModel
from runtimes.litert import max_relative_error  # the metric (see the module docstring)


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
                problems.append(f"{name}: {len(bad)} of {b.size} elements differ "
                                f"(first at {idx}: LiteRT {a[idx]}, PyTorch {b[idx]})")
            continue
        if np.isnan(b).any() or np.isnan(a).any():
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                problems.append(f"{name}: NaNs in different places (LiteRT {int(np.isnan(a).sum())}, "
                                f"PyTorch {int(np.isnan(b).sum())})")
                continue
            a, b = np.nan_to_num(a), np.nan_to_num(b)
        abs_err, rel_err = max_abs_error(a, b), max_relative_error(a, b)
        if rel_err <= rtol or abs_err <= atol:
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
        problems.append(
            f"{name} {list(b.shape)} {b.dtype}: max relative error {rel_err:.3g} > rtol {rtol:g} "
            f"(max abs error {abs_err:.3g} > atol {atol:g}); worst at {tuple(int(k) for k in idx)}: "
            f"LiteRT {a[idx]!r}, PyTorch {b[idx]!r}")
    return problems


def assert_converts(module: torch.nn.Module, sample_args, sample_kwargs: dict | None = None, *,
                    rtol: float = 1e-4, atol: float = 1e-5, check_inputs: list | None = None,
                    **convert_kwargs) -> EdgeModel:
    """Convert `module`, run it in LiteRT on `sample_args` (and on each extra input
    tuple in `check_inputs`, e.g. other batch sizes for dynamic shapes), compare every
    output with PyTorch, and return the EdgeModel. Raises AssertionError with a diff."""
    args = sample_args if isinstance(sample_args, tuple) else (sample_args,)
    edge = litert_torch.convert(module, args, sample_kwargs, **convert_kwargs)
    runs = [(args, sample_kwargs)] + [((c if isinstance(c, tuple) else (c,)), None) for c in (check_inputs or [])]
    problems = []
    for k, (run_args, run_kwargs) in enumerate(runs):
        expected = torch_outputs(module, run_args, run_kwargs)
        actual = edge(*run_args, **(run_kwargs or {}))
        actual = list(actual) if isinstance(actual, tuple) else [actual]
        label = "" if k == 0 else f"check_inputs[{k - 1}] "
        problems += compare_outputs(actual, expected, rtol=rtol, atol=atol, label=label)
    if problems:
        ops = ""
        if edge.ir_model is not None:
            ops = "\nconverted graph:\n" + "\n".join(str(g) for g in edge.ir_model.graphs)
            if len(ops) > 4000:
                ops = ops[:4000] + "\n  ..."
        raise AssertionError(f"{type(module).__name__} converted but LiteRT disagrees with PyTorch:\n  "
                             + "\n  ".join(problems) + ops)
    return edge
