"""Reductions: mean/sum/prod, amax/amin, max/min with indices, argmax/argmin, var/std,
any/all, cumsum and vector norms.

Each TFLite reducer takes the axes as an int32 constant and a `keepDims` option, exactly
PyTorch's (dim, keepdim). An empty or missing `dim` means every axis, as in PyTorch.
Index outputs are int64 (ARG_MAX/ARG_MIN with outputType INT64), PyTorch's dtype; both
pick the first index among ties, as PyTorch does.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.pointwise import _as_bool
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _reduce_to_node(ctx, opcode: str, x: Tensor, dim, keepdim: bool) -> Tensor:
    axes = emit.normalize_dims(dim, x.rank)
    if x.rank == 0:
        return x
    return ctx.emit(opcode, [x, emit.int32(ctx, axes)], {"keepDims": bool(keepdim)})


def _in_out_dtype(ctx, x: Tensor) -> Tensor:
    """x cast to the node's dtype (sum of bools is int64, mean's dtype= argument...)."""
    return emit.cast(ctx, x, ctx.out_dtype() if not isinstance(ctx.meta, (tuple, list)) else x.dtype)


@lowers(aten.mean.dim, aten.mean.default)
def mean(ctx, x, dim=None, keepdim=False, dtype=None):
    return _reduce_to_node(ctx, "MEAN", _in_out_dtype(ctx, x), dim, keepdim)


@lowers(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, x, dim=None, keepdim=False, dtype=None):
    return _reduce_to_node(ctx, "SUM", _in_out_dtype(ctx, x), dim, keepdim)


@lowers(aten.prod.dim_int, aten.prod.default)
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
    return _reduce_to_node(ctx, "REDUCE_PROD", _in_out_dtype(ctx, x), dim, keepdim)


@lowers(aten.amax.default, aten.max.default)
def amax(ctx, x, dim=None, keepdim=False):
    return _reduce_to_node(ctx, "REDUCE_MAX", x, dim, keepdim)


@lowers(aten.amin.default, aten.min.default)
def amin(ctx, x, dim=None, keepdim=False):
    return _reduce_to_node(ctx, "REDUCE_MIN", x, dim, keepdim)


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx, x, dim=None, keepdim=False):
    return _reduce_to_node(ctx, "REDUCE_ANY", _as_bool(ctx, x), dim, keepdim)


@lowers(aten.all.default, aten.all.dim, aten.all.dims)
def all_(ctx, x, dim=None, keepdim=False):
    return _reduce_to_node(ctx, "REDUCE_ALL", _as_bool(ctx, x), dim, keepdim)


def _arg(ctx, opcode: str, x: Tensor, dim, keepdim: bool) -> Tensor:
    """ARG_MAX / ARG_MIN along one axis (the flattened tensor when dim is None)."""
    if dim is None:
        x = emit.reshape(ctx, x, (int(np.prod(x.shape)),))
        dim = 0
    axis = emit.normalize_dim(dim, x.rank)
    options = {"outputType": "INT64"}
    shape = [d for i, d in enumerate(x.shape) if i != axis]
    indices = emit.op(ctx, opcode, [x, emit.int32(ctx, axis)], options, shape=shape, dtype=np.int64)
    if keepdim:
        kept = [1 if i == axis else d for i, d in enumerate(x.shape)] if x.rank else []
        indices = emit.reshape(ctx, indices, kept)
    return indices


@lowers(aten.argmax.default)
def argmax(ctx, x, dim=None, keepdim=False):
    out = _arg(ctx, "ARG_MAX", x, dim, keepdim)
    return emit.reshape(ctx, out, ctx.out_shape())


@lowers(aten.argmin.default)
def argmin(ctx, x, dim=None, keepdim=False):
    out = _arg(ctx, "ARG_MIN", x, dim, keepdim)
    return emit.reshape(ctx, out, ctx.out_shape())


@lowers(aten.max.dim)
def max_dim(ctx, x, dim, keepdim=False):
    values = emit.reduce(ctx, "REDUCE_MAX", x, [dim], keep_dims=keepdim)
    return values, _arg(ctx, "ARG_MAX", x, dim, keepdim)


@lowers(aten.min.dim)
def min_dim(ctx, x, dim, keepdim=False):
    values = emit.reduce(ctx, "REDUCE_MIN", x, [dim], keep_dims=keepdim)
    return values, _arg(ctx, "ARG_MIN", x, dim, keepdim)


def _variance(ctx, x: Tensor, dim, correction, keepdim: bool) -> Tensor:
    """sum((x - mean)^2) / (N - correction) over `dim`."""
    axes = emit.normalize_dims(dim, x.rank)
    count = int(np.prod([x.shape[a] for a in axes]))
    correction = 1 if correction is None else correction
    centered = emit.binary(ctx, "SUB", x, emit.mean(ctx, x, axes))
    squares = emit.reduce(ctx, "SUM", emit.binary(ctx, "MUL", centered, centered), axes, keep_dims=keepdim)
    divisor = max(count - correction, 0)
    scale = 1.0 / divisor if divisor else float("inf")
    return emit.binary(ctx, "MUL", squares, emit.scalar_like(ctx, scale, x.dtype))


@lowers(aten.var.correction, aten.var.dim)
def var(ctx, x, dim=None, *args, correction=None, keepdim=False):
    if args:  # var.dim(x, dim, unbiased=True, keepdim=False)
        correction = 1 if args[0] else 0
        keepdim = args[1] if len(args) > 1 else keepdim
    return _variance(ctx, x, dim, correction, keepdim)


@lowers(aten.std.correction, aten.std.dim)
def std(ctx, x, dim=None, *args, correction=None, keepdim=False):
    return ctx.emit("SQRT", [var(ctx, x, dim, *args, correction=correction, keepdim=keepdim)])


@lowers(aten.cumsum.default)
def cumsum(ctx, x, dim, dtype=None):
    x = _in_out_dtype(ctx, x)
    return ctx.emit(
        "CUMSUM", [x, emit.int32(ctx, emit.normalize_dim(dim, x.rank))], {"exclusive": False, "reverse": False}
    )


@lowers(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    axes = emit.normalize_dims(dim, x.rank)
    if ord == float("inf"):
        return _reduce_to_node(ctx, "REDUCE_MAX", emit.unary(ctx, "ABS", x), axes, keepdim)
    if ord == 1:
        return _reduce_to_node(ctx, "SUM", emit.unary(ctx, "ABS", x), axes, keepdim)
    if ord == 2:
        squares = emit.reduce(ctx, "SUM", emit.binary(ctx, "MUL", x, x), axes, keep_dims=keepdim)
        return ctx.emit("SQRT", [squares])
    raise emit.unsupported(ctx, f"vector norm of order {ord}", "Use ord 1, 2 or inf.")
