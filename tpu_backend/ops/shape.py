"""Copying shape ops: cat/stack, clone and casts, flip/roll/repeat, pads, tril/triu,
pixel shuffles, im2col/col2im and other rearrangements that produce new tensors; the
unchecked `_unsafe_index*` forms decompositions emit.

View ops (view, permute, slice, expand...) and their `*_copy` twins are not here: the
device keeps views as storage views, and `views.py` holds their functional forms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_backend.ops._common import canonical_dim, canonical_dims, expand_param, jax_dtype, result_dtype
from tpu_backend.ops.indexing import index, index_put
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


@lowers(aten.cat.default)
def cat(tensors, dim=0):
    # ATen skips 1-d empty tensors (legacy) and promotes the rest to a common dtype.
    dtype = result_dtype(*tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=canonical_dim(dim, kept[0].ndim))


@lowers(aten.stack.default)
def stack(tensors, dim=0):
    dtype = result_dtype(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=canonical_dim(dim, tensors[0].ndim + 1))


@lowers(aten.clone.default)
def clone(x, *, memory_format=None):
    return jnp.array(x, copy=True)


@lowers(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return jnp.array(x, copy=True)


@lowers(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """The dtype cast part of `.to()`; moving between devices is the device's business."""
    return x.astype(jax_dtype(dtype)) if dtype is not None else jnp.array(x, copy=True)


@lowers(aten.copy.default)
def copy(x, src, non_blocking=False):
    """Functional `copy_`: src broadcast to self's shape, cast to self's dtype."""
    return jnp.broadcast_to(src, x.shape).astype(x.dtype)


@lowers(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=canonical_dims(dims, x.ndim)) if dims else x


@lowers(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(canonical_dim(d, x.ndim) for d in dims))


@lowers(aten.rot90.default)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=tuple(canonical_dim(d, x.ndim) for d in dims))


@lowers(aten.repeat.default)
def repeat(x, repeats):
    extra = len(repeats) - x.ndim
    return jnp.tile(x.reshape((1,) * extra + x.shape), tuple(repeats))


@lowers(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowers(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowers(aten.trace.default)
def trace(x):
    return jnp.trace(x).astype(jnp.int64 if not jnp.issubdtype(x.dtype, jnp.inexact) else x.dtype)


@lowers(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    size = x.shape[-1] + abs(offset)
    out_ndim = x.ndim + 1
    dim1, dim2 = canonical_dim(dim1, out_ndim), canonical_dim(dim2, out_ndim)
    rows = np.arange(x.shape[-1]) + max(-offset, 0)
    cols = np.arange(x.shape[-1]) + max(offset, 0)
    square = jnp.zeros(x.shape[:-1] + (size, size), x.dtype).at[..., rows, cols].set(x)
    return jnp.moveaxis(square, (-2, -1), (dim1, dim2))


@lowers(aten.block_diag.default)
def block_diag(tensors):
    dtype = result_dtype(*tensors)
    blocks = [t.reshape(1, -1) if t.ndim == 1 else t.reshape(1, 1) if t.ndim == 0 else t for t in tensors]
    rows, cols = sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)
    out = jnp.zeros((rows, cols), dtype)
    r = c = 0
    for b in blocks:
        out = out.at[r : r + b.shape[0], c : c + b.shape[1]].set(b.astype(dtype))
        r, c = r + b.shape[0], c + b.shape[1]
    return out


# --- padding ------------------------------------------------------------------------------


def _pad_widths(x, pad):
    """ATen's pad list (last dim first, (before, after) pairs) as jnp.pad widths."""
    pairs = [(pad[i], pad[i + 1]) for i in range(0, len(pad), 2)]
    return [(0, 0)] * (x.ndim - len(pairs)) + pairs[::-1]


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    widths = _pad_widths(x, pad)
    # Negative pads crop: pad with the positive parts, then slice the negative ones off.
    padded = jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], constant_values=jnp.asarray(value, x.dtype))
    crop = tuple(slice(-min(a, 0), padded.shape[d] + min(b, 0)) for d, (a, b) in enumerate(widths))
    return padded[crop]


def _pad_then_crop(x, widths, mode):
    """jnp.pad for the positive widths, then slice away the negative ones (ATen crops)."""
    padded = jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in widths], mode=mode)
    return padded[tuple(slice(-min(a, 0), padded.shape[d] + min(b, 0)) for d, (a, b) in enumerate(widths))]


@lowers(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(x, padding):
    return _pad_then_crop(x, _pad_widths(x, padding), "reflect")


@lowers(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(x, padding):
    return _pad_then_crop(x, _pad_widths(x, padding), "edge")


@lowers(
    aten.reflection_pad1d_backward.default,
    aten.reflection_pad2d_backward.default,
    aten.reflection_pad3d_backward.default,
)
def reflection_pad_backward(grad_output, x, padding):
    return jax.vjp(lambda v: reflection_pad(v, padding), x)[1](grad_output)[0]


@lowers(
    aten.replication_pad1d_backward.default,
    aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
)
def replication_pad_backward(grad_output, x, padding):
    return jax.vjp(lambda v: replication_pad(v, padding), x)[1](grad_output)[0]


# --- channel rearrangements ---------------------------------------------------------------


@lowers(aten.pixel_shuffle.default)
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    out = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    out = jnp.transpose(out, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return out.reshape(*lead, c // (r * r), h * r, w * r)


@lowers(aten.pixel_unshuffle.default)
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    out = x.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    out = jnp.transpose(out, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return out.reshape(*lead, c * r * r, h // r, w // r)


@lowers(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    n, c = x.shape[:2]
    rest = x.shape[2:]
    return jnp.swapaxes(x.reshape((n, groups, c // groups) + rest), 1, 2).reshape(x.shape)


# --- im2col / col2im (nn.Unfold / nn.Fold) -------------------------------------------------


def _patch_index(output_size, kernel_size, dilation, padding, stride):
    """(K, L) row/col positions in the padded image for every kernel offset and block."""
    kh, kw = kernel_size
    dh, dw = dilation
    ph, pw = padding
    sh, sw = stride
    blocks_h = (output_size[0] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    blocks_w = (output_size[1] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    ki, kj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    bi, bj = np.meshgrid(np.arange(blocks_h), np.arange(blocks_w), indexing="ij")
    rows = ki.reshape(-1, 1) * dh + bi.reshape(1, -1) * sh
    cols = kj.reshape(-1, 1) * dw + bj.reshape(1, -1) * sw
    return rows, cols


@lowers(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    kernel_size, dilation, padding, stride = (expand_param(v, 2) for v in (kernel_size, dilation, padding, stride))
    rows, cols = _patch_index(x.shape[-2:], kernel_size, dilation, padding, stride)
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(padding[0],) * 2, (padding[1],) * 2])
    patches = padded[..., rows, cols]  # (..., C, K, L)
    return patches.reshape(x.shape[:-3] + (x.shape[-3] * rows.shape[0], rows.shape[1]))


@lowers(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    output_size, kernel_size, dilation, padding, stride = (
        expand_param(v, 2) for v in (output_size, kernel_size, dilation, padding, stride)
    )
    rows, cols = _patch_index(output_size, kernel_size, dilation, padding, stride)
    k = rows.shape[0]
    channels = x.shape[-2] // k
    patches = x.reshape(x.shape[:-2] + (channels, k, x.shape[-1]))
    height, width = output_size[0] + 2 * padding[0], output_size[1] + 2 * padding[1]
    canvas = jnp.zeros(x.shape[:-2] + (channels, height, width), x.dtype).at[..., rows, cols].add(patches)
    return canvas[..., padding[0] : padding[0] + output_size[0], padding[1] : padding[1] + output_size[1]]


# --- unchecked indexing (emitted by decompositions) ----------------------------------------


@lowers(aten._unsafe_index.Tensor)
def unsafe_index(x, indices):
    return index(x, indices)


@lowers(aten._unsafe_index_put.default)
def unsafe_index_put(x, indices, values, accumulate=False):
    return index_put(x, indices, values, accumulate)


@lowers(aten._unsafe_masked_index.default)
def unsafe_masked_index(x, mask, indices, fill):
    safe = [None if i is None else jnp.where(mask, i, 0) for i in indices]
    return jnp.where(mask, index(x, safe), jnp.asarray(fill, x.dtype))
