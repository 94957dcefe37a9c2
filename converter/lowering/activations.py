"""Activations, clamps and (log-)softmax.

Where TFLite has the activation as a builtin (RELU, RELU6, LOGISTIC, TANH, GELU,
HARD_SWISH, LEAKY_RELU, PRELU, ELU) it is used as is: the fused-activation pass can then
fold RELU/RELU6/RELU_N1_TO_1 into the producing op. The rest are short compositions.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.pointwise import _operands
from converter.lowering.registry import lowers

aten = torch.ops.aten


@lowers(aten.relu.default)
def relu(ctx, x):
    return ctx.emit("RELU", [x])


@lowers(aten.sigmoid.default)
def sigmoid(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("LOGISTIC", [x])


@lowers(aten.tanh.default)
def tanh(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("TANH", [x])


# (min, max) ranges TFLite has a dedicated (and fusable) activation for.
_CLAMP_BUILTINS = {(0.0, None): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, 1.0): "RELU_0_TO_1"}


def _clamp(ctx, x, low, high):
    (x,) = _operands(ctx, x)
    if np.issubdtype(x.dtype, np.floating) and not isinstance(low, Tensor) and not isinstance(high, Tensor):
        key = (None if low is None else float(low), None if high is None else float(high))
        if key in _CLAMP_BUILTINS:
            return ctx.emit(_CLAMP_BUILTINS[key], [x])
    if low is None and high is None:
        return x
    if high is None:
        return ctx.emit("MAXIMUM", [x, emit.as_tensor(ctx, low, x.dtype)])
    if low is None:
        return ctx.emit("MINIMUM", [x, emit.as_tensor(ctx, high, x.dtype)])
    floored = emit.binary(ctx, "MAXIMUM", x, emit.as_tensor(ctx, low, x.dtype))
    return ctx.emit("MINIMUM", [floored, emit.as_tensor(ctx, high, x.dtype)])


@lowers(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, x, min=None, max=None):
    return _clamp(ctx, x, min, max)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx, x, min):
    return _clamp(ctx, x, min, None)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, x, max):
    return _clamp(ctx, x, None, max)


@lowers(aten.hardtanh.default)
def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clamp(ctx, x, min_val, max_val)


@lowers(aten.leaky_relu.default)
def leaky_relu(ctx, x, negative_slope=0.01):
    return ctx.emit("LEAKY_RELU", [x], {"alpha": float(negative_slope)})


@lowers(aten.prelu.default, aten._prelu_kernel.default)
def prelu(ctx, x, weight):
    """PRELU broadcasts alpha against the input: a per-channel weight (C,) becomes
    (C, 1, ..., 1) so it lines up with PyTorch's channel axis 1."""
    if weight.rank == 1 and x.rank >= 2 and weight.shape[0] != 1:
        weight = emit.reshape(ctx, weight, (weight.shape[0],) + (1,) * (x.rank - 2))
    return ctx.emit("PRELU", [x, weight])


@lowers(aten.elu.default)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if alpha == 1 and scale == 1 and input_scale == 1:
        return ctx.emit("ELU", [x])
    # scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1))
    f = lambda v: emit.scalar_like(ctx, v, x.dtype)  # noqa: E731
    negative = emit.binary(
        ctx,
        "MUL",
        emit.binary(ctx, "SUB", emit.unary(ctx, "EXP", emit.binary(ctx, "MUL", x, f(input_scale))), f(1.0)),
        f(alpha),
    )
    positive = emit.binary(ctx, "GREATER", x, f(0.0), dtype=np.bool_)
    picked = emit.op(ctx, "SELECT_V2", [positive, x, negative], shape=x.shape, dtype=x.dtype)
    return ctx.emit("MUL", [picked, f(scale)], {"fusedActivationFunction": "NONE"})


@lowers(aten.gelu.default)
def gelu(ctx, x, approximate="none"):
    return ctx.emit("GELU", [x], {"approximate": approximate == "tanh"})


@lowers(aten.silu.default)
def silu(ctx, x):
    return ctx.emit("MUL", [x, emit.unary(ctx, "LOGISTIC", x)], {"fusedActivationFunction": "NONE"})


@lowers(aten.hardswish.default)
def hardswish(ctx, x):
    return ctx.emit("HARD_SWISH", [x])


@lowers(aten.hardsigmoid.default)
def hardsigmoid(ctx, x):
    """relu6(x + 3) / 6, with builtins every delegate has."""
    shifted = emit.binary(ctx, "ADD", x, emit.scalar_like(ctx, 3.0, x.dtype))
    return ctx.emit(
        "MUL",
        [emit.unary(ctx, "RELU6", shifted), emit.scalar_like(ctx, 1 / 6, x.dtype)],
        {"fusedActivationFunction": "NONE"},
    )


def _softplus(ctx, x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's rule,
    which also keeps exp from overflowing into the result)."""
    f = lambda v: emit.scalar_like(ctx, v, x.dtype)  # noqa: E731
    bx = emit.binary(ctx, "MUL", x, f(beta)) if beta != 1 else x
    soft = emit.unary(ctx, "LOG", emit.binary(ctx, "ADD", emit.unary(ctx, "EXP", bx), f(1.0)))
    if beta != 1:
        soft = emit.binary(ctx, "MUL", soft, f(1.0 / beta))
    linear = emit.binary(ctx, "GREATER", bx, f(threshold), dtype=np.bool_)
    return linear, soft


@lowers(aten.softplus.default)
def softplus(ctx, x, beta=1.0, threshold=20.0):
    linear, soft = _softplus(ctx, x, beta, threshold)
    return ctx.emit("SELECT_V2", [linear, x, soft])


@lowers(aten.mish.default)
def mish(ctx, x):
    """x * tanh(softplus(x))."""
    linear, soft = _softplus(ctx, x)
    sp = emit.op(ctx, "SELECT_V2", [linear, x, soft], shape=x.shape, dtype=x.dtype)
    return ctx.emit("MUL", [x, emit.unary(ctx, "TANH", sp)], {"fusedActivationFunction": "NONE"})


def _on_last_axis(ctx, opcode: str, x, dim: int, options: dict):
    """TFLite's SOFTMAX/LOG_SOFTMAX work on the last axis: move `dim` there and back."""
    dim = emit.normalize_dim(dim, max(x.rank, 1))
    if x.rank == 0 or dim == x.rank - 1:
        return ctx.emit(opcode, [x], options)
    perm = list(range(x.rank))
    perm[dim], perm[-1] = perm[-1], perm[dim]  # a swap is its own inverse
    moved = emit.transpose(ctx, x, perm)
    y = emit.op(ctx, opcode, [moved], options, shape=moved.shape, dtype=moved.dtype)
    return emit.transpose(ctx, y, perm)


@lowers(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    return _on_last_axis(ctx, "SOFTMAX", x, dim, {"beta": 1.0})


@lowers(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float=False):
    return _on_last_axis(ctx, "LOG_SOFTMAX", x, dim, {})


# ---- the ops torch.export gives (lowered directly, not decomposed first) ----------------------


@lowers(aten.relu6.default)
def relu6(ctx, x):
    return hardtanh(ctx, x, 0.0, 6.0)


@lowers(aten.softmax.int)
def softmax_whole(ctx, x, dim, dtype=None):
    return softmax(ctx, emit.cast(ctx, x, ctx.out_dtype()), dim)  # a dtype casts first


@lowers(aten.log_softmax.int)
def log_softmax_whole(ctx, x, dim, dtype=None):
    return log_softmax(ctx, emit.cast(ctx, x, ctx.out_dtype()), dim)
