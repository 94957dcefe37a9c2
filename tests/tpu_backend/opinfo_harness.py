"""Op parity between the "tpu" device and PyTorch CPU, driven by PyTorch's OpInfo database.

For each OpInfo entry (`torch.testing._internal.common_methods_invocations.op_db`) we draw
the op's own sample inputs on CPU, run the op on CPU and on the device (every tensor in the
sample moved with `.to(device)`, `device=` keyword arguments rewritten), bring the outputs
back and compare them with per-dtype tolerances. For ops that support autograd we also
compare input gradients: `torch.autograd.grad` of the floating outputs with the same random
cotangents on both sides.

This module is shared by `test_opinfo.py` (pytest) and `opinfo_report.py` (the table and
the counts). It owns the two lists that explain every op we do not compare value by value:
`SKIPS` (cannot run on the device by design, each with its reason) and `SHAPE_ONLY` (random
or uninitialised outputs: only shape, dtype and device are compared).

Environment: `PARITY_DEVICE=cpu` runs the whole harness CPU against CPU (a sanity check of
the harness itself, used while the device is being built).
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

# The device under test; "cpu" checks the harness against itself.
DEVICE = os.environ.get("PARITY_DEVICE", "tpu")

# (rtol, atol) per dtype for forward outputs. XLA's CPU kernels use different (still
# correctly rounded to a few ulp) approximations of transcendental functions and a
# different summation order than ATen's, so float32 gets a looser bound than
# torch.testing's default (1.3e-6, 1e-5).
FORWARD_TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-3),
    # bfloat16 has 8 mantissa bits; one rounding step is 2**-8 relative.
    torch.bfloat16: (1.6e-2, 1e-2),
}
# Gradients go through a chain of ops (and reductions of cotangents), so they are allowed
# ten times the forward error.
GRAD_TOLERANCE_FACTOR = 10.0

# OpInfo entries that cannot run on the device by design. Key: the entry's id
# (`name` or `name.variant`); value: why. Prefix keys ending in "." cover a family.
SKIPS: dict[str, str] = {
    # complex numbers: the device has no complex dtype
    **{
        f"fft.{name}": "uses torch.fft: complex input or output, complex dtype unsupported on the tpu device"
        for name in (
            "fft", "fft2", "fftn", "hfft", "hfft2", "hfftn", "rfft", "rfft2", "rfftn", "ifft", "ifft2",
            "ifftn", "ihfft", "ihfft2", "ihfftn", "irfft", "irfft2", "irfftn",
        )
    },
    "stft": "complex output (torch.stft): complex dtype unsupported on the tpu device",
    "istft": "complex input (torch.istft): complex dtype unsupported on the tpu device",
    "view_as_complex": "complex output: complex dtype unsupported on the tpu device",
    "polar": "complex output: complex dtype unsupported on the tpu device",
    "complex": "complex output: complex dtype unsupported on the tpu device",
    "cdouble": "converts to complex128: complex dtype unsupported on the tpu device",
    "chalf": "converts to complex32: complex dtype unsupported on the tpu device",
    "linalg.eig": "complex output (eigenvectors of a general matrix): complex dtype unsupported",
    "linalg.eigvals": "complex output (eigenvalues of a general matrix): complex dtype unsupported",
    # sparse layouts
    "to_sparse": "sparse layout: the tpu device holds dense tensors only",
    "sparse.sampled_addmm": "sparse layout: the tpu device holds dense tensors only",
    "sparse.mm.reduce": "sparse layout: the tpu device holds dense tensors only",
    # CUDA-only machinery
    "jiterator_unary": "CUDA jiterator only",
    "jiterator_binary": "CUDA jiterator only",
    "jiterator_4inputs_with_extra_args": "CUDA jiterator only",
    "jiterator_binary_return_by_ref": "CUDA jiterator only",
    "jiterator_2inputs_2outputs": "CUDA jiterator only",
    # a limit of comparing through .to(): not a device property
    "as_strided.partial_views": (
        "the sample is a view into a larger base and as_strided reads outside the view; "
        ".to(device) copies only the view's elements, so CPU and device read different storage"
    ),
}

# Ops whose outputs are random or uninitialised: only shape, dtype and device are compared.
SHAPE_ONLY: dict[str, str] = {
    name: "random output: the device draws from jax.random, values cannot match torch's CPU generator"
    for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
        "normal.in_place", "normal.number_mean", "uniform", "multinomial", "rand_like",
        "randn_like", "randint_like", "randint", "randn",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    )
} | {
    name: "uninitialised output (empty*): values are arbitrary"
    for name in ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")
}


# skip_reason() for entries that do not exist for a dtype (e.g. bitwise ops in float32):
# reported as "n/a", not counted as skips.
NOT_APPLICABLE = "op_db lists no CPU support for this dtype"


# Ops that fail on the device today for reasons that are fixable (a missing lowering, a
# wrong result): the slow full sweep expects them to fail (xfail, not strict: the list is
# regenerated from `opinfo_report.py`). Every entry names the error; see the report.
KNOWN_FAILURES: dict[str, str] = {}
# The same for the sampled forward pass in other dtypes.
KNOWN_FAILURES_BY_DTYPE: dict[torch.dtype, dict[str, str]] = {torch.bfloat16: {}, torch.int64: {}, torch.bool: {}}

# A representative subset run in the default suite (a few samples each, forward and
# grad): one or more ops per family the training models and common code use.
FAST_OPS = (
    # pointwise
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "exp", "log", "sqrt", "rsqrt", "tanh",
    "sigmoid", "abs", "neg", "clamp", "where", "maximum", "lerp", "addcmul", "masked_fill",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    # reductions
    "sum", "mean", "amax", "max.reduction_with_dim", "argmax", "var", "std", "cumsum", "softmax",
    "log_softmax", "logsumexp",
    # linear algebra and nn
    "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.conv2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.batch_norm", "nn.functional.layer_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.scaled_dot_product_attention",
    # shape and indexing
    "cat", "stack", "transpose", "permute", "reshape", "view", "expand", "squeeze", "unsqueeze",
    "__getitem__", "index_select", "gather", "scatter_add", "index_put", "flip", "roll", "tril",
    "nn.functional.pad.constant", "sort", "topk",
    # creation and random
    "zeros_like", "full", "arange", "randn", "nn.functional.dropout",
)


def op_id(op) -> str:
    """`name` or `name.variant_test_name`: the key used by SKIPS, SHAPE_ONLY and the reports."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def skip_reason(op, dtype: torch.dtype) -> str | None:
    """Why this OpInfo entry is not run for `dtype`, or None to run it."""
    if op_id(op) in SKIPS:
        return SKIPS[op_id(op)]
    if dtype not in op.supported_dtypes("cpu"):
        return NOT_APPLICABLE
    return None


def all_ops():
    """Every OpInfo entry (importing op_db takes ~10 s, so callers import it lazily)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


@functools.cache
def ops_by_id() -> dict[str, Any]:
    return {op_id(op): op for op in all_ops()}


@dataclass
class OpResult:
    """The outcome of one OpInfo entry for one dtype.

    status: "pass", "shape-only" (random/uninitialised outputs: metadata checked),
    "skip" (reason in `detail`), "n/a" (op_db has no CPU support for the dtype), "fail" (an error was raised on the device) or
    "mismatch" (ran, but values/shapes/dtypes/grads differ from CPU).
    """

    op: str
    dtype: torch.dtype
    status: str
    detail: str = ""
    samples: int = 0
    grad_checked: int = 0
    seconds: float = 0.0
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "shape-only", "skip", "n/a")


class Mismatch(AssertionError):
    """The device ran the op but its result differs from CPU."""


@dataclass
class _Moved:
    """A sample moved to the device, with its gradient leaves in the same order as CPU's."""

    input: Any
    args: Any
    kwargs: Any
    leaves: list = field(default_factory=list)


def _collect_leaves(value, leaves: list) -> None:
    """Tensors that require grad, in the order `_move` meets them (each tensor once)."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad and not any(value is leaf for leaf in leaves):
            leaves.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_leaves(item, leaves)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_leaves(item, leaves)


def _move(value, device: str, leaves: list, memo: dict):
    """A copy of `value` with every tensor on `device`; tensors that require grad become
    leaves there (appended to `leaves` in traversal order) and `device=` keywords follow.
    A tensor that appears twice in a sample is moved once (`memo`), so its gradient sums
    both uses as on CPU."""
    if isinstance(value, torch.Tensor):
        if id(value) in memo:
            return memo[id(value)]
        moved = value.detach().to(device, copy=True)
        if value.requires_grad:
            moved.requires_grad_(True)
            leaves.append(moved)
        memo[id(value)] = moved
        return moved
    if isinstance(value, torch.device) or (isinstance(value, str) and value == "cpu"):
        # device arguments (`x.to("cpu", ...)`, `device=`) name the device under test
        return torch.device(device)
    if isinstance(value, list):
        return [_move(v, device, leaves, memo) for v in value]
    if isinstance(value, tuple):
        return tuple(_move(v, device, leaves, memo) for v in value)
    if isinstance(value, dict):
        return {k: _move_kwarg(k, v, device, leaves, memo) for k, v in value.items()}
    return value


def _move_kwarg(key: str, value, device: str, leaves: list, memo: dict):
    if key == "device" and isinstance(value, (str, torch.device)):
        return torch.device(device)
    return _move(value, device, leaves, memo)


def move_sample(sample, device: str) -> _Moved:
    """The sample's input, args and kwargs on `device` (CPU-side leaves keep their order)."""
    leaves: list = []
    memo: dict = {}
    return _Moved(
        _move(sample.input, device, leaves, memo),
        _move(sample.args, device, leaves, memo),
        _move(sample.kwargs, device, leaves, memo),
        leaves,
    )


def _flatten(value) -> list:
    """Outputs as a flat list (tensors, numbers, sizes...), namedtuples and nesting removed."""
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def _to_cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def compare_outputs(actual, expected, shape_only: bool, what: str, factor: float = 1.0, device: str = DEVICE):
    """Raise Mismatch unless the outputs `actual` (on `device`) match the CPU outputs `expected`."""
    actual_flat, expected_flat = _flatten(actual), _flatten(expected)
    if len(actual_flat) != len(expected_flat):
        raise Mismatch(f"{what}: {len(actual_flat)} outputs on {device}, {len(expected_flat)} on cpu")
    for index, (got, want) in enumerate(zip(actual_flat, expected_flat)):
        label = f"{what}[{index}]"
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise Mismatch(f"{label}: expected a tensor, got {type(got).__name__}")
            if want.device.type == "cpu" and got.device.type != torch.device(device).type:
                raise Mismatch(f"{label}: output is on {got.device}, expected {device}")
            got = _to_cpu(got)
            if got.shape != want.shape or got.dtype != want.dtype:
                raise Mismatch(
                    f"{label}: got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
                )
            if shape_only or want.is_complex():
                continue
            rtol, atol = FORWARD_TOLERANCES.get(want.dtype, (0.0, 0.0))
            try:
                torch.testing.assert_close(
                    got, want, rtol=rtol * factor, atol=atol * factor, equal_nan=True, check_stride=False
                )
            except AssertionError as error:
                raise Mismatch(f"{label}: {_first_lines(str(error), 4)}") from None
        elif want is None or got is None:
            if got is not want:
                raise Mismatch(f"{label}: got {got!r}, expected {want!r}")
        elif not shape_only:
            try:
                torch.testing.assert_close(got, want, equal_nan=True)
            except (AssertionError, TypeError) as error:
                raise Mismatch(f"{label}: got {got!r}, expected {want!r} ({_first_lines(str(error), 1)})") from None


def _first_lines(text: str, count: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[:count])


def _differentiable_outputs(outputs: list) -> list[int]:
    return [
        i
        for i, out in enumerate(outputs)
        if isinstance(out, torch.Tensor) and out.requires_grad and out.dtype.is_floating_point
    ]


def _is_random_sample(op, sample, expected, seed: int) -> bool:
    """True if the op's CPU output for this sample changes with the RNG seed."""
    torch.manual_seed(seed + 1_000_003)
    with torch.no_grad():
        again = op(sample.input, *sample.args, **sample.kwargs)
    try:
        compare_outputs(again, expected, False, "output", device="cpu")
    except Mismatch:
        return True
    return False


def _check_sample(op, sample, shape_only: bool, check_grad: bool, seed: int) -> bool:
    """Run one sample on CPU and on the device and compare; True if gradients were compared."""
    moved = move_sample(sample, DEVICE)
    cpu_leaves: list = []
    _collect_leaves((sample.input, sample.args, sample.kwargs), cpu_leaves)

    torch.manual_seed(seed)
    expected = op(sample.input, *sample.args, **sample.kwargs)
    # Some samples of deterministic ops draw random numbers: if CPU itself gives another
    # answer under another seed, only metadata can match.
    # OpInfo seeds CPU's generator inside some ops (attention with dropout_p > 0), which
    # the seed check cannot see: a positive dropout_p means random values too.
    draws_dropout = (sample.kwargs.get("dropout_p") or 0) > 0
    shape_only = shape_only or draws_dropout or _is_random_sample(op, sample, expected, seed)
    torch.manual_seed(seed)
    actual = op(moved.input, *moved.args, **moved.kwargs)
    compare_outputs(actual, expected, shape_only, "output")

    if not (check_grad and cpu_leaves) or shape_only:
        return False
    expected_outs = _flatten(sample.output_process_fn_grad(expected))
    actual_outs = _flatten(sample.output_process_fn_grad(actual))
    picked = _differentiable_outputs(expected_outs)
    if not picked:
        return False
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(expected_outs[i].shape, generator=generator, dtype=expected_outs[i].dtype) for i in picked]
    expected_grads = torch.autograd.grad(
        [expected_outs[i] for i in picked], cpu_leaves, cotangents, allow_unused=True
    )
    actual_grads = torch.autograd.grad(
        [actual_outs[i] for i in picked],
        moved.leaves,
        [c.to(DEVICE) for c in cotangents],
        allow_unused=True,
    )
    compare_outputs(list(actual_grads), list(expected_grads), False, "grad", factor=GRAD_TOLERANCE_FACTOR)
    return True


def check_op(op, dtype: torch.dtype = torch.float32, max_samples: int | None = None, check_grad: bool = True) -> OpResult:
    """Compare one OpInfo entry on the device against CPU; never raises (the result says why)."""
    name = op_id(op)
    reason = skip_reason(op, dtype)
    if reason is not None:
        return OpResult(name, dtype, "n/a" if reason == NOT_APPLICABLE else "skip", reason)
    shape_only = name in SHAPE_ONLY
    wants_grad = check_grad and op.supports_autograd and dtype.is_floating_point
    start = time.perf_counter()
    result = OpResult(name, dtype, "shape-only" if shape_only else "pass")
    try:
        torch.manual_seed(0)
        samples = op.sample_inputs("cpu", dtype, requires_grad=wants_grad)
        for index, sample in enumerate(samples):
            if max_samples is not None and index >= max_samples:
                break
            try:
                grad_checked = _check_sample(op, sample, shape_only, wants_grad, seed=index)
            except Exception as error:
                error.add_note(f"sample {index}: {_describe(sample)}")
                raise
            result.samples += 1
            result.grad_checked += int(grad_checked)
    except Mismatch as error:
        result.status, result.detail = "mismatch", _error_text(error)
    except Exception as error:  # noqa: BLE001 - the report must name every failure
        result.status, result.detail = "fail", _error_text(error)
        result.where = _innermost_project_frame(error)
    result.seconds = time.perf_counter() - start
    return result


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {_first_lines(str(error), 3)}"
    # our own "sample i: ..." notes; JAX adds a long note about filtered frames
    notes = [note for note in getattr(error, "__notes__", ()) if note.startswith("sample ")]
    if notes:
        text += f" [{'; '.join(notes)}]"
    return text[:600]


def _innermost_project_frame(error: BaseException) -> str:
    """file:line of the deepest frame inside this project (where T1/T2 should look)."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if "/tpu_backend/" in frame.filename:
            return f"{frame.filename.split('/work/main/')[-1]}:{frame.lineno}"
    return ""


def _describe(sample) -> str:
    def describe(value):
        if isinstance(value, torch.Tensor):
            return f"T{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(describe(v) for v in value[:6])
            return f"[{inner}{', ...' if len(value) > 6 else ''}]"
        return repr(value)[:40]

    parts = [describe(sample.input)] + [describe(a) for a in sample.args]
    parts += [f"{k}={describe(v)}" for k, v in sample.kwargs.items()]
    return f"({', '.join(parts)})"


def run_ops(
    ops: Iterable, dtype: torch.dtype = torch.float32, max_samples: int | None = None, check_grad: bool = True
) -> list[OpResult]:
    return [check_op(op, dtype, max_samples=max_samples, check_grad=check_grad) for op in ops]
