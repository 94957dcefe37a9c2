"""Indexing: index_select, gather, advanced indexing (`x[idx]`), embedding, and assignment
(slice_scatter, select_scatter, index_put, copy: see the section at the end).

- index_select / embedding / a single index tensor -> GATHER along that axis.
- torch.gather (element-wise) -> GATHER_ND with full coordinates: the index tensor on
  `dim`, constant iotas on every other axis.
- several leading index tensors (`x[i, j]`) -> GATHER_ND with the broadcast indices
  stacked on a new last axis.
- several adjacent index tensors after full slices (`x[:, i, j]`) -> the indexed axes
  merged by a RESHAPE and one GATHER with the linear index `i * size_j + j`.
Constant indices are normalised here (negative -> from the end); boolean masks are
data-dependent and refused with a clear error.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _indices(ctx, index: Tensor, size: int) -> Tensor:
    """Index tensor ready for GATHER: constants wrapped into range, int32 when it fits."""
    if index.dtype == np.bool_:
        raise emit.unsupported(
            ctx,
            "boolean mask indexing (its output size depends on the data)",
            "Use torch.where(mask, x, other) to keep the shape static.",
        )
    if index.is_const:
        data = np.where(index.data < 0, index.data + size, index.data)
        return ctx.const(data.astype(np.int32))
    return index


def _gather(ctx, x: Tensor, index: Tensor, axis: int, final: bool = True) -> Tensor:
    index = _indices(ctx, index, x.shape[axis])
    options = {"axis": axis, "batchDims": 0}
    if final:
        return ctx.emit("GATHER", [x, index], options)
    shape = (*x.shape[:axis], *index.shape, *x.shape[axis + 1 :])
    return emit.op(ctx, "GATHER", [x, index], options, shape=shape, dtype=x.dtype)


@lowers(aten.index_select.default)
def index_select(ctx, x, dim, index):
    return _gather(ctx, x, index, emit.normalize_dim(dim, x.rank))


@lowers(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return _gather(ctx, weight, indices, 0)


@lowers(aten.one_hot.default)
def one_hot(ctx, x, num_classes=-1):
    """`x[..., None] == arange(num_classes)`, cast: EQUAL and CAST. Kept whole (not
    decomposed) because the decomposition asserts on the indices' values, which LiteRT
    cannot; an index outside [0, num_classes) gives a row of zeros where PyTorch raises."""
    if num_classes < 0:
        raise emit.unsupported(
            ctx, "one_hot without num_classes (its width is the data's maximum)", "Pass num_classes=N."
        )
    column = emit.reshape(ctx, x, (*x.shape, 1))
    classes = ctx.const(np.arange(num_classes, dtype=x.dtype))
    return emit.cast(ctx, emit.binary(ctx, "EQUAL", column, classes, dtype=np.bool_), ctx.out_dtype())


@lowers(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    """out[p] = x[p with p[dim] replaced by index[p]]: coordinates for GATHER_ND."""
    axis = emit.normalize_dim(dim, x.rank)
    if index.is_dynamic:
        return _gather_dynamic(ctx, x, axis, index)
    grids = np.indices(index.shape, dtype=np.int32)
    if index.is_const:
        grids[axis] = np.where(index.data < 0, index.data + x.shape[axis], index.data)
        coords = ctx.const(np.stack(list(grids), axis=-1))
    else:
        column_shape = (*index.shape, 1)
        columns = [
            emit.reshape(ctx, emit.cast(ctx, index, np.int32), column_shape)
            if a == axis
            else ctx.const(grids[a].reshape(column_shape))
            for a in range(x.rank)
        ]
        coords = emit.concat(ctx, columns, axis=index.rank)
    return ctx.emit("GATHER_ND", [x, coords])


def _gather_dynamic(ctx, x: Tensor, axis: int, index: Tensor) -> Tensor:
    """torch.gather with an index of dynamic shape: the coordinate of every other axis is
    an iota along that axis (a constant, or a RANGE when the axis itself is dynamic),
    broadcast at run time to the index's shape."""
    from converter.lowering import symbolic

    dims = [*ctx.meta.shape, 1]  # the output has the index's shape
    full_shape, full_sig = (*index.shape, 1), symbolic.signature_of(dims)
    target = symbolic.shape_tensor(ctx, dims)
    columns = []
    for a in range(x.rank):
        unit = [1] * (index.rank + 1)
        unit[a] = index.shape[a]
        if a == axis:
            column = emit.cast(ctx, index, np.int32)
            column = emit.op(ctx, "RESHAPE", [column, target], shape=full_shape, dtype=np.int32, signature=full_sig)
        elif index.shape_signature[a] != -1:
            column = ctx.const(np.arange(index.shape[a], dtype=np.int32).reshape(unit))
        else:
            size = emit.reshape(ctx, symbolic.sym_value(ctx, ctx.meta.shape[a]), ())
            iota = emit.op(
                ctx,
                "RANGE",
                [emit.scalar_like(ctx, 0, np.int32), size, emit.scalar_like(ctx, 1, np.int32)],
                shape=(index.shape[a],),
                dtype=np.int32,
                signature=(-1,),
            )
            unit_sig = [1] * (index.rank + 1)
            unit_sig[a] = -1
            column = emit.op(
                ctx,
                "RESHAPE",
                [iota, emit.int32(ctx, unit_sig)],
                {"newShape": unit_sig},
                shape=unit,
                dtype=np.int32,
                signature=tuple(unit_sig),
            )
        if a != axis:
            column = emit.op(
                ctx, "BROADCAST_TO", [column, target], shape=full_shape, dtype=np.int32, signature=full_sig
            )
        columns.append(column)
    return ctx.emit("GATHER_ND", [x, emit.concat(ctx, columns, axis=index.rank)])


@lowers(aten.index.Tensor)
def index(ctx, x, indices):
    """x[i0, i1, ...] with index tensors (None = full slice)."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) == 1:
        return _gather(ctx, x, indices[used[0]], used[0])
    if used != list(range(used[0], used[-1] + 1)):
        raise emit.unsupported(
            ctx,
            "advanced indexing with index tensors on axes that are not adjacent",
            "Index adjacent axes (x[:, i, j]), or use index_select / gather per axis.",
        )
    if used[0] > 0:
        return _index_adjacent_axes(ctx, x, indices, used)
    tensors = [_indices(ctx, indices[i], x.shape[i]) for i in used]
    shape = tuple(np.broadcast_shapes(*[t.shape for t in tensors]))
    if any(t.is_dynamic for t in tensors):
        return _index_leading_dynamic(ctx, x, tensors, len(shape))
    columns = []
    for t in tensors:
        t = emit.cast(ctx, t, np.int32)
        if t.shape != shape:
            t = (
                ctx.const(np.broadcast_to(t.data, shape))
                if t.is_const
                else emit.op(ctx, "BROADCAST_TO", [t, emit.int32(ctx, shape)], shape=shape, dtype=t.dtype)
            )
        columns.append(emit.reshape(ctx, t, (*shape, 1)))
    coords = emit.concat(ctx, columns, axis=len(shape))
    return ctx.emit("GATHER_ND", [x, coords])


def _index_leading_dynamic(ctx, x: Tensor, tensors: list[Tensor], rank: int) -> Tensor:
    """`_index` for index tensors of dynamic shape: their broadcast shape (the output's
    leading `rank` dims, possibly symbolic) is computed from the inputs' shapes."""
    from converter.lowering import symbolic

    dims = list(ctx.meta.shape[:rank])
    shape, sig = ctx.out_shape()[:rank], symbolic.signature_of(dims)
    column_dims = [*dims, 1]
    columns = []
    for t in tensors:
        t = emit.cast(ctx, t, np.int32)
        if t.shape_signature != sig or t.shape != shape:
            t = emit.op(
                ctx, "BROADCAST_TO", [t, symbolic.shape_tensor(ctx, dims)], shape=shape, dtype=np.int32, signature=sig
            )
        columns.append(
            emit.op(
                ctx,
                "RESHAPE",
                [t, symbolic.shape_tensor(ctx, column_dims)],
                shape=(*shape, 1),
                dtype=np.int32,
                signature=symbolic.signature_of(column_dims),
            )
        )
    return ctx.emit("GATHER_ND", [x, emit.concat(ctx, columns, axis=rank)])


def _index_adjacent_axes(ctx, x: Tensor, indices, used: list[int]) -> Tensor:
    """x[:, i, j] (adjacent index tensors after full slices): merge the indexed axes and
    GATHER with the linear index; the result keeps PyTorch's order (prefix, broadcast
    index shape, suffix)."""
    first, last = used[0], used[-1] + 1
    sizes = x.shape[first:last]
    strides = [int(np.prod(sizes[k + 1 :])) for k in range(len(sizes))]
    tensors = [_indices(ctx, indices[a], x.shape[a]) for a in used]
    if all(t.is_const for t in tensors):
        linear = ctx.const(
            sum(t.data.astype(np.int64) * stride for t, stride in zip(tensors, strides)).astype(np.int32)
        )
    else:
        linear = None
        for t, stride in zip(tensors, strides):
            term = emit.cast(ctx, t, np.int32)
            if stride != 1:
                term = emit.op(ctx, "MUL", [term, ctx.const(np.int32(stride))], shape=term.shape, dtype=np.int32)
            if linear is not None:
                shape = tuple(np.broadcast_shapes(linear.shape, term.shape))
                term = emit.op(ctx, "ADD", [linear, term], shape=shape, dtype=np.int32)
            linear = term
    merged = emit.reshape(ctx, x, (*x.shape[:first], int(np.prod(sizes)), *x.shape[last:]))
    return ctx.emit("GATHER", [merged, linear], {"axis": first, "batchDims": 0})


# ---- writes into a copy: slice/select/index assignment ---------------------------------------
# Functionalized in-place assignment (`x[:, a:b] = y`, `x[..., i] = y`, `x[idx] = y`,
# `index_put_`, `copy_` into a view) arrives as slice_scatter / select_scatter /
# index_put / copy. When every input is a constant (masks and position tables built in
# forward) the result is computed here and stored; otherwise it becomes LiteRT ops.


def _static(ctx, x: Tensor, what: str) -> None:
    if x.is_dynamic:
        raise emit.unsupported(
            ctx, f"{what} into a tensor of dynamic shape", "Export with static shapes for this part of the model."
        )


def _broadcast_to(ctx, t: Tensor, shape) -> Tensor:
    shape = tuple(int(d) for d in shape)
    if t.shape == shape:
        return t
    if int(np.prod(t.shape)) == int(np.prod(shape)) and len(t.shape) != len(shape):
        return emit.reshape(ctx, t, shape)  # a 0-d value some lowering kept as (1,)
    if t.is_const:
        return ctx.const(np.broadcast_to(t.data, shape).copy())
    return emit.op(ctx, "BROADCAST_TO", [t, emit.int32(ctx, shape)], shape=shape, dtype=t.dtype)


@lowers(aten.copy.default)
def copy(ctx, x, src, non_blocking=False):
    """x.copy_(src): src, cast to x's dtype and broadcast to x's shape."""
    _static(ctx, x, "copy_")
    return _broadcast_to(ctx, emit.as_tensor(ctx, src, x.dtype), x.shape)


@lowers(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] (along `dim`) replaced by src.
    Step 1: CONCATENATION of the kept slices and src; other steps: one GATHER from
    CONCATENATION([x, src]) with constant positions."""
    _static(ctx, x, "slice assignment")
    axis = emit.normalize_dim(dim, x.rank)
    size = x.shape[axis]
    start, stop, step = slice(start, end, step).indices(size)
    src = _broadcast_to(
        ctx, emit.as_tensor(ctx, src, x.dtype), (*x.shape[:axis], len(range(start, stop, step)), *x.shape[axis + 1 :])
    )
    if x.is_const and src.is_const:
        out = x.data.copy()
        out[(slice(None),) * axis + (slice(start, stop, step),)] = src.data
        return ctx.const(out)
    if step == 1:
        parts = [emit.slice_axis(ctx, x, axis, 0, start)] if start > 0 else []
        parts.append(src)
        if stop < size:
            parts.append(emit.slice_axis(ctx, x, axis, stop, size))
        return emit.concat(ctx, parts, axis)
    positions = np.arange(size, dtype=np.int32)
    positions[start:stop:step] = size + np.arange(src.shape[axis], dtype=np.int32)
    return ctx.emit("GATHER", [emit.concat(ctx, [x, src], axis), ctx.const(positions)], {"axis": axis, "batchDims": 0})


@lowers(aten.select_scatter.default)
def select_scatter(ctx, x, src, dim, index):
    """x with x.select(dim, index) replaced by src: a slice_scatter of one position."""
    axis = emit.normalize_dim(dim, x.rank)
    index = index + x.shape[axis] if index < 0 else index
    src = emit.as_tensor(ctx, src, x.dtype)
    src = emit.reshape(
        ctx, _broadcast_to(ctx, src, x.shape[:axis] + x.shape[axis + 1 :]), (*x.shape[:axis], 1, *x.shape[axis + 1 :])
    )
    return slice_scatter(ctx, x, src, axis, index, index + 1, 1)


@lowers(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    """x[indices] = values (or += with accumulate). Constant indices (integer or boolean):
    the written positions are known now, one SCATTER_ND of the values then SELECT_V2
    (ADD when accumulating). Index tensors computed at run time on the leading axes:
    SCATTER_ND with their coordinates. A run-time boolean mask with one value: SELECT_V2."""
    _static(ctx, x, "index assignment")
    values = emit.as_tensor(ctx, values, x.dtype)
    indices = list(indices) + [None] * (x.rank - len(indices))
    if all(i is None or i.is_const for i in indices):
        positions = np.arange(int(np.prod(x.shape))).reshape(x.shape)[
            tuple(slice(None) if i is None else np.asarray(i.data) for i in indices)
        ]
        if x.is_const and values.is_const:
            out = x.data.copy().reshape(-1)
            update = np.broadcast_to(values.data, positions.shape).reshape(-1)
            if accumulate:
                np.add.at(out, positions.reshape(-1), update)
            else:
                out[positions.reshape(-1)] = update
            return ctx.const(out.reshape(x.shape))
        if not accumulate and len(np.unique(positions)) != positions.size:
            raise emit.unsupported(
                ctx,
                "index assignment writing one position twice (PyTorch leaves the result undefined)",
                "Use distinct indices, or accumulate=True.",
            )
        written = np.zeros(int(np.prod(x.shape)), dtype=bool)
        written[positions.reshape(-1)] = True
        coords = ctx.const(np.stack(np.unravel_index(positions, x.shape), axis=-1).astype(np.int32))
        return _scatter(
            ctx, x, coords, _broadcast_to(ctx, values, positions.shape), accumulate, ctx.const(written.reshape(x.shape))
        )
    used = [k for k, i in enumerate(indices) if i is not None]
    if len(used) == 1 and indices[used[0]].dtype == np.bool_ and used[0] == 0 and int(np.prod(values.shape)) == 1:
        return _masked_fill(ctx, x, indices[0], values, accumulate)
    if used != list(range(used[0], used[-1] + 1)) or any(indices[k].dtype == np.bool_ for k in used):
        raise emit.unsupported(
            ctx,
            "index assignment with run-time boolean masks, or index tensors on axes that are not adjacent",
            "Index adjacent axes (x[:, i, j] = v), or use torch.where.",
        )
    coords = _coordinates(ctx, x, indices, used)
    return _scatter(ctx, x, coords, _broadcast_to(ctx, values, coords.shape[:-1]), accumulate, None)


def _coordinates(ctx, x: Tensor, indices, used: list[int]) -> Tensor:
    """Coordinates (*region, rank) of every position x[indices] writes, for adjacent index
    tensors on axes `used` (full slices elsewhere): the region is x's shape with the
    indexed axes replaced by the index tensors' broadcast shape (PyTorch's order);
    negative indices wrap."""
    first, last = used[0], used[-1] + 1
    index_shape = tuple(np.broadcast_shapes(*[indices[k].shape for k in used]))
    region = (*x.shape[:first], *index_shape, *x.shape[last:])
    middle = [1] * len(index_shape)
    columns = []
    for axis in range(x.rank):
        if first <= axis < last:
            t = emit.cast(ctx, indices[axis], np.int32)
            t = emit.op(ctx, "FLOOR_MOD", [t, ctx.const(np.int32(x.shape[axis]))], shape=t.shape, dtype=np.int32)
            t = emit.reshape(
                ctx, _broadcast_to(ctx, t, index_shape), (*[1] * first, *index_shape, *[1] * (x.rank - last))
            )
        else:  # a full slice: the position along that axis
            unit = [1] * first + middle + [1] * (x.rank - last)
            at = axis if axis < first else axis - (last - first) + len(index_shape)
            unit[at] = x.shape[axis]
            t = ctx.const(np.arange(x.shape[axis], dtype=np.int32).reshape(unit))
        columns.append(emit.reshape(ctx, _broadcast_to(ctx, t, region), (*region, 1)))
    return emit.concat(ctx, columns, axis=len(region))


def _scatter(ctx, x: Tensor, coords: Tensor, updates: Tensor, accumulate: bool, written: Tensor | None) -> Tensor:
    """x with `updates` written (or added) at `coords`; `written` is the constant mask of
    positions written, None to compute it with a second SCATTER_ND."""
    shape = emit.int32(ctx, x.shape)
    scattered = emit.op(ctx, "SCATTER_ND", [coords, updates, shape], shape=x.shape, dtype=x.dtype)
    if accumulate:
        return ctx.emit("ADD", [x, scattered], {"fusedActivationFunction": "NONE"})
    if written is None:
        ones = ctx.const(np.ones(updates.shape, dtype=np.float32))
        hits = emit.op(ctx, "SCATTER_ND", [coords, ones, shape], shape=x.shape, dtype=np.float32)
        written = emit.op(ctx, "GREATER", [hits, ctx.const(np.float32(0))], shape=x.shape, dtype=np.bool_)
        scattered = _mean_of_duplicates(ctx, scattered, hits)
    return ctx.emit("SELECT_V2", [written, scattered, x])


def _mean_of_duplicates(ctx, scattered: Tensor, hits: Tensor) -> Tensor:
    """SCATTER_ND adds the updates of a position written twice; a run-time index tensor
    may repeat one (max_unpool after overlapping windows writes one input's maximum once
    per window). Dividing by the count keeps such equal writes exact (PyTorch leaves
    unequal ones undefined)."""
    if scattered.dtype == np.bool_:
        return scattered
    count = emit.cast(ctx, emit.binary(ctx, "MAXIMUM", hits, ctx.const(np.float32(1))), scattered.dtype)
    divide = "DIV" if np.issubdtype(scattered.dtype, np.floating) else "FLOOR_DIV"
    return emit.binary(ctx, divide, scattered, count)


def _masked_fill(ctx, x: Tensor, mask: Tensor, value: Tensor, accumulate: bool) -> Tensor:
    """x[mask] = value (one value) over x's leading axes: SELECT_V2."""
    mask = emit.reshape(ctx, mask, (*mask.shape, *[1] * (x.rank - mask.rank)))
    value = emit.reshape(ctx, value, ())
    if accumulate:
        added = emit.op(
            ctx, "SELECT_V2", [mask, value, emit.scalar_like(ctx, 0, x.dtype)], shape=mask.shape, dtype=x.dtype
        )
        return ctx.emit("ADD", [x, added], {"fusedActivationFunction": "NONE"})
    return ctx.emit("SELECT_V2", [mask, value, x])
