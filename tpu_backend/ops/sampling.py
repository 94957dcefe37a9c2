"""`grid_sampler_2d` and `grid_sampler_3d` (F.grid_sample) and their backwards.

Grid coordinates in [-1, 1] are mapped to pixels (`align_corners` decides whether -1
is the first pixel's centre or its outer edge), folded by the padding mode (zeros,
border, reflection), then read by nearest, bilinear or (2-D) bicubic interpolation. Reads outside
the image give 0 in "zeros" mode. The backward is `jax.vjp` of the forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops.registry import lowers

aten = torch.ops.aten

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, low, high):
    """Fold coordinates into [low, high] by mirroring at both ends."""
    span = high - low
    if span <= 0:
        return jnp.zeros_like(coord)
    offset = jnp.abs(coord - low)
    flips = jnp.floor(offset / span)
    rest = offset - flips * span
    return jnp.where(jnp.mod(flips, 2) == 0, low + rest, high - rest)


def _source_coordinate(coord, size, padding_mode, align_corners):
    return _fold(_unnormalize(coord, size, align_corners), size, padding_mode, align_corners)


def _fold(coord, size, padding_mode, align_corners):
    """A pixel coordinate folded into the image by the padding mode (zeros: unchanged)."""
    if padding_mode == BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == REFLECTION:
        coord = _reflect(coord, 0, size - 1) if align_corners else _reflect(coord, -0.5, size - 0.5)
        return jnp.clip(coord, 0, size - 1)
    return coord


def _read(image, ys, xs):
    """image (N, C, H, W) at integer (N, Ho, Wo) positions; 0 outside -> (N, C, Ho, Wo)."""
    height, width = image.shape[-2:]
    inside = (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
    batch = jnp.arange(image.shape[0])[:, None, None]
    values = image[batch, :, jnp.clip(ys, 0, height - 1), jnp.clip(xs, 0, width - 1)]  # (N, Ho, Wo, C)
    values = jnp.where(inside[..., None], values, 0)
    return jnp.moveaxis(values, -1, 1)


def _grid_sample(image, grid, interpolation_mode, padding_mode, align_corners):
    if image.dtype in (jnp.float16, jnp.bfloat16):  # interpolate in float32, round once
        out = _grid_sample(
            image.astype(jnp.float32), grid.astype(jnp.float32), interpolation_mode, padding_mode, align_corners
        )
        return out.astype(image.dtype)
    height, width = image.shape[-2:]
    x = _source_coordinate(grid[..., 0], width, padding_mode, align_corners)
    y = _source_coordinate(grid[..., 1], height, padding_mode, align_corners)
    if interpolation_mode == NEAREST:
        return _read(image, jnp.round(y).astype(jnp.int32), jnp.round(x).astype(jnp.int32))
    if interpolation_mode == BICUBIC:
        return _bicubic(image, grid, padding_mode, align_corners)
    x0, y0 = jnp.floor(x), jnp.floor(y)
    wx, wy = (x - x0)[:, None], (y - y0)[:, None]
    x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
    top = _read(image, y0, x0) * (1 - wx) + _read(image, y0, x0 + 1) * wx
    bottom = _read(image, y0 + 1, x0) * (1 - wx) + _read(image, y0 + 1, x0 + 1) * wx
    return (top * (1 - wy) + bottom * wy).astype(image.dtype)


def _cubic_weights(t, a=-0.75):
    """Keys' cubic convolution weights (A = -0.75, as ATen) of the 4 taps at -1, 0, 1, 2 from t in [0, 1)."""
    near = lambda d: ((a + 2) * d - (a + 3)) * d * d + 1  # |d| <= 1
    far = lambda d: ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # 1 < |d| < 2
    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _bicubic(image, grid, padding_mode, align_corners):
    """ATen's bicubic grid sample: the 4x4 taps around the unpadded source point, each tap's
    integer position folded by the padding mode (zeros: 0 outside)."""
    height, width = image.shape[-2:]
    x = _unnormalize(grid[..., 0], width, align_corners)
    y = _unnormalize(grid[..., 1], height, align_corners)
    x0, y0 = jnp.floor(x), jnp.floor(y)
    wx, wy = _cubic_weights(x - x0), _cubic_weights(y - y0)

    def tap(coord, size):
        folded = _fold(coord, size, padding_mode, align_corners)
        return jnp.trunc(folded).astype(jnp.int32)

    out = 0
    for i, fy in enumerate(wy):
        row = 0
        for j, fx in enumerate(wx):
            row = row + _read(image, tap(y0 - 1 + i, height), tap(x0 - 1 + j, width)) * fx[:, None]
        out = out + row * fy[:, None]
    return out.astype(image.dtype)


@lowers(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(
        _grid_sample, grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask
    )


def _grid_sampler_backward(sample, grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """(grad_input, grad_grid) of `sample` by its vjp; None where output_mask is False."""
    forward = lambda image, coords: sample(image, coords, interpolation_mode, padding_mode, align_corners)
    grad_input, grad_grid = jax.vjp(forward, x, grid)[1](grad_output)
    return tuple(g if wanted else None for g, wanted in zip((grad_input, grad_grid), output_mask))


# --- 3-D (volumes): grid (N, Do, Ho, Wo, 3) holds (x, y, z); nearest or trilinear -----------


def _read_volume(volume, zs, ys, xs):
    """volume (N, C, D, H, W) at integer (N, Do, Ho, Wo) positions; 0 outside -> (N, C, Do, Ho, Wo)."""
    depth, height, width = volume.shape[-3:]
    inside = (zs >= 0) & (zs < depth) & (ys >= 0) & (ys < height) & (xs >= 0) & (xs < width)
    batch = jnp.arange(volume.shape[0])[:, None, None, None]
    values = volume[batch, :, jnp.clip(zs, 0, depth - 1), jnp.clip(ys, 0, height - 1), jnp.clip(xs, 0, width - 1)]
    values = jnp.where(inside[..., None], values, 0)
    return jnp.moveaxis(values, -1, 1)


def _grid_sample_3d(volume, grid, interpolation_mode, padding_mode, align_corners):
    if volume.dtype in (jnp.float16, jnp.bfloat16):  # interpolate in float32, round once
        out = _grid_sample_3d(
            volume.astype(jnp.float32), grid.astype(jnp.float32), interpolation_mode, padding_mode, align_corners
        )
        return out.astype(volume.dtype)
    depth, height, width = volume.shape[-3:]
    x = _source_coordinate(grid[..., 0], width, padding_mode, align_corners)
    y = _source_coordinate(grid[..., 1], height, padding_mode, align_corners)
    z = _source_coordinate(grid[..., 2], depth, padding_mode, align_corners)
    if interpolation_mode == NEAREST:
        return _read_volume(volume, *(jnp.round(c).astype(jnp.int32) for c in (z, y, x)))
    if interpolation_mode != BILINEAR:  # ATen has no bicubic for volumes either
        raise NotImplementedError("aten.grid_sampler_3d: only nearest and bilinear (trilinear) modes exist")
    x0, y0, z0 = jnp.floor(x), jnp.floor(y), jnp.floor(z)
    wx, wy, wz = (x - x0)[:, None], (y - y0)[:, None], (z - z0)[:, None]
    x0, y0, z0 = x0.astype(jnp.int32), y0.astype(jnp.int32), z0.astype(jnp.int32)
    out = 0
    for dz, fz in ((0, 1 - wz), (1, wz)):
        for dy, fy in ((0, 1 - wy), (1, wy)):
            for dx, fx in ((0, 1 - wx), (1, wx)):
                out = out + _read_volume(volume, z0 + dz, y0 + dy, x0 + dx) * (fz * fy * fx)
    return out.astype(volume.dtype)


@lowers(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_3d(x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(
        _grid_sample_3d, grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask
    )
