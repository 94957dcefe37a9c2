"""Shape and data-movement ops: reshape/view, permute, squeeze, cat, split, slice, select,
expand, repeat, flip, roll, pixel (un)shuffle, dtype casts, plus the bookkeeping nodes
export leaves behind (alias, clone, detach, asserts). `getitem` on multi-output ops is
resolved by the pipeline itself.

View ops become copies (TFLite has no aliasing): RESHAPE, TRANSPOSE, STRIDED_SLICE.
Squeeze/unsqueeze are RESHAPEs, which every delegate supports (the GPU delegates reject
SQUEEZE/EXPAND_DIMS). Operations on constants are done here in numpy, so they never
reach the graph as ops.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit, layout, symbolic
from converter.lowering.context import static_shape
from converter.lowering.registry import lowers

aten = torch.ops.aten

# Values (int64 bounds) PyTorch uses for "to the end" in slices.
_INT64_MAX = 2**63 - 1


# ---- bookkeeping --------------------------------------------------------------------------


@lowers(
    aten.alias.default,
    aten.clone.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
    aten.contiguous.default,
    aten.alias_copy.default,
    aten.detach_copy.default,
)
def identity(ctx, x, *args, **kwargs):
    """Copies and aliases are the same value in a dataflow graph."""
    return x


@lowers(
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    aten.sym_constrain_range_for_size.default,
    aten.sym_constrain_range.default,
)
def no_op(ctx, *args, **kwargs):
    """Export-time checks: nothing to compute."""
    return None


# Size queries (aten.sym_size) and arithmetic on sizes live in symbolic.py.


@lowers(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default)
def to_copy(ctx, x, *args, **kwargs):
    """Only the dtype matters on the edge (device, layout and memory format do not);
    `type_as(x, other)` is the same cast."""
    return emit.cast(ctx, x, ctx.out_dtype())


# ---- reshapes -----------------------------------------------------------------------------


def _reshape_to_node(ctx, x: Tensor) -> Tensor:
    """RESHAPE x to the node's shape; one dynamic dimension is written as -1."""
    shape, signature = static_shape(ctx.meta.shape)
    if x.is_const:
        return ctx.const(x.data.reshape(shape))
    if shape == x.shape and signature == x.shape_signature:
        return x
    if signature is not None and signature.count(-1) > 1:  # sizes computed from the inputs' shapes
        return ctx.emit("RESHAPE", [x, symbolic.shape_tensor(ctx, ctx.meta.shape)])
    new_shape = list(signature) if signature is not None else list(shape)
    return ctx.emit("RESHAPE", [x, emit.int32(ctx, new_shape)], {"newShape": new_shape})


@lowers(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.flatten.using_ints,
    aten.unflatten.int,
)
def reshape(ctx, x, *args):
    return _reshape_to_node(ctx, x)


@lowers(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims):
    return emit.transpose(ctx, x, [emit.normalize_dim(d, x.rank) for d in dims])


@lowers(aten.transpose.int)
def transpose(ctx, x, dim0, dim1):
    perm = list(range(x.rank))
    a, b = emit.normalize_dim(dim0, x.rank), emit.normalize_dim(dim1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return emit.transpose(ctx, x, perm)


@lowers(aten.t.default)
def t(ctx, x):
    return emit.transpose(ctx, x, list(reversed(range(x.rank))))


# ---- joining and splitting ----------------------------------------------------------------


@lowers(aten.cat.default)
def cat(ctx, tensors, dim=0):
    dtype = ctx.out_dtype()
    # torch.cat skips legacy empty 1-D tensors; TFLite would reject their rank.
    parts = [emit.cast(ctx, t, dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]
    axis = emit.normalize_dim(dim, parts[0].rank)
    if len(parts) == 1:
        return parts[0]
    if all(p.is_const for p in parts):
        return ctx.const(np.concatenate([p.data for p in parts], axis=axis))
    return ctx.emit("CONCATENATION", parts, {"axis": axis, "fusedActivationFunction": "NONE"})


@lowers(aten.stack.default)
def stack(ctx, tensors, dim=0):
    axis = emit.normalize_dim(dim, tensors[0].rank + 1)
    return ctx.emit("PACK", list(tensors), {"valuesCount": len(tensors), "axis": axis})


def _split_sizes(ctx, x: Tensor, sizes, dim) -> list[Tensor]:
    axis = emit.normalize_dim(dim, x.rank)
    if len(sizes) == 1:
        return [x]
    if x.is_const:
        bounds = np.cumsum(sizes)[:-1]
        return [ctx.const(part) for part in np.split(x.data, bounds, axis=axis)]
    if len(set(sizes)) == 1:  # equal parts: SPLIT, which XNNPACK takes (2 to 4 parts); SPLIT_V it never does
        return list(ctx.emit("SPLIT", [emit.int32(ctx, axis), x], {"numSplits": len(sizes)}, num_outputs=len(sizes)))
    outputs = ctx.emit(
        "SPLIT_V",
        [x, emit.int32(ctx, list(sizes)), emit.int32(ctx, axis)],
        {"numSplits": len(sizes)},
        num_outputs=len(sizes),
    )
    return list(outputs)


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(ctx, x, split_sizes, dim=0):
    return _split_sizes(ctx, x, list(split_sizes), dim)


@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def split(ctx, x, split_size, dim=0):
    size = x.shape[emit.normalize_dim(dim, x.rank)]
    sizes = [min(split_size, size - start) for start in range(0, size, split_size)]
    return _split_sizes(ctx, x, sizes, dim)


@lowers(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, x, dim=0):
    axis = emit.normalize_dim(dim, x.rank)
    count = x.shape[axis]
    if x.is_const:
        return [ctx.const(np.take(x.data, i, axis=axis)) for i in range(count)]
    if not x.is_dynamic:
        # SPLIT + RESHAPE, not UNPACK: XNNPACK takes SPLIT (2 to 4 parts) and RESHAPE but no
        # UNPACK, which would cut its partition in two (`q, k, v = qkv.unbind(0)` in timm's
        # attention blocks); and LiteRT's UNPACK refuses int64.
        kept = x.shape[:axis] + (1,) + x.shape[axis + 1 :]
        parts = ctx.emit(
            "SPLIT", [emit.int32(ctx, axis), x], {"numSplits": count}, shape=kept, dtype=x.dtype, num_outputs=count
        )
        return [emit.reshape(ctx, part, x.shape[:axis] + x.shape[axis + 1 :]) for part in parts]
    return list(ctx.emit("UNPACK", [x], {"num": count, "axis": axis}, num_outputs=count))


# ---- slicing ------------------------------------------------------------------------------


def _clamp_index(i, size: int, default: int) -> int:
    if i is None:
        return default
    i = int(i)
    if i < 0:
        i += size
    return min(max(i, 0), size)


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    axis = emit.normalize_dim(dim, x.rank)
    if x.is_dynamic or symbolic.is_symbolic(start) or symbolic.is_symbolic(end):
        return _dynamic_slice(ctx, x, axis, start, end, step)
    size = x.shape[axis]
    start = _clamp_index(start, size, 0)
    stop = size if end is None or end >= _INT64_MAX else _clamp_index(end, size, size)
    if (start, stop, step) == (0, size, 1):
        return x
    return emit.slice_axis(ctx, x, axis, start, max(stop, start), step)


def _dynamic_slice(ctx, x: Tensor, axis: int, start, end, step, shrink: bool = False) -> Tensor:
    """STRIDED_SLICE of a dynamic tensor, or with symbolic bounds: untouched axes use the
    begin/end masks (whatever their size at run time), negative bounds count from the end
    (the kernel adds the axis size), "to the end" is an end-mask bit, and symbolic bounds
    are computed from the inputs' shapes."""
    begin, stop = [0] * x.rank, [0] * x.rank
    begin_mask = end_mask = ((1 << x.rank) - 1) & ~(1 << axis)
    if start is None:
        begin_mask |= 1 << axis
    else:
        begin[axis] = start
    if end is None or (not symbolic.is_symbolic(end) and end >= _INT64_MAX):
        end_mask |= 1 << axis
    else:
        stop[axis] = end
    strides = [1] * x.rank
    strides[axis] = int(step)
    bounds = [
        symbolic.shape_tensor(ctx, v) if any(map(symbolic.is_symbolic, v)) else emit.int32(ctx, v)
        for v in (begin, stop, strides)
    ]
    return ctx.emit(
        "STRIDED_SLICE",
        [x, *bounds],
        {
            "beginMask": begin_mask,
            "endMask": end_mask,
            "ellipsisMask": 0,
            "newAxisMask": 0,
            "shrinkAxisMask": (1 << axis) if shrink else 0,
            "offset": False,
        },
    )


@lowers(aten.select.int, aten.select_copy.int)
def select(ctx, x, dim, index):
    axis = emit.normalize_dim(dim, x.rank)
    if x.is_dynamic or symbolic.is_symbolic(index):
        last = not symbolic.is_symbolic(index) and index == -1
        return _dynamic_slice(ctx, x, axis, index, None if last else index + 1, 1, shrink=True)
    index = index + x.shape[axis] if index < 0 else index
    if x.is_const:
        return ctx.const(np.take(x.data, index, axis=axis))
    begin = [0] * x.rank
    end = list(x.shape)
    begin[axis], end[axis] = index, index + 1
    return emit.strided_slice(ctx, x, begin, end, [1] * x.rank, shrink_axis_mask=1 << axis)


@lowers(aten.narrow.default)
def narrow(ctx, x, dim, start, length):
    return slice_(ctx, x, dim, start, start + length if start >= 0 else start + x.shape[dim] + length)


# ---- broadcasting and tiling --------------------------------------------------------------


@lowers(aten.expand.default, aten.expand_copy.default, aten.expand_as.default)
def expand(ctx, x, size, implicit=False):
    """To the node's shape (`expand_as(x, other)`: other's shape)."""
    shape, signature = static_shape(ctx.meta.shape)
    if signature is not None:  # a dynamic target: its sizes are computed from the inputs' shapes
        if signature == x.shape_signature:
            return x
        return ctx.emit("BROADCAST_TO", [x, symbolic.shape_tensor(ctx, ctx.meta.shape)])
    if x.is_const:
        return ctx.const(np.broadcast_to(x.data, shape))
    if tuple(shape) == x.shape:
        return x
    return ctx.emit("BROADCAST_TO", [x, emit.int32(ctx, shape)])


@lowers(aten.repeat.default)
def repeat(ctx, x, repeats):
    repeats = [int(r) for r in repeats]
    if len(repeats) > x.rank:  # torch.repeat adds leading axes
        x = emit.reshape(ctx, x, (1,) * (len(repeats) - x.rank) + x.shape)
    if x.is_const:
        return ctx.const(np.tile(x.data, repeats))
    if all(r == 1 for r in repeats):
        return x
    return ctx.emit("TILE", [x, emit.int32(ctx, repeats)])


@lowers(aten.repeat_interleave.self_int)
def repeat_interleave(ctx, x, repeats, dim=None, output_size=None):
    """Each element `repeats` times in a row along `dim` (of the flattened x when None):
    one GATHER of constant positions."""
    if not isinstance(repeats, int) or x.is_dynamic:
        raise NotImplementedError("repeat_interleave by a run-time count or of a dynamic input")
    if dim is None:
        x, dim = emit.reshape(ctx, x, (int(np.prod(x.shape)),)), 0
    dim = emit.normalize_dim(dim, x.rank)
    if x.is_const:
        return ctx.const(np.repeat(x.data, repeats, axis=dim))
    rows = np.repeat(np.arange(x.shape[dim]), repeats)
    shape = (*x.shape[:dim], len(rows), *x.shape[dim + 1 :])
    return emit.op(ctx, "GATHER", [x, emit.int32(ctx, rows)], {"axis": dim, "batchDims": 0}, shape=shape, dtype=x.dtype)


@lowers(aten.flip.default)
def flip(ctx, x, dims):
    """One REVERSE_V2 per axis: older TFLite kernels reverse a single axis per op."""
    axes = emit.normalize_dims(dims, x.rank) if dims else []
    if x.is_const:
        return ctx.const(np.flip(x.data, axes))
    for axis in axes:
        x = emit.op(ctx, "REVERSE_V2", [x, emit.int32(ctx, [axis])], shape=x.shape, dtype=x.dtype)
    return x


@lowers(aten.roll.default)
def roll(ctx, x, shifts, dims=()):
    """Each rolled axis is a CONCATENATION of its two slices (tail first)."""
    if not dims:  # roll the flattened tensor, then restore the shape
        flat = emit.reshape(ctx, x, (int(np.prod(x.shape)),))
        return emit.reshape(ctx, roll(ctx, flat, shifts, [0]), x.shape)
    for shift, dim in zip(shifts, dims):
        axis = emit.normalize_dim(dim, x.rank)
        size = x.shape[axis]
        k = shift % size
        if k == 0:
            continue
        tail = emit.slice_axis(ctx, x, axis, size - k, size)
        head = emit.slice_axis(ctx, x, axis, 0, size - k)
        x = emit.concat(ctx, [tail, head], axis)
    return x


# ---- pixel (un)shuffle --------------------------------------------------------------------
# PyTorch orders the packed channels as c * r^2 + (i * r + j); TFLite's DEPTH_TO_SPACE /
# SPACE_TO_DEPTH as (i * r + j) * C + c. A constant GATHER on the channel axis converts
# (skipped when C == 1, where both orders agree).


def _gather_channels(ctx, x_nhwc: Tensor, order: np.ndarray) -> Tensor:
    if np.array_equal(order, np.arange(len(order))):
        return x_nhwc
    return emit.op(
        ctx,
        "GATHER",
        [x_nhwc, emit.int32(ctx, order)],
        {"axis": 3, "batchDims": 0},
        shape=x_nhwc.shape,
        dtype=x_nhwc.dtype,
    )


def _require_4d(ctx, x: Tensor, name: str):
    if x.rank != 4:
        raise emit.unsupported(ctx, f"{name} on a rank-{x.rank} tensor", "Reshape to (N, C, H, W) first.")


@lowers(aten.pixel_shuffle.default)
def pixel_shuffle(ctx, x, upscale_factor):
    _require_4d(ctx, x, "pixel_shuffle")
    r = int(upscale_factor)
    n, c_in, h, w = x.shape
    c = c_in // (r * r)
    k = np.arange(c_in)
    x_nhwc = _gather_channels(ctx, layout.to_nhwc(ctx, x), (k % c) * r * r + k // c)
    y = emit.op(ctx, "DEPTH_TO_SPACE", [x_nhwc], {"blockSize": r}, shape=(n, h * r, w * r, c), dtype=x.dtype)
    return layout.to_nchw(ctx, y)


@lowers(aten.pixel_unshuffle.default)
def pixel_unshuffle(ctx, x, downscale_factor):
    _require_4d(ctx, x, "pixel_unshuffle")
    r = int(downscale_factor)
    n, c, h, w = x.shape
    y = emit.op(
        ctx,
        "SPACE_TO_DEPTH",
        [layout.to_nhwc(ctx, x)],
        {"blockSize": r},
        shape=(n, h // r, w // r, c * r * r),
        dtype=x.dtype,
    )
    t = np.arange(c * r * r)
    y = _gather_channels(ctx, y, (t % (r * r)) * c + t // (r * r))
    return layout.to_nchw(ctx, y)


@lowers(
    aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default, aten.feature_alpha_dropout.default
)
def dropout(ctx, x, p, train):
    """Inference dropout is the identity; training-mode dropout decomposes (random masks)."""
    if train and p > 0:
        raise NotImplementedError("dropout in training mode")
    return x


@lowers(aten.chunk.default)
def chunk(ctx, x, chunks, dim=0):
    size = x.shape[emit.normalize_dim(dim, x.rank)]
    if x.shape_signature is not None and x.shape_signature[emit.normalize_dim(dim, x.rank)] < 0:
        raise NotImplementedError("chunk along a dynamic dimension")
    return split(ctx, x, -(-size // chunks), dim)


@lowers(aten.to.device, aten.to.other)
def to_device(ctx, x, *args, **kwargs):
    return to_copy(ctx, x)


@lowers(aten.meshgrid.indexing, aten.meshgrid.default)
def meshgrid(ctx, tensors, indexing="ij"):
    """Each 1-D input reshaped onto its own axis and broadcast to the grid (numpy for
    constants). With indexing="xy" the first two axes of the grid are swapped."""
    if any(t.rank > 1 or t.is_dynamic for t in tensors):
        raise NotImplementedError("meshgrid of dynamic or non-1-D tensors")
    sizes = [t.shape[0] if t.rank else 1 for t in tensors]
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1:
        axes[0], axes[1] = 1, 0
    grid = [0] * len(tensors)
    for axis, size in zip(axes, sizes):
        grid[axis] = size
    outputs = []
    for t, axis in zip(tensors, axes):
        shape = [1] * len(grid)
        shape[axis] = grid[axis]
        if t.is_const:
            outputs.append(ctx.const(np.ascontiguousarray(np.broadcast_to(t.data.reshape(shape), grid))))
        else:
            column = emit.reshape(ctx, t, shape)
            outputs.append(
                emit.op(ctx, "BROADCAST_TO", [column, emit.int32(ctx, grid)], shape=tuple(grid), dtype=t.dtype)
            )
    return outputs
