"""Tensor factories: arange, full, zeros, ones, empty, scalar_tensor and the *_like forms.

With static shapes every one of them is a constant, built here in numpy from the node's
shape and dtype (export already worked out both), so they cost nothing at run time.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.lowering import emit, symbolic
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _is_dynamic(ctx) -> bool:
    return any(isinstance(d, torch.SymInt) for d in ctx.meta.shape)


def _static_output(ctx, name: str):
    val = ctx.meta
    if any(isinstance(d, torch.SymInt) for d in val.shape):
        raise emit.unsupported(
            ctx, f"{name} with a dynamic size", "Create it from a static size, or pass it in as an input."
        )
    return ctx.out_shape(), ctx.out_dtype()


@lowers(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(ctx, *args, **kwargs):
    if _is_dynamic(ctx):
        return _dynamic_arange(ctx, *args)
    shape, dtype = _static_output(ctx, "arange")
    numbers = [a for a in args if isinstance(a, (int, float))]  # (end), (start, end) or (start, end, step)
    start = numbers[0] if len(numbers) > 1 else 0
    step = numbers[2] if len(numbers) > 2 else 1
    # PyTorch computes start + i * step (not a running sum): so does this.
    values = start + np.arange(shape[0], dtype=np.float64) * step
    return ctx.const(values.astype(dtype))


def _dynamic_arange(ctx, *args):
    """RANGE over sizes known only at run time (`torch.arange(x.size(1))`): integer
    ranges count in int32 and are cast to the node's dtype."""
    bounds = [a for a in args if isinstance(a, (int, float, torch.SymInt))]
    start, end = (bounds[0], bounds[1]) if len(bounds) > 1 else (0, bounds[0])
    step = bounds[2] if len(bounds) > 2 else 1
    dtype = ctx.out_dtype()
    if any(isinstance(v, float) for v in (start, end, step)):
        raise emit.unsupported(
            ctx,
            "arange with a dynamic size and float bounds",
            "Use integer bounds (and scale the result), or make the size static.",
        )

    def scalar(v):
        return emit.reshape(ctx, symbolic.sym_value(ctx, v), ())

    values = emit.op(
        ctx, "RANGE", [scalar(start), scalar(end), scalar(step)], shape=ctx.out_shape(), dtype=np.int32, signature=(-1,)
    )
    return emit.cast(ctx, values, dtype)


def _filled(ctx, name: str, value):
    if _is_dynamic(ctx):  # FILL a shape computed from the inputs' shapes
        dtype = ctx.out_dtype()
        return ctx.emit("FILL", [symbolic.shape_tensor(ctx, ctx.meta.shape), ctx.const(np.asarray(value, dtype))])
    shape, dtype = _static_output(ctx, name)
    return ctx.const(np.full(shape, value, dtype=dtype))


@lowers(aten.full.default)
def full(ctx, size, fill_value, **kwargs):
    return _filled(ctx, "full", fill_value)


@lowers(aten.full_like.default)
def full_like(ctx, x, fill_value, **kwargs):
    return _filled(ctx, "full_like", fill_value)


@lowers(aten.new_full.default)
def new_full(ctx, x, size, fill_value, **kwargs):
    return _filled(ctx, "new_full", fill_value)


@lowers(
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.empty_permuted.default,
    aten.empty_strided.default,
)
def zeros(ctx, *args, **kwargs):
    # Empty tensors get zeros: their contents are unspecified, and zeros are deterministic.
    return _filled(ctx, "zeros", 0)


@lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, *args, **kwargs):
    return _filled(ctx, "ones", 1)


@lowers(aten.fill.Scalar)
def fill(ctx, x, value):
    """Every element is `value`: x's contents do not matter, only its shape."""
    return _filled(ctx, "fill", value)


@lowers(aten.scalar_tensor.default)
def scalar_tensor(ctx, value, **kwargs):
    return _filled(ctx, "scalar_tensor", value)


@lowers(aten.linspace.default)
def linspace(ctx, start, end, steps, **kwargs):
    """A constant: PyTorch's own values (it fills the two halves from either end)."""
    if not all(isinstance(v, (int, float)) for v in (start, end, steps)) or _is_dynamic(ctx):
        raise NotImplementedError("linspace with run-time bounds")
    dtype = ctx.meta.dtype
    return ctx.const(torch.linspace(start, end, steps, dtype=dtype).numpy())
