"""Pooling (max with indices, average, adaptive) and upsampling, 1-d to 3-d, with backward.

Windows are read as strided slices of the padded input, one per kernel offset
(`_windows`), so max/avg pooling are plain reductions over a stacked "kernel" axis and
the max indices fall out of an argmax. Indices are flat positions within each input
plane (h * W + w), as ATen returns them. Adaptive average pooling and linear
upsampling are separable: one small (out x in) weight matrix per spatial dim.
Backward ops are `jax.vjp` of the forward, except max-pool ones, which scatter the
gradient to the saved indices as ATen does.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from common import resampling
from tpu_backend.ops._common import expand_param, is_floating
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _pool_out_size(size, kernel, stride, pad, dilation, ceil_mode):
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window must start inside the input or left padding
    return out


def _pool_geometry(x, spatial, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = expand_param(kernel_size, spatial)
    stride = expand_param(stride, spatial) if stride else kernel
    padding = expand_param(padding, spatial)
    dilation = expand_param(dilation, spatial)
    sizes = x.shape[-spatial:]
    outs = tuple(_pool_out_size(*args, ceil_mode) for args in zip(sizes, kernel, stride, padding, dilation))
    return kernel, stride, padding, dilation, outs


def _windows(x, spatial, kernel, stride, padding, dilation, outs, fill):
    """Stack of the strided window slices of padded x: shape (K, *x.shape[:-s], *outs)."""
    sizes = x.shape[-spatial:]
    pads = []
    for size, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, outs):
        needed = (o - 1) * s + d * (k - 1) + 1
        pads.append((p, max(needed - size - p, 0)))
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - spatial) + pads, constant_values=fill)
    slices = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        index = tuple(
            slice(off * d, off * d + (o - 1) * s + 1, s) for off, d, s, o in zip(offsets, dilation, stride, outs)
        )
        slices.append(padded[(Ellipsis,) + index])
    return jnp.stack(slices)


def _lowest(dtype):
    return -jnp.inf if is_floating(dtype) else jnp.iinfo(dtype).min


def _max_pool(x, spatial, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation, outs = _pool_geometry(
        x, spatial, kernel_size, stride, padding, dilation, ceil_mode
    )
    windows = _windows(x, spatial, kernel, stride, padding, dilation, outs, _lowest(x.dtype))
    best = jnp.argmax(windows, axis=0)
    values = jnp.take_along_axis(windows, best[None], axis=0)[0]
    # Flat input position of the chosen element: per dim, out_index * stride - pad + offset * dilation.
    offsets = np.array(list(itertools.product(*(range(k) for k in kernel))))  # (K, spatial)
    sizes = x.shape[-spatial:]
    flat = jnp.zeros(best.shape, jnp.int64)
    for dim in range(spatial):
        shape = [1] * best.ndim
        shape[best.ndim - spatial + dim] = outs[dim]
        start = (jnp.arange(outs[dim]) * stride[dim] - padding[dim]).reshape(shape)
        position = start + jnp.asarray(offsets[:, dim] * dilation[dim])[best]
        flat = flat * sizes[dim] + position
    return values, flat


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _scatter_to_indices(grad_output, x, indices, spatial):
    """Add each output gradient at its saved flat input position (per plane)."""
    plane = math.prod(x.shape[-spatial:])
    leading = x.shape[:-spatial]
    planes = math.prod(leading)
    g = grad_output.reshape(planes, -1)
    idx = indices.reshape(planes, -1)
    rows = jnp.arange(planes)[:, None]
    grad_input = jnp.zeros((planes, plane), grad_output.dtype).at[rows, idx].add(g)
    return grad_input.reshape(x.shape)


@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, x, indices, 2)


@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, x, indices, 3)


def _avg_pool(x, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, dilation, outs = _pool_geometry(x, spatial, kernel_size, stride, padding, 1, ceil_mode)
    total = jnp.sum(_windows(x, spatial, kernel, stride, padding, dilation, outs, 0), axis=0)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # Count, per window, the cells that are real input (or padding, if counted); the
    # extra cells ceil_mode adds past the padding never count.
    sizes = x.shape[-spatial:]
    ones = jnp.ones(sizes, jnp.float32)
    if count_include_pad:
        ones = jnp.pad(ones, [(p, p) for p in padding], constant_values=1.0)
        counts = _windows(ones, spatial, kernel, stride, (0,) * spatial, dilation, outs, 0)
    else:
        counts = _windows(ones, spatial, kernel, stride, padding, dilation, outs, 0)
    divisor = jnp.sum(counts, axis=0)
    return (total / divisor).astype(x.dtype)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    forward = lambda v: _avg_pool(v, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return jax.vjp(forward, x)[1](grad_output)[0]


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    forward = lambda v: _avg_pool(v, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return jax.vjp(forward, x)[1](grad_output)[0]


# --- adaptive pooling ---------------------------------------------------------------------


def _adaptive_average_matrix(size, out, dtype):
    return jnp.asarray(resampling.adaptive_average_matrix(size, out), dtype)


def _adaptive_avg_pool(x, output_size):
    spatial = len(output_size)
    out = x
    for dim, size_out in enumerate(output_size):
        axis = x.ndim - spatial + dim
        matrix = _adaptive_average_matrix(x.shape[axis], size_out, jnp.float32 if not is_floating(x.dtype) else x.dtype)
        out = jnp.moveaxis(jnp.tensordot(out, matrix, axes=[[axis], [1]]), -1, axis)
    return out.astype(x.dtype)


@lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    return _adaptive_avg_pool(x, tuple(output_size))


@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, x):
    return jax.vjp(lambda v: _adaptive_avg_pool(v, grad_output.shape[-2:]), x)[1](grad_output)[0]


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, x):
    return jax.vjp(lambda v: _adaptive_avg_pool(v, grad_output.shape[-3:]), x)[1](grad_output)[0]


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    """(values, flat indices): gather every window (padded by repeating its last cell)."""
    out_h, out_w = expand_param(output_size, 2)
    rows, cols = (resampling.adaptive_window_index(size, out) for size, out in zip(x.shape[-2:], (out_h, out_w)))
    g = jnp.take(x, jnp.asarray(rows.reshape(-1)), axis=-2).reshape(x.shape[:-2] + rows.shape + x.shape[-1:])
    g = jnp.take(g, jnp.asarray(cols.reshape(-1)), axis=-1).reshape(g.shape[:-1] + cols.shape)  # (..., OH, KH, OW, KW)
    windows = jnp.swapaxes(g, -3, -2).reshape(g.shape[:-4] + (out_h, out_w, -1))
    best = jnp.argmax(windows, axis=-1)
    values = jnp.take_along_axis(windows, best[..., None], axis=-1)[..., 0]
    kw = cols.shape[1]
    h = jnp.asarray(rows)[jnp.arange(out_h)[:, None], best // kw]
    w = jnp.asarray(cols)[jnp.arange(out_w)[None, :], best % kw]
    return values, (h * x.shape[-1] + w).astype(jnp.int64)


def _adaptive_window_flat_index(spatial_shape, output_size):
    """(*output_size, window) flat input positions of every adaptive window (numpy, static);
    windows narrower than the widest repeat their last cell."""
    per_dim = [resampling.adaptive_window_index(size, out) for size, out in zip(spatial_shape, output_size)]
    strides = [math.prod(spatial_shape[d + 1 :]) for d in range(len(spatial_shape))]
    flat = np.zeros((), np.int64)
    for index, stride in zip(per_dim, strides):
        # (..., O_d, K_d): grow one output and one window axis per dim, then merge windows
        flat = flat[..., None, None] + (index * stride).reshape((1,) * (flat.ndim) + index.shape)
    rank = len(spatial_shape)
    order = [2 * d for d in range(rank)] + [2 * d + 1 for d in range(rank)]
    flat = flat.transpose(order)
    return flat.reshape(tuple(output_size) + (-1,))


@lowers(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    """(values, flat indices over D*H*W): every window gathered, its first maximum taken."""
    output_size = expand_param(output_size, 3)
    flat = _adaptive_window_flat_index(x.shape[-3:], output_size)
    windows = x.reshape(x.shape[:-3] + (-1,))[..., jnp.asarray(flat)]
    best = jnp.argmax(windows, axis=-1)
    values = jnp.take_along_axis(windows, best[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat), windows.shape), best[..., None], axis=-1)[..., 0]
    return values, indices.astype(jnp.int64)


@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, x, indices):
    return _scatter_to_indices(grad_output, x, indices, 3)


def _fractional_starts(sample, in_size, out_size, pool):
    """ATen's pseudo-random window starts from one uniform sample per plane: (..., out_size)."""
    if out_size == 1:
        return jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    alpha = jnp.asarray((in_size - pool) / (out_size - 1), sample.dtype)
    steps = jnp.arange(out_size - 1, dtype=sample.dtype)
    starts = ((steps + sample[..., None]) * alpha).astype(jnp.int64) - (sample[..., None] * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, random_samples, spatial):
    """(values, flat indices) of max pooling over windows placed by `random_samples`
    (N, C, spatial): one uniform sample per plane and spatial dim."""
    batched = x.ndim == spatial + 2
    planes = x if batched else x[None]
    kernel, outputs = expand_param(kernel_size, spatial), expand_param(output_size, spatial)
    sizes = planes.shape[2:]
    flat_positions = 0
    for d in range(spatial):
        # ATen's sample order: (W, H) for 2-d pooling, but (T, H, W) for 3-d
        sample = random_samples[..., spatial - 1 - d] if spatial == 2 else random_samples[..., d]
        starts = _fractional_starts(sample, sizes[d], outputs[d], kernel[d])  # (N, C, O_d)
        taps = starts[..., :, None] + jnp.arange(kernel[d])  # (N, C, O_d, K_d)
        stride = math.prod(sizes[d + 1 :])
        shape = [1] * (2 * spatial)
        shape[d], shape[spatial + d] = outputs[d], kernel[d]
        # (N, C, O_0.., K_0..): output axes first, then window axes
        taps = jnp.moveaxis(taps, -1, 2).reshape(taps.shape[:2] + (kernel[d], outputs[d]))
        taps = jnp.swapaxes(taps, 2, 3).reshape(taps.shape[:2] + tuple(shape))
        flat_positions = flat_positions + taps * stride
    window = math.prod(kernel)  # explicit sizes: -1 cannot be inferred for an empty batch
    flat_positions = flat_positions.reshape(planes.shape[:2] + tuple(outputs) + (window,))
    flat_input = planes.reshape(planes.shape[:2] + (math.prod(sizes),))
    gathered = flat_positions.reshape(planes.shape[:2] + (math.prod(outputs) * window,))
    values = jnp.take_along_axis(flat_input, gathered, axis=-1).reshape(flat_positions.shape)
    best = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(flat_positions, best[..., None], axis=-1)[..., 0]
    return (out, indices) if batched else (out[0], indices[0])


@lowers(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2)


@lowers(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3)


@lowers(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, x, indices, 2)


@lowers(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, x, indices, 3)


@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, x, indices):
    return _scatter_to_indices(grad_output, x, indices, 2)


# --- upsampling ---------------------------------------------------------------------------


def _upsample_nearest(x, output_size, scales, exact=False):
    spatial = len(output_size)
    for dim, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - spatial + dim
        x = jnp.take(x, resampling.nearest_indices(x.shape[axis], out, scale, exact).astype(np.int32), axis=axis)
    return x


def _linear_matrix(in_size, out_size, align_corners, scale, dtype):
    return jnp.asarray(resampling.linear_weights(in_size, out_size, align_corners, scale), dtype)


def _upsample_linear(x, output_size, align_corners, scales):
    spatial = len(output_size)
    out = x
    for dim, (size_out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - spatial + dim
        matrix = _linear_matrix(x.shape[axis], size_out, align_corners, scale, x.dtype)
        out = jnp.moveaxis(jnp.tensordot(out, matrix, axes=[[axis], [1]], precision="highest"), -1, axis)
    return out


def _cubic_matrix(in_size, out_size, align_corners, scale, dtype):
    """(out, in) bicubic weights (Keys, A = -0.75), edge taps clamped, as ATen's kernel."""
    a = -0.75
    positions = jnp.arange(out_size, dtype=jnp.float32)
    if align_corners:
        source = positions * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        source = (positions + 0.5) * resampling.source_scale(in_size, out_size, scale) - 0.5  # not clamped for cubic
    base = jnp.floor(source)
    t = source - base
    taps = [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]
    columns = jnp.arange(in_size)
    matrix = jnp.zeros((out_size, in_size), jnp.float32)
    for k, weight in enumerate(taps):
        tap = jnp.clip(base.astype(jnp.int32) - 1 + k, 0, in_size - 1)
        matrix = matrix + (columns == tap[:, None]) * weight[:, None]
    return matrix.astype(dtype)


@lowers(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    out = x
    for dim, (size_out, scale) in enumerate(zip(output_size, (scales_h, scales_w))):
        axis = x.ndim - 2 + dim
        matrix = _cubic_matrix(x.shape[axis], size_out, align_corners, scale, x.dtype)
        out = jnp.moveaxis(jnp.tensordot(out, matrix, axes=[[axis], [1]], precision="highest"), -1, axis)
    return out


def _antialias_matrix(in_size, out_size, align_corners, scale, dtype):
    """(out, in) weights of antialiased linear resampling: a triangle filter stretched by the
    downscale factor (support 1 when upsampling), normalised per output, as ATen's _aa ops."""
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        ratio = float(resampling.source_scale(in_size, out_size, scale))
    support = ratio if ratio >= 1.0 else 1.0
    inverse = 1.0 / ratio if ratio >= 1.0 else 1.0
    matrix = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = ratio * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), in_size)
        taps = np.arange(low, high)
        weights = np.maximum(0.0, 1.0 - np.abs((taps - center + 0.5) * inverse))
        total = weights.sum()
        matrix[i, low:high] = weights / total if total > 0 else weights
    return jnp.asarray(matrix, dtype)


def _upsample_bilinear_aa(x, output_size, align_corners, scales):
    out = x
    for dim, (size_out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - 2 + dim
        matrix = _antialias_matrix(x.shape[axis], size_out, align_corners, scale, x.dtype)
        out = jnp.moveaxis(jnp.tensordot(out, matrix, axes=[[axis], [1]], precision="highest"), -1, axis)
    return out


@lowers(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bilinear_aa(x, output_size, align_corners, (scales_h, scales_w))


@lowers(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    forward = lambda v: _upsample_bilinear_aa(v, output_size, align_corners, (scales_h, scales_w))
    return _input_grad(forward, grad_output, input_size)


@lowers(aten.upsample_nearest1d.default)
def upsample_nearest1d(x, output_size, scales=None):
    return _upsample_nearest(x, output_size, (scales,))


@lowers(aten.upsample_nearest2d.default)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, (scales_h, scales_w))


@lowers(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, (scales_h, scales_w), exact=True)


@lowers(aten._upsample_nearest_exact1d.default)
def upsample_nearest_exact1d(x, output_size, scales=None):
    return _upsample_nearest(x, output_size, (scales,), exact=True)


@lowers(aten._upsample_nearest_exact3d.default)
def upsample_nearest_exact3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, (scales_d, scales_h, scales_w), exact=True)


@lowers(aten.upsample_nearest3d.default)
def upsample_nearest3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(x, output_size, (scales_d, scales_h, scales_w))


@lowers(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    forward = lambda v: _upsample_nearest(v, output_size, (scales_h, scales_w))
    return jax.vjp(forward, jnp.zeros(tuple(input_size), grad_output.dtype))[1](grad_output)[0]


@lowers(aten.upsample_linear1d.default)
def upsample_linear1d(x, output_size, align_corners, scales=None):
    return _upsample_linear(x, output_size, align_corners, (scales,))


@lowers(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(x, output_size, align_corners, (scales_h, scales_w))


@lowers(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(x, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear(x, output_size, align_corners, (scales_d, scales_h, scales_w))


@lowers(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    forward = lambda v: _upsample_linear(v, output_size, align_corners, (scales_h, scales_w))
    return jax.vjp(forward, jnp.zeros(tuple(input_size), grad_output.dtype))[1](grad_output)[0]


def _input_grad(forward, grad_output, input_size):
    """Backward of a linear resampling: the vjp of `forward` at a zero input."""
    return jax.vjp(forward, jnp.zeros(tuple(input_size), grad_output.dtype))[1](grad_output)[0]


@lowers(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _input_grad(lambda v: _upsample_nearest(v, output_size, (scales,)), grad_output, input_size)


@lowers(aten._upsample_nearest_exact2d_backward.default)
def upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    forward = lambda v: _upsample_nearest(v, output_size, (scales_h, scales_w), exact=True)
    return _input_grad(forward, grad_output, input_size)


@lowers(aten._upsample_nearest_exact1d_backward.default)
def upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
    return _input_grad(lambda v: _upsample_nearest(v, output_size, (scales,), exact=True), grad_output, input_size)


@lowers(aten._upsample_nearest_exact3d_backward.default)
def upsample_nearest_exact3d_backward(
    grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None
):
    forward = lambda v: _upsample_nearest(v, output_size, (scales_d, scales_h, scales_w), exact=True)
    return _input_grad(forward, grad_output, input_size)


@lowers(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    forward = lambda v: _upsample_nearest(v, output_size, (scales_d, scales_h, scales_w))
    return _input_grad(forward, grad_output, input_size)


@lowers(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    forward = lambda v: _upsample_linear(v, output_size, align_corners, (scales,))
    return _input_grad(forward, grad_output, input_size)


@lowers(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(
    grad_output, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
    forward = lambda v: _upsample_linear(v, output_size, align_corners, (scales_d, scales_h, scales_w))
    return _input_grad(forward, grad_output, input_size)


@lowers(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    forward = lambda v: upsample_bicubic2d(v, output_size, align_corners, scales_h, scales_w)
    return _input_grad(forward, grad_output, input_size)
