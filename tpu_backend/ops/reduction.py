"""Reductions and scans: sum, mean, prod, min/max (+indices), var/std, norms, cumulative ops.

ATen's conventions kept here: `dim=None` or `dim=[]` reduces every dim; integer and
bool sums/products accumulate in int64; min/max/argmax pick the first extreme and
propagate NaN; cummax/cummin report the last index of a tie; var/std take a
`correction` (None means 1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_backend.ops._common import canonical_dim, canonical_dims, is_floating, jax_dtype, reduction_dtype, to_float
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


@lowers(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, x.ndim)
    return jnp.sum(x.astype(reduction_dtype(x, dtype)), axis=dims, keepdims=keepdim)


@lowers(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, x.ndim)
    return jnp.nansum(x.astype(reduction_dtype(x, dtype)), axis=dims, keepdims=keepdim)


@lowers(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = jax_dtype(dtype) if dtype is not None else x.dtype
    if not is_floating(out_dtype):
        raise TypeError(f"aten.mean: needs a floating point input or dtype=, got {x.dtype}; cast with .float() first")
    return jnp.mean(x.astype(out_dtype), axis=canonical_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, x.ndim)
    return jnp.prod(x.astype(reduction_dtype(x, dtype)), axis=dims, keepdims=keepdim)


def _float64_bits(x):
    """The float64 bit pattern of float32 values, built from their bits with integer ops:
    XLA flushes float32 subnormals to 0 in a float conversion, ATen does not."""
    bits = lax.bitcast_convert_type(x, jnp.uint32).astype(jnp.uint64)
    sign, exponent, mantissa = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    # subnormal m * 2**-149 is normal in float64: top bit of m at p gives exponent p - 149
    top = 63 - lax.clz(jnp.maximum(mantissa, 1))
    subnormal_exponent, subnormal_mantissa = top + 874, (mantissa - (1 << top)) << (52 - top)
    exponent64 = jnp.where(exponent == 0xFF, 0x7FF, exponent + 896)
    exponent64 = jnp.where(exponent == 0, jnp.where(mantissa == 0, 0, subnormal_exponent), exponent64)
    mantissa64 = jnp.where(exponent == 0, jnp.where(mantissa == 0, 0, subnormal_mantissa), mantissa << 29)
    return (sign << 63) | (exponent64.astype(jnp.uint64) << 52) | mantissa64


@lowers(aten.hash_tensor.default)
def hash_tensor(x, dim=(), keepdim=False, *, mode=0):
    """XOR of the elements' 64-bit patterns (floats widened to float64, integers and bools to
    int64), as uint64: ATen's only mode (0)."""
    if mode != 0:
        raise NotImplementedError(f"aten.hash_tensor: mode={mode} (ATen defines only mode 0, xor)")
    if x.size == 0 and not dim:
        raise RuntimeError("hash_tensor: Expected reduction dim to be specified for input.numel() == 0.")
    if x.dtype == jnp.float64:
        bits = lax.bitcast_convert_type(x, jnp.uint64)
    elif jnp.issubdtype(x.dtype, jnp.floating):
        bits = _float64_bits(x.astype(jnp.float32))  # float16/bfloat16 -> float32 is exact
    else:
        bits = lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)
    dims = canonical_dims(dim, x.ndim)
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, dims)
    return jnp.expand_dims(out, dims) if keepdim else out


@lowers(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=canonical_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=canonical_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    dims = canonical_dims(dim, x.ndim)
    return jnp.min(x, axis=dims, keepdims=keepdim), jnp.max(x, axis=dims, keepdims=keepdim)


@lowers(aten.max.default)
def max_all(x):
    return jnp.max(x)


@lowers(aten.min.default)
def min_all(x):
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, pick):
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if dim is None:
        return pick(x.reshape(-1)).astype(jnp.int64).reshape((1,) * x.ndim if keepdim else ())
    return pick(x, axis=canonical_dim(dim, x.ndim), keepdims=keepdim).astype(jnp.int64)


@lowers(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmax)


@lowers(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmin)


@lowers(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    axis = canonical_dim(dim, x.ndim)
    return jnp.max(x, axis=axis, keepdims=keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, jnp.argmax)


@lowers(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    axis = canonical_dim(dim, x.ndim)
    return jnp.min(x, axis=axis, keepdims=keepdim) if x.ndim else x, _arg_extreme(x, dim, keepdim, jnp.argmin)


def _var(x, dim, correction, keepdim):
    correction = 1 if correction is None else correction
    x = to_float(x)
    dims = canonical_dims(dim, x.ndim)
    return jnp.var(x, axis=dims, ddof=correction, keepdims=keepdim), jnp.mean(x, axis=dims, keepdims=keepdim)


@lowers(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)[0]


@lowers(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim)[0])


@lowers(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@lowers(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    variance, average = _var(x, dim, correction, keepdim)
    return jnp.sqrt(variance), average


@lowers(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    x = to_float(x)
    dims = canonical_dims(dim, x.ndim)
    return jax.nn.logsumexp(x, axis=dims, keepdims=keepdim) if dims else x


def _vector_norm(x, ord, dims, keepdim):
    x = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(x, axis=dims, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(x, axis=dims, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=dims, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(x, axis=dims, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=dims, keepdims=keepdim))
    return jnp.sum(x**ord, axis=dims, keepdims=keepdim) ** (1.0 / ord)


@lowers(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if not is_floating(x.dtype):
        raise TypeError(f"aten.linalg_vector_norm: needs a floating point input, got {x.dtype}")
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    return _vector_norm(x, ord, canonical_dims(dim, x.ndim), keepdim)


@lowers(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)
def norm_dim(x, p, dim, keepdim=False, *, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lowers(aten.norm.Scalar, aten.norm.ScalarOpt_dtype)
def norm(x, p=2, *, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, None, False, dtype=dtype)


@lowers(aten.dist.default)
def dist(x, other, p=2):
    return linalg_vector_norm(x - other, p)


@lowers(aten.renorm.default)
def renorm(x, p, dim, maxnorm):
    """Rescale each slice along `dim` whose p-norm exceeds maxnorm down to maxnorm."""
    axis = canonical_dim(dim, x.ndim)
    norms = _vector_norm(x, p, tuple(d for d in range(x.ndim) if d != axis), True)
    factor = jnp.where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)
    return (x * factor).astype(x.dtype)


@lowers(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:  # all.dims with [] reduces nothing
        return x != 0
    return jnp.all(x != 0, axis=canonical_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:  # any.dims with [] reduces nothing
        return x != 0
    return jnp.any(x != 0, axis=canonical_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=canonical_dims(dim, x.ndim)).astype(jnp.int64)


# --- scans ------------------------------------------------------------------------------


def _scan(fn, x, dim, dtype):
    """cumsum/cumprod; bfloat16 and float16 accumulate in float32 and round each output, as
    ATen's CPU kernel (a bfloat16 running sum drifts by an ulp per step)."""
    x = x.astype(reduction_dtype(x, dtype))
    if not x.ndim:
        return x
    wide = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    return fn(x.astype(wide), axis=canonical_dim(dim, x.ndim)).astype(x.dtype)


@lowers(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    return _scan(jnp.cumsum, x, dim, dtype)


@lowers(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    return _scan(jnp.cumprod, x, dim, dtype)


@lowers(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    return lax.cumlogsumexp(x, axis=canonical_dim(dim, x.ndim)) if x.ndim else x


def logcumsumexp_grad(grad, x, dim):
    """d logcumsumexp: x_j's gradient is exp(x_j - r_j) * T_j with r the result and
    T_j = g_j + exp(r_j - r_{j+1}) T_{j+1}, a reverse linear recurrence whose factors lie in
    [0, 1], so nothing cancels. (ATen subtracts two exponentials of reverse logcumsumexps:
    2.5e-3 from the float64 value on an OpInfo sample where this is 2.4e-7;
    `tpu_backend/gradients.py` puts this formula in its place.)"""
    if x.ndim == 0:
        return grad
    axis = canonical_dim(dim, x.ndim)
    if jnp.iscomplexobj(x):
        return jax.vjp(lambda v: lax.cumlogsumexp(v, axis=axis), x)[1](grad)[0]
    # relative to the slice's maximum: the result of x ~ 1e4 would carry float32's 1e-3 spacing
    top = jnp.max(x, axis=axis, keepdims=True)
    x = x - jnp.where(jnp.isfinite(top), top, 0)
    result = lax.cumlogsumexp(x, axis=axis)
    size = x.shape[axis]
    following = jnp.concatenate(
        [lax.slice_in_dim(result, 1, size, axis=axis), lax.slice_in_dim(result, size - 1, size, axis=axis)], axis=axis
    )
    factor = jnp.exp(result - following)  # NaN where both are -inf: no mass before, so unused
    last = lax.broadcasted_iota(jnp.int32, x.shape, axis) == size - 1
    factor = jnp.where(last | jnp.isnan(factor), 0, factor)

    def compose(later, earlier):  # (a, b): T -> b + a T, the earlier map applied after the later
        return later[0] * earlier[0], earlier[1] + earlier[0] * later[1]

    _, total = lax.associative_scan(compose, (factor, grad.astype(x.dtype)), reverse=True, axis=axis)
    return jnp.where(jnp.isneginf(x), 0, jnp.exp(x - result) * total)


def _cumulative_extreme(x, dim, better):
    """(running extreme, index where it was reached); later ties and NaN win, as in ATen."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    index = lax.broadcasted_iota(jnp.int64, x.shape, axis)

    def combine(earlier, later):
        (v1, i1), (v2, i2) = earlier, later
        take_later = better(v2, v1) | (v2 == v1)
        if is_floating(x.dtype):
            take_later = (take_later & ~jnp.isnan(v1)) | jnp.isnan(v2)
        return jnp.where(take_later, v2, v1), jnp.where(take_later, i2, i1)

    return lax.associative_scan(combine, (x, index), axis=axis)


@lowers(aten.cummax.default)
def cummax(x, dim):
    return _cumulative_extreme(x, dim, jnp.greater)


@lowers(aten.cummin.default)
def cummin(x, dim):
    return _cumulative_extreme(x, dim, jnp.less)


# --- order statistics along one dim ------------------------------------------------------


def _kth_along(x, k_index, dim, keepdim):
    """Value and (ATen-like) index of the k-th smallest element along `dim`, NaN last."""
    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    order = jnp.argsort(x, axis=axis, stable=True)
    index = jnp.take(order, jnp.asarray([k_index]), axis=axis)
    value = jnp.take_along_axis(x, index, axis=axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index.astype(jnp.int64)


@lowers(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    return _kth_along(x, k - 1, dim, keepdim)


@lowers(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    # ATen's median is the lower middle; any NaN makes the result NaN (sorted last).
    size = x.shape[canonical_dim(dim, x.ndim)] if x.ndim else 1
    value, index = _kth_along(x, (size - 1) // 2, dim, keepdim)
    if is_floating(x.dtype) and x.ndim:
        axis = canonical_dim(dim, x.ndim)
        has_nan = jnp.any(jnp.isnan(x), axis=axis, keepdims=keepdim)
        first_nan = jnp.argmax(jnp.isnan(x), axis=axis, keepdims=keepdim).astype(jnp.int64)
        value, index = jnp.where(has_nan, jnp.nan, value).astype(x.dtype), jnp.where(has_nan, first_nan, index)
    return value, index


@lowers(aten.median.default)
def median(x):
    return median_dim(x.reshape(-1), 0)[0]


@lowers(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    if not is_floating(x.dtype):
        return median_dim(x, dim, keepdim)
    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    valid = jnp.sum(~jnp.isnan(x), axis=axis, keepdims=True)
    k = jnp.maximum((valid - 1) // 2, 0)
    order = jnp.argsort(x, axis=axis, stable=True)  # NaN sorts last
    index = jnp.take_along_axis(order, k, axis=axis)
    value = jnp.take_along_axis(x, index, axis=axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index.astype(jnp.int64)


@lowers(aten.nanmedian.default)
def nanmedian(x):
    return nanmedian_dim(x.reshape(-1), 0)[0]


@lowers(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value (smallest on ties) and its last index, by comparing all pairs. NaNs
    count as one value, as in ATen (which sorts them together), and as the largest on ties."""
    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    moved = jnp.moveaxis(x, axis, -1)
    counts = jnp.sum(_same(moved[..., :, None], moved[..., None, :]), axis=-1)
    chosen = counts == jnp.max(counts, axis=-1, keepdims=True)
    if is_floating(x.dtype):
        numbers = chosen & ~jnp.isnan(moved)
        smallest = jnp.min(jnp.where(numbers, moved, jnp.inf), axis=-1, keepdims=True)
        value = jnp.where(jnp.any(numbers, axis=-1, keepdims=True), smallest, jnp.nan).astype(x.dtype)
    else:
        value = jnp.min(jnp.where(chosen, moved, jnp.max(moved, axis=-1, keepdims=True)), axis=-1, keepdims=True)
    positions = jnp.arange(moved.shape[-1])
    index = jnp.max(jnp.where(_same(moved, value), positions, -1), axis=-1, keepdims=True).astype(jnp.int64)
    value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index


def _same(a, b):
    """a == b, with NaN equal to NaN (mode's counting)."""
    return (a == b) | (jnp.isnan(a) & jnp.isnan(b)) if is_floating(a.dtype) else a == b


# --- segment_reduce: reductions over consecutive runs of `axis` given their lengths -------------

_SEGMENT_OPS = {
    "sum": jax.ops.segment_sum,
    "mean": jax.ops.segment_sum,
    "prod": jax.ops.segment_prod,
    "max": jax.ops.segment_max,
    "min": jax.ops.segment_min,
}
_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -jnp.inf, "min": jnp.inf}


def _segment_reduce(data, reduce, lengths, axis, initial):
    """ATen's rule: every segment starts from `initial` (else the reduction's identity); mean
    divides by the length; an empty segment gives `initial`, or NaN for mean without one."""
    axis = canonical_dim(axis, data.ndim)
    leading, size, trailing = data.shape[:axis], data.shape[axis], data.shape[axis + 1 :]
    batch = math.prod(leading)
    segments = lengths.shape[-1]
    rows = data.reshape((batch, size, math.prod(trailing)))
    counts = jnp.broadcast_to(lengths.reshape((-1, segments)), (batch, segments))

    def one_row(values, row_lengths):
        ids = jnp.searchsorted(jnp.cumsum(row_lengths), jnp.arange(size), side="right")  # ids >= segments are dropped
        return _SEGMENT_OPS[reduce](values, ids, num_segments=segments)

    out = jax.vmap(one_row)(rows, counts)
    start = _SEGMENT_IDENTITY[reduce] if initial is None else initial
    empty = (counts == 0)[..., None]
    if reduce in ("sum", "mean"):
        out = out + start
    elif reduce == "prod":
        out = out * start
    else:
        out = jnp.where(empty, start, (jnp.maximum if reduce == "max" else jnp.minimum)(out, start))
    if reduce == "mean":
        out = out / jnp.maximum(counts, 1)[..., None].astype(out.dtype)
        out = jnp.where(empty, jnp.nan if initial is None else initial, out)
    return out.astype(data.dtype).reshape(leading + (segments,) + trailing)


def _segment_lengths(lengths, offsets):
    return lengths if lengths is not None else offsets[..., 1:] - offsets[..., :-1]


@lowers(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if indices is not None:
        raise NotImplementedError("aten.segment_reduce: `indices` is not supported (ATen does not support it either)")
    return _segment_reduce(data, reduce, _segment_lengths(lengths, offsets), axis, initial)


@lowers(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    lengths = _segment_lengths(lengths, offsets)
    if reduce == "prod":
        return _segment_prod_backward(grad, data, lengths, axis, initial)
    forward = lambda values: _segment_reduce(values, reduce, lengths, axis, initial)
    return jax.vjp(forward, data)[1](grad.astype(data.dtype))[0]


def _segment_prod_backward(grad, data, lengths, axis, initial):
    """d prod / d x_i = initial * (product of the other elements of i's segment), exact with
    zeros (JAX has no gradient for a scatter-multiply). Quadratic in the segmented size."""
    axis = canonical_dim(axis, data.ndim)
    leading, size, trailing = data.shape[:axis], data.shape[axis], data.shape[axis + 1 :]
    batch, segments = math.prod(leading), lengths.shape[-1]
    rows = data.reshape((batch, size, math.prod(trailing)))
    grads = grad.reshape((batch, segments, math.prod(trailing)))
    counts = jnp.broadcast_to(lengths.reshape((-1, segments)), (batch, segments))

    def one_row(values, row_grad, row_lengths):
        ids = jnp.searchsorted(jnp.cumsum(row_lengths), jnp.arange(size), side="right")
        others = (ids[:, None] == ids[None, :]) & ~jnp.eye(size, dtype=bool)  # (i, j): j in i's segment, j != i
        product = jnp.prod(jnp.where(others[..., None], values[None, :, :], 1), axis=1)
        upstream = row_grad[jnp.minimum(ids, segments - 1)] * (ids < segments)[:, None]
        return upstream * product * (1.0 if initial is None else initial)

    return jax.vmap(one_row)(rows, grads, counts).astype(data.dtype).reshape(data.shape)
