"""Factory ops: zeros/ones/full/empty (+ _like and new_ forms), arange, linspace, logspace,
eye, scalar_tensor, fill, tril/triu_indices.

Default dtypes follow ATen: a float fill or range gives the default float dtype, an
integer one int64, a bool one bool; `empty*` returns zeros (XLA has no uninitialised
memory). `layout`, `device`, `pin_memory` and `memory_format` are accepted and
ignored: placement is the device's business.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_backend.ops._common import default_float, is_weak_scalar, jax_dtype, torch_dtype
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _scalar_kind_dtype(value):
    """The dtype ATen infers from a Python scalar (or a traced one): bool, int64 or float."""
    if is_weak_scalar(value):
        kind = jnp.dtype(value.dtype).kind
        return jnp.bool_ if kind == "b" else jnp.int64 if kind in "iu" else default_float()
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jnp.int64
    if hasattr(value, "dtype"):
        return value.dtype
    return default_float()


def _static(value):
    """A Python number for a bound; a traced float raises JAX's concretization error, on
    which the runner retraces with static floats."""
    return value if isinstance(value, (bool, int, float)) else float(value)


def _dtype_or(dtype, fallback):
    return jax_dtype(dtype) if dtype is not None else fallback


@lowers(aten.zeros.default, aten._efficientzerotensor.default, aten.empty.memory_format)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), _dtype_or(dtype, default_float()))


@lowers(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype_or(dtype, default_float()))


@lowers(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype_or(dtype, default_float()))


@lowers(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype_or(dtype, _scalar_kind_dtype(fill_value)))


@lowers(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, _dtype_or(dtype, default_float()))


@lowers(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _dtype_or(dtype, x.dtype))


@lowers(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _dtype_or(dtype, x.dtype))


@lowers(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, _dtype_or(dtype, x.dtype))


@lowers(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype_or(dtype, x.dtype))


@lowers(aten.new_ones.default)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype_or(dtype, x.dtype))


@lowers(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype_or(dtype, x.dtype))


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, jnp.asarray(value).astype(x.dtype), x.dtype)


@lowers(aten.zero.default)
def zero(x):
    return jnp.zeros_like(x)


# --- ranges ---------------------------------------------------------------------------------


def _range_dtype(dtype, *values):
    if dtype is not None:
        return jax_dtype(dtype)
    kinds = [_scalar_kind_dtype(v) for v in values]
    return default_float() if any(jnp.issubdtype(k, jnp.floating) for k in kinds) else jnp.int64


@lowers(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(*bounds, dtype=None, layout=None, device=None, pin_memory=None):
    """arange(end), arange(start, end) or arange(start, end, step) (bounds must be static).
    The length comes from ATen's own meta kernel (for int64 it truncates the bounds and
    counts in integers, otherwise ceil((end - start) / step) in double) and so do its errors;
    integer results truncate start and step, as ATen's integer accumulator does."""
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (bounds + (1,))[:3]
    out_dtype = _range_dtype(dtype, start, end, step)
    start, end, step = (_static(v) for v in (start, end, step))
    length = torch.arange(start, end, step, dtype=torch_dtype(out_dtype), device="meta").shape[0]
    if jnp.issubdtype(out_dtype, jnp.integer):
        values = (int(start) + int(step) * jnp.arange(length, dtype=jnp.int64)).astype(out_dtype)
    else:
        compute = jnp.float64 if out_dtype == jnp.float64 else jnp.float32
        values = jnp.asarray(start, compute) + jnp.asarray(step, compute) * jnp.arange(length, dtype=compute)
    # The barrier works around a TPU compiler bug (libtpu with JAX 0.10.2, any dtype): a 1-D
    # iota broadcast to rows, concatenated and then sliced across the seam reads values 128
    # positions off (`cat([p[:, :1] - 1, p], -1)[:, :n]` of `p = arange(n).expand(2, n)` gives
    # -1, 128, 129, ...). Transformers' packed-sequence check of position ids is that pattern:
    # under torch.compile every token became its own sequence. Measured on a v5e; the cost
    # is one small array written (docs/tpu.md, "What differs from CPU").
    return lax.optimization_barrier(values.astype(out_dtype))


def _linspace(start, end, steps, dtype):
    """ATen's CPU formula: step = (end - start) / (steps - 1); the first half counts up from
    start and the second half back from end, so both endpoints are exact. For an integer
    `dtype` ATen first truncates the bounds to integers and counts in double (float64
    here); callers truncate the values."""
    integral = jnp.issubdtype(dtype, jnp.integer)
    compute = jnp.float64 if dtype == jnp.float64 or integral else jnp.float32
    start, end = jnp.asarray(start, compute), jnp.asarray(end, compute)
    if integral:
        start, end = jnp.trunc(start), jnp.trunc(end)
    if steps == 1:
        return start.reshape(1)
    # XLA turns a division by a constant into a multiplication by its (rounded) reciprocal:
    # the barrier keeps ATen's correctly rounded division (-49 / 49 must be exactly -1).
    step = (end - start) / lax.optimization_barrier(jnp.asarray(steps - 1, compute))
    i = jnp.arange(steps, dtype=compute)
    values = jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    if not integral:
        return values
    # A whole step is exact in integers. (So it is in float64 on CPU, but a TPU emulates
    # float64 and its division is not correctly rounded: -49 / 49 misses -1 there.)
    first, span = start.astype(jnp.int64), end.astype(jnp.int64) - start.astype(jnp.int64)
    whole = first + span // (steps - 1) * jnp.arange(steps, dtype=jnp.int64)
    return jnp.where(span % (steps - 1) == 0, whole.astype(compute), values)


@lowers(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    out_dtype = _dtype_or(dtype, default_float())
    if steps == 0:
        return jnp.zeros((0,), out_dtype)
    values = _linspace(start, end, steps, out_dtype)
    return (jnp.trunc(values) if jnp.issubdtype(out_dtype, jnp.integer) else values).astype(out_dtype)


@lowers(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    """base ** linspace(start, end, steps). Integer results follow ATen's integer branch:
    float32(base) ** (the float64 linspace of the truncated bounds), truncated; a single
    step is base ** start with start as given."""
    out_dtype = _dtype_or(dtype, default_float())
    if steps == 0:
        return jnp.zeros((0,), out_dtype)
    if not jnp.issubdtype(out_dtype, jnp.integer):
        compute = jnp.float64 if out_dtype == jnp.float64 else jnp.float32
        return jnp.power(jnp.asarray(base, compute), _linspace(start, end, steps, out_dtype)).astype(out_dtype)
    if steps == 1:
        values = jnp.power(jnp.asarray(base, jnp.float64), jnp.asarray(start, jnp.float64)).reshape(1)
    else:
        base = jnp.asarray(base, jnp.float32).astype(jnp.float64)
        values = jnp.power(base, _linspace(start, end, steps, out_dtype))
    return jnp.trunc(values).astype(out_dtype)


@lowers(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=_dtype_or(dtype, default_float()))


@lowers(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)), _dtype_or(dtype, jnp.int64))


@lowers(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)), _dtype_or(dtype, jnp.int64))
