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
or uninitialised outputs: only shape, dtype and device are compared; samples that draw
random numbers, e.g. attention with dropout_p > 0, are detected and treated alike), and
`KNOWN_FAILURES` (failures found by the sweep, each a `KnownFailure`: the exact error it
records, i.e. status, failing sample and message, and the reason in words; a test xfails
only when the op fails with exactly that error, so a new bug in a known-failing op still
fails; regenerate with `opinfo_report --emit-known-failures`).

Three comparison rules besides plain tolerances: a float32 (bfloat16, float16) value mismatch
is re-judged against the op computed in float64 on CPU (`_judge_by_float64`: the device passes
if it is within the dtype's tolerance of that reference or no further from it than CPU's own
result; the measured errors are kept in `OpResult.notes` and printed by the report),
eigen/singular vectors are compared up to sign (`SIGN_INVARIANT`: PyTorch leaves the sign
unspecified), and the indices of topk, kthvalue, mode and unstable sorts up to ties (`TIE_INVARIANT`: an index
of another element of the same value is as valid).
Samples that build their tensor arguments on CPU on purpose keep them there (`HOST_ARGS`), and
factory samples without tensors or `device=` run under `torch.device(DEVICE)`.

Environment: `PARITY_DEVICE=cpu` runs the whole harness CPU against CPU (a sanity check of
the harness itself, used while the device is being built).
"""

from __future__ import annotations

import functools
import os
import re
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from tests.tpu_backend import opinfo_random
from tests.tpu_backend.opinfo_random import RANDOM_CHECKS

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


@dataclass(frozen=True)
class KnownFailure:
    """A recorded failure of one OpInfo entry.

    error: the `OpResult.signature` it produced (status, failing sample index, message with
    the mismatch's size and place), compared exactly; reason: why it fails, for a user.
    """

    error: str
    reason: str

    def matches(self, result: "OpResult") -> bool:
        return result.signature == self.error


# OpInfo entries that cannot run on the device by design. Key: the entry's id
# (`name` or `name.variant`); value: why. Prefix keys ending in "." cover a family.
SKIPS: dict[str, str] = {
    # complex numbers
    "cdouble": "converts to complex128: the tpu device holds complex64 only",
    "chalf": "converts to complex32: JAX has no complex32 dtype",
    "linalg.eig": "eigen-decomposition of a general matrix: JAX implements it on CPU only (no TPU lowering)",
    "linalg.eigvals": "eigen-decomposition of a general matrix: JAX implements it on CPU only (no TPU lowering)",
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

# Ops whose outputs are random or uninitialised: only shape, dtype and device are compared
# against CPU. The random ones in `opinfo_random.RANDOM_CHECKS` are also value-checked on
# the device (same seed -> same values, support, moments, dropout's kept fraction and
# scaling) and count as "pass" when those checks pass.
SHAPE_ONLY: dict[str, str] = (
    {
        name: "random output: the device draws from jax.random, values cannot match torch's CPU generator"
        for name in (
            "bernoulli",
            "cauchy",
            "exponential",
            "geometric",
            "log_normal",
            "normal",
            "normal.in_place",
            "normal.number_mean",
            "uniform",
            "multinomial",
            "rand_like",
            "randn_like",
            "randint_like",
            "randint",
            "randn",
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.alpha_dropout",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.feature_alpha_dropout.without_train",
            "nn.functional.rrelu",
            "nn.functional.fractional_max_pool2d",
            "nn.functional.fractional_max_pool3d",
        )
    }
    | {
        name: "uninitialised output (empty*): values are arbitrary"
        for name in ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")
    }
    | {
        name: "randomized algorithm (draws random projections): values depend on the generator"
        for name in ("svd_lowrank", "pca_lowrank")
    }
)


# Ops whose OpInfo samples build some tensor arguments on the CPU whatever the device, because
# PyTorch requires them there: those arguments (`sample.args`) are not moved to the device.
HOST_ARGS: dict[str, str] = {
    "tensor_split": "tensor_indices_or_sections must be a CPU tensor on every device (ATen checks it)",
}


def _align_signs(actual, expected, vector_axes: dict[int, int]):
    """Device outputs with each eigen/singular vector's sign flipped to agree with CPU's.

    PyTorch leaves those signs unspecified (a vector v and -v are equally valid), so they are
    compared up to sign: `vector_axes` maps output index -> the axis that indexes the vectors
    (-1: columns, -2: rows); the sign of vector k comes from the first output listed. Vectors
    beyond the paired values (full_matrices=True) span the orthogonal complement, where any
    basis is valid: those are compared by their projector and, if it matches, taken from CPU.
    """
    if not isinstance(actual, tuple) or not all(isinstance(t, torch.Tensor) for t in actual):
        return actual
    got, want = list(actual), list(expected)  # the device outputs stay in the autograd graph
    first, axis = next(iter(vector_axes.items()))
    if got[first].numel() == 0 or got[first].shape != want[first].shape:
        return actual
    values = got[1].shape[-1]  # S or the eigenvalues: how many vectors are paired
    paired = lambda t, ax: t.narrow(ax, 0, min(values, t.shape[ax]))
    agreement = (paired(got[first].detach().cpu(), axis) * paired(want[first].detach(), axis)).sum(
        dim=-2 if axis == -1 else -1
    )
    sign = torch.where(agreement < 0, -1.0, 1.0).to(want[first].dtype).to(got[first].device)
    for index, ax in vector_axes.items():
        t = got[index]
        count = min(values, t.shape[ax])
        head = t.narrow(ax, 0, count) * (sign.unsqueeze(-2) if ax == -1 else sign.unsqueeze(-1))
        rest, rest_cpu = t.narrow(ax, count, t.shape[ax] - count), want[index].narrow(ax, count, t.shape[ax] - count)
        if rest.shape[ax]:

            def projector(m, ax=ax):  # the span of the remaining vectors, independent of their basis
                columns = m if ax == -1 else m.mT
                return columns @ columns.mT

            if torch.allclose(projector(rest.detach().cpu()), projector(rest_cpu.detach()), atol=1e-4):
                rest = rest_cpu.detach().to(t.device)
        got[index] = torch.cat([head, rest], dim=ax)
    return type(actual)(*got) if hasattr(actual, "_fields") else tuple(got)


# Ops whose outputs are eigen or singular vectors: compared up to each vector's sign.
SIGN_INVARIANT: dict[str, dict[int, int]] = {
    "svd": {0: -1, 2: -1},  # (U, S, V): vectors are columns of U and of V
    "linalg.svd": {0: -1, 2: -2},  # (U, S, Vh): columns of U, rows of Vh
    "linalg.eigh": {1: -1},  # (L, Q): columns of Q
}


# Ops returning the indices of chosen elements where PyTorch leaves the choice among equal
# elements unspecified (topk's and kthvalue's docs; `sort(stable=False)`; mode's CPU kernel
# takes the index from an unstable std::sort): device indices count as CPU's when they pick
# elements of the same values (and distinct positions where several are returned).
# op id -> (indices output, position of `dim` in the sample's args, does the output keep
# `dim` always ("kept") or only with keepdim, the argument after dim ("keepdim")).
TIE_INVARIANT: dict[str, tuple[int, int, str]] = {
    "topk": (1, 1, "kept"),
    "kthvalue": (1, 1, "keepdim"),
    "mode": (1, 0, "keepdim"),
    "sort": (1, 0, "kept"),
    "argsort": (0, 0, "kept"),
}


def _align_tied_indices(actual, expected, sample, rule: tuple[int, int, str]):
    """The device outputs with the indices output taken from CPU if the device's select
    elements of the same values along `dim` (distinct positions for topk and sort); left
    as they are otherwise (and then compared, and reported, as usual)."""
    if sample.kwargs.get("stable") or not isinstance(sample.input, torch.Tensor) or sample.input.ndim == 0:
        return actual
    out, dim_at, keeps = rule
    args, x = sample.args, sample.input.detach()
    dim = args[dim_at] if len(args) > dim_at else sample.kwargs.get("dim", -1)
    keepdim = keeps == "kept" or (args[dim_at + 1] if len(args) > dim_at + 1 else sample.kwargs.get("keepdim", False))
    outputs = list(actual) if isinstance(actual, tuple) else [actual]
    want = expected[out] if isinstance(expected, tuple) else expected
    got = outputs[out].detach().cpu()
    if got.shape != want.shape or got.dtype != torch.int64 or want.dtype != torch.int64 or not got.numel():
        return actual
    got_at, want_at = (got, want) if keepdim else (got.unsqueeze(dim), want.unsqueeze(dim))
    if got_at.min() < 0 or got_at.max() >= x.shape[dim]:
        return actual
    got_values, want_values = x.gather(dim, got_at), x.gather(dim, want_at)
    same = (got_values == want_values) | (got_values.isnan() & want_values.isnan())
    distinct = keeps != "kept" or bool((got_at.sort(dim).values.diff(dim=dim) != 0).all())
    if not (bool(same.all()) and distinct):
        return actual
    outputs[out] = want.to(outputs[out].device)
    return tuple(outputs) if isinstance(actual, tuple) else outputs[0]


# skip_reason() for entries that do not exist for a dtype (e.g. bitwise ops in float32):
# reported as "n/a", not counted as skips.
NOT_APPLICABLE = "op_db lists no CPU support for this dtype"


# Ops that fail on the device today for reasons that are fixable (a missing lowering, a
# wrong result): the slow full sweep expects them to fail (xfail, not strict: the list is
# regenerated from `opinfo_report.py`). Every entry names the error; see the report.
KNOWN_FAILURES: dict[str, KnownFailure] = {}
# The same for the sampled forward pass in other dtypes (the slow test runs 2 samples; a
# failure recorded at a later sample passes there).
KNOWN_FAILURES_BY_DTYPE: dict[torch.dtype, dict[str, KnownFailure]] = {
    # bfloat16: one sweep on 2026-12-02, forward, --max-samples 4 (see docs/measurements/device.md)
    torch.bfloat16: {
        "nn.functional.interpolate.bicubic": KnownFailure(
            "mismatch at sample 3: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 1 / 180 (0.6%) | Greatest absolute difference: 0.0133056640625 at index (1, 2, 1, 2) (up to 0.01 allowed) (vs float64: device",
            "bfloat16 rounding: 1 of 180 elements differs from CPU by 0.0133 (0.01 allowed); measured against the float64 result the device is 0.0331 off and CPU 0.0265: both round the weighted sum, at different steps",
        ),
        "nn.functional.interpolate.trilinear": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 1 / 750 (0.1%) | Greatest absolute difference: 0.0126953125 at index (1, 2, 1, 2, 3) (up to 0.01 allowed) (vs float64: device",
            "bfloat16 rounding: 1 of 750 elements differs from CPU by 0.0127 (0.01 allowed); measured against the float64 result the device is 0.0332 off and CPU 0.0312: both round the weighted sum, at different steps",
        ),
        "hash_tensor": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.hash_tensor.out. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.hash_tensor.out yet (a bitwise hash, the same in every dtype; written with the float32 work)",
        ),
    },
    # int64: one sweep on 2026-12-02 (see docs/measurements/device.md); the only failures left
    torch.int64: {
        "hash_tensor": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.hash_tensor.out. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.hash_tensor.out yet (a bitwise hash, the same in every dtype; written with the float32 work)",
        ),
        "special.airy_ai": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.special_airy_ai.out. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.special_airy_ai.out yet: JAX has no Airy function (integers go through the same float32 lowering)",
        ),
    },
    torch.bool: {
        "equal": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.equal.default. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.equal.default yet",
        ),
        "polygamma.polygamma_n_0": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "polygamma.polygamma_n_1": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "polygamma.polygamma_n_2": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "polygamma.polygamma_n_3": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "polygamma.polygamma_n_4": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "hash_tensor": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.hash_tensor.out. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.hash_tensor.out yet",
        ),
        "special.polygamma.special_polygamma_n_0": KnownFailure(
            "mismatch at sample 1: Mismatch: output[0]: Tensor-likes are not close! |  | Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed)",
            "polygamma at the poles (non-positive integers): ATen and JAX return different infinities/NaN",
        ),
        "special.airy_ai": KnownFailure(
            "fail at sample 0: TpuLoweringError: no tpu lowering for aten.special_airy_ai.out. Add a JAX lowering in tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) (or TPU_CPU_FALLBACK=1).",
            "no lowering for aten.special_airy_ai.out yet",
        ),
    },
}

# A representative subset run in the default suite (a few samples each, forward and
# grad): one or more ops per family the training models and common code use.
FAST_OPS = (
    # pointwise
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "pow",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "abs",
    "neg",
    "clamp",
    "where",
    "maximum",
    "lerp",
    "addcmul",
    "masked_fill",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.silu",
    # reductions
    "sum",
    "mean",
    "amax",
    "max.reduction_with_dim",
    "argmax",
    "var",
    "std",
    "cumsum",
    "softmax",
    "log_softmax",
    "logsumexp",
    # linear algebra and nn
    "mm",
    "bmm",
    "addmm",
    "matmul",
    "nn.functional.linear",
    "nn.functional.conv2d",
    "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d",
    "nn.functional.batch_norm",
    "nn.functional.layer_norm",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "nn.functional.mse_loss",
    "nn.functional.scaled_dot_product_attention",
    # shape and indexing
    "cat",
    "stack",
    "transpose",
    "permute",
    "reshape",
    "view",
    "expand",
    "squeeze",
    "unsqueeze",
    "__getitem__",
    "index_select",
    "gather",
    "scatter_add",
    "index_put",
    "flip",
    "roll",
    "tril",
    "nn.functional.pad.constant",
    "sort",
    "topk",
    # creation and random
    "zeros_like",
    "full",
    "arange",
    "randn",
    "nn.functional.dropout",
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
    failed_sample: int | None = None
    message: str = ""
    # samples that passed against a float64 reference only, with the measured errors
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "shape-only", "skip", "n/a")

    @property
    def signature(self) -> str:
        """What identifies a failure: status, sample index and the start of the message
        (for mismatches: which output, how many elements, the greatest difference and where)."""
        if self.ok:
            return ""
        sample = "-" if self.failed_sample is None else self.failed_sample
        return f"{self.status} at sample {sample}: {self.message[:SIGNATURE_CHARS]}"


# Characters of an error message kept in a failure's signature: enough for the exception
# type, the output index, the mismatch count and the greatest difference with its index.
SIGNATURE_CHARS = 200


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


def move_sample(sample, device: str, keep_args_on_host: bool = False) -> _Moved:
    """The sample's input, args and kwargs on `device` (CPU-side leaves keep their order);
    `keep_args_on_host` leaves `sample.args` where they are (see HOST_ARGS)."""
    leaves: list = []
    memo: dict = {}
    return _Moved(
        _move(sample.input, device, leaves, memo),
        sample.args if keep_args_on_host else _move(sample.args, device, leaves, memo),
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


def _mha_dropout(op, sample) -> bool:
    """multi_head_attention_forward in training with a positive (positional) dropout_p: OpInfo
    seeds the generator inside the op, so the seed check cannot see the randomness."""
    if op_id(op) != "nn.functional.multi_head_attention_forward":
        return False
    return sample.kwargs.get("training", True) and len(sample.args) > 9 and sample.args[9] > 0


def _names_no_device(sample) -> bool:
    """True if the sample holds no tensor and no device argument."""

    def has_tensor(value) -> bool:
        if isinstance(value, torch.Tensor):
            return True
        if isinstance(value, (list, tuple)):
            return any(has_tensor(v) for v in value)
        if isinstance(value, dict):
            return any(has_tensor(v) for v in value.values())
        return False

    return "device" not in sample.kwargs and not has_tensor((sample.input, sample.args, sample.kwargs))


def _run_on_device(op, sample, moved, seed: int):
    torch.manual_seed(seed)
    if _names_no_device(sample):
        # a factory call without tensors or device= (`torch.arange(2)`) builds on the default
        # device: on the device side that is the device under test, as a user would set it
        with torch.device(DEVICE):
            return op(moved.input, *moved.args, **moved.kwargs)
    return op(moved.input, *moved.args, **moved.kwargs)


def _check_random_values(op, sample, pristine, actual, seed: int) -> None:
    """A random op's device output: the same seed gives the same values, and the values fit
    the distribution (`opinfo_random.RANDOM_CHECKS`)."""
    inputs, args, kwargs = opinfo_random.snapshot(pristine)
    again = move_sample(types.SimpleNamespace(input=inputs, args=args, kwargs=kwargs), DEVICE)
    repeated = _run_on_device(op, sample, again, seed)
    for first, second in zip(_flatten(actual), _flatten(repeated)):
        if isinstance(first, torch.Tensor) and not torch.equal(first.cpu(), second.cpu()):
            raise Mismatch("output: the same seed gave different values on the device")
    outs = [out.detach().cpu() for out in _flatten(actual) if isinstance(out, torch.Tensor)]
    try:
        RANDOM_CHECKS[op_id(op)]({"input": pristine[0], "args": pristine[1], "kwargs": pristine[2]}, *outs)
    except opinfo_random.RandomCheckFailed as error:
        raise Mismatch(f"output: {error}") from None


def _check_sample(op, sample, shape_only: bool, check_grad: bool, seed: int, notes: list) -> bool:
    """Run one sample on CPU and on the device and compare; True if gradients were compared.
    Float32 mismatches that are CPU's rounding (see `_judge_by_float64`) add to `notes`."""
    pristine = (
        opinfo_random.snapshot((sample.input, sample.args, sample.kwargs)) if op_id(op) in RANDOM_CHECKS else None
    )
    moved = move_sample(sample, DEVICE, keep_args_on_host=op_id(op) in HOST_ARGS)
    cpu_leaves: list = []
    _collect_leaves((sample.input, sample.args, sample.kwargs), cpu_leaves)

    torch.manual_seed(seed)
    expected = op(sample.input, *sample.args, **sample.kwargs)
    # Some samples of deterministic ops draw random numbers: if CPU itself gives another
    # answer under another seed, only metadata can match.
    # OpInfo seeds CPU's generator inside some ops (attention with dropout_p > 0), which
    # the seed check cannot see: a positive dropout_p means random values too.
    draws_dropout = (sample.kwargs.get("dropout_p") or 0) > 0 or _mha_dropout(op, sample)
    shape_only = shape_only or draws_dropout or _is_random_sample(op, sample, expected, seed)
    actual = _run_on_device(op, sample, moved, seed)
    if pristine is not None:
        _check_random_values(op, sample, pristine, actual, seed)
    if op_id(op) in SIGN_INVARIANT:
        actual = _align_signs(actual, expected, SIGN_INVARIANT[op_id(op)])
    if op_id(op) in TIE_INVARIANT:
        actual = _align_tied_indices(actual, expected, sample, TIE_INVARIANT[op_id(op)])
    try:
        compare_outputs(actual, expected, shape_only, "output")
    except Mismatch as mismatch:
        _judge_by_float64(op, sample, seed, mismatch, notes, actual=actual, expected=expected)

    if not (check_grad and cpu_leaves) or shape_only:
        return False
    expected_outs = _flatten(sample.output_process_fn_grad(expected))
    actual_outs = _flatten(sample.output_process_fn_grad(actual))
    picked = _differentiable_outputs(expected_outs)
    if not picked:
        return False
    generator = torch.Generator().manual_seed(seed)
    cotangents = [
        torch.randn(expected_outs[i].shape, generator=generator, dtype=expected_outs[i].dtype) for i in picked
    ]
    expected_grads = torch.autograd.grad([expected_outs[i] for i in picked], cpu_leaves, cotangents, allow_unused=True)
    actual_grads = torch.autograd.grad(
        [actual_outs[i] for i in picked],
        moved.leaves,
        [c.to(DEVICE) for c in cotangents],
        allow_unused=True,
    )
    try:
        compare_outputs(list(actual_grads), list(expected_grads), False, "grad", factor=GRAD_TOLERANCE_FACTOR)
    except Mismatch as mismatch:
        _judge_by_float64(
            op,
            sample,
            seed,
            mismatch,
            notes,
            actual=list(actual_grads),
            expected=list(expected_grads),
            cotangents=cotangents,
            picked=picked,
        )
    return True


def _as_float64(value, leaves: list, memo: dict):
    """A copy of a sample part with float32/bfloat16/float16 tensors in float64 (grad leaves
    kept, in order)."""
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            copy = value.detach().to(torch.float64) if value.dtype in ROUNDED_DTYPES else value.detach()
            if value.requires_grad:
                copy.requires_grad_(True)
                leaves.append(copy)
            memo[id(value)] = copy
        return memo[id(value)]
    if isinstance(value, list):
        return [_as_float64(v, leaves, memo) for v in value]
    if isinstance(value, tuple):
        return tuple(_as_float64(v, leaves, memo) for v in value)
    if isinstance(value, dict):
        return {
            k: (torch.float64 if isinstance(v, torch.dtype) and v in ROUNDED_DTYPES else _as_float64(v, leaves, memo))
            for k, v in value.items()
        }
    return value


def _max_error(values, reference) -> float:
    errors = [
        (v.detach().cpu().double() - r.detach().double()).abs().nan_to_num(0.0).max().item()
        for v, r in zip(values, reference)
        if isinstance(v, torch.Tensor) and isinstance(r, torch.Tensor) and r.numel() and r.dtype.is_floating_point
    ]
    return max(errors, default=0.0)


def _judge_by_float64(op, sample, seed, mismatch, notes, *, actual, expected, cotangents=None, picked=None):
    """A float32 (bfloat16, float16) mismatch against CPU may be CPU's rounding as much as the
    device's: judge the device against the op computed in float64 on CPU. It passes if it is
    within the dtype's tolerance of that reference, or no further from it than CPU's own
    result is (as accurate as PyTorch itself). Passing this way is recorded in `notes` with
    both measured errors; otherwise the mismatch stands, with them."""
    value_mismatch = "Tensor-likes are not close" in str(mismatch)  # not a shape, dtype or device one
    dtype = _rounded_dtype(sample)
    if not value_mismatch or dtype is None or torch.float64 not in op.supported_dtypes("cpu"):
        raise mismatch
    leaves: list = []
    memo: dict = {}
    parts = _as_float64((sample.input, sample.args, sample.kwargs), leaves, memo)
    torch.manual_seed(seed)
    try:
        reference = op(parts[0], *parts[1], **parts[2])
        if cotangents is not None:
            outs = _flatten(sample.output_process_fn_grad(reference))
            reference = list(
                torch.autograd.grad(
                    [outs[i] for i in picked], leaves, [c.double() for c in cotangents], allow_unused=True
                )
            )
    except Exception:  # noqa: BLE001 - no float64 reference for this sample: keep the mismatch
        raise mismatch from None
    what = "grad" if cotangents is not None else "output"
    factor = GRAD_TOLERANCE_FACTOR if cotangents is not None else 1.0
    actual_flat, reference_flat = _flatten(actual), _flatten(reference)
    device_error = _max_error(actual_flat, reference_flat)
    cpu_error = _max_error(_flatten(expected), reference_flat)
    name = str(dtype).removeprefix("torch.")
    measured = f"vs float64: device error {device_error:.3g}, CPU {name} error {cpu_error:.3g}"
    rtol, atol = FORWARD_TOLERANCES[dtype]
    # outputs that are not floating point (indices, counts) must still match CPU exactly
    exact = [
        (g, w)
        for g, w in zip(actual_flat, _flatten(expected))
        if not (isinstance(w, torch.Tensor) and w.dtype.is_floating_point)
    ]
    compare_outputs([g for g, _ in exact], [w for _, w in exact], False, what)
    if device_error <= cpu_error:  # at least as accurate as PyTorch's own kernel
        notes.append(f"{what}: {name} rounding, no worse than CPU's: {measured}")
        return
    for got, want in zip(actual_flat, reference_flat):
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and want.dtype.is_floating_point:
            try:
                torch.testing.assert_close(
                    got.detach().cpu().double(),
                    want.detach().double(),
                    rtol=rtol * factor,
                    atol=atol * factor,
                    equal_nan=True,
                    check_stride=False,
                )
            except AssertionError:
                raise Mismatch(f"{mismatch} ({measured})") from None
    notes.append(f"{what}: {name} rounding, {measured}")


# dtypes whose value mismatches are judged against a float64 reference (`_judge_by_float64`)
ROUNDED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rounded_dtype(sample) -> torch.dtype | None:
    """The float32/bfloat16/float16 dtype of the sample's first such tensor, or None."""
    found = []
    _collect_float32((sample.input, sample.args, sample.kwargs), found)
    return found[0].dtype if found else None


def _collect_float32(value, found: list) -> None:
    if isinstance(value, torch.Tensor):
        if value.dtype in ROUNDED_DTYPES:
            found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_float32(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_float32(item, found)


def check_op(
    op, dtype: torch.dtype = torch.float32, max_samples: int | None = None, check_grad: bool = True
) -> OpResult:
    """Compare one OpInfo entry on the device against CPU; never raises (the result says why)."""
    name = op_id(op)
    reason = skip_reason(op, dtype)
    if reason is not None:
        return OpResult(name, dtype, "n/a" if reason == NOT_APPLICABLE else "skip", reason)
    shape_only = name in SHAPE_ONLY
    wants_grad = check_grad and op.supports_autograd and dtype.is_floating_point
    start = time.perf_counter()
    result = OpResult(name, dtype, "shape-only" if shape_only and name not in RANDOM_CHECKS else "pass")
    try:
        torch.manual_seed(0)
        samples = op.sample_inputs("cpu", dtype, requires_grad=wants_grad)
        for index, sample in enumerate(samples):
            if max_samples is not None and index >= max_samples:
                break
            try:
                notes: list = []
                grad_checked = _check_sample(op, sample, shape_only, wants_grad, seed=index, notes=notes)
                result.notes += [f"sample {index}: {note}" for note in notes]
            except Exception as error:
                result.failed_sample = index
                error.add_note(f"sample {index}: {_describe(sample)}")
                raise
            result.samples += 1
            result.grad_checked += int(grad_checked)
    except Mismatch as error:
        result.status, result.detail = "mismatch", _error_text(error)
        result.message = _message(error)
    except Exception as error:  # noqa: BLE001 - the report must name every failure
        result.status, result.detail = "fail", _error_text(error)
        result.message = _message(error)
        result.where = _innermost_project_frame(error)
    result.seconds = time.perf_counter() - start
    return result


def _message(error: BaseException) -> str:
    """The exception's type and first lines, without JAX's note about filtered frames."""
    text = str(error).split("--------------------")[0]
    # where the call came from (a file:line, or "the backward pass; ...") is not part of the error
    text = re.sub(r" \(called from the backward pass;.*?forward line\)", " (in backward)", text)
    text = re.sub(r" \(called from [^)]*\)", "", text)
    return f"{type(error).__name__}: {_first_lines(text, 3)}"


def _error_text(error: BaseException) -> str:
    text = _message(error)
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
