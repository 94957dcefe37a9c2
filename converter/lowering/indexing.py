"""Indexing: index_select, gather, advanced indexing (`x[idx]`) and embedding.

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
        raise emit.unsupported(ctx, "boolean mask indexing (its output size depends on the data)",
                               "Use torch.where(mask, x, other) to keep the shape static.")
    if index.is_const:
        data = np.where(index.data < 0, index.data + size, index.data)
        return ctx.const(data.astype(np.int32))
    return index


def _gather(ctx, x: Tensor, index: Tensor, axis: int, final: bool = True) -> Tensor:
    index = _indices(ctx, index, x.shape[axis])
    options = {"axis": axis, "batchDims": 0}
    if final:
        return ctx.emit("GATHER", [x, index], options)
    shape = (*x.shape[:axis], *index.shape, *x.shape[axis + 1:])
    return emit.op(ctx, "GATHER", [x, index], options, shape=shape, dtype=x.dtype)


@lowers(aten.index_select.default)
def index_select(ctx, x, dim, index):
    return _gather(ctx, x, index, emit.normalize_dim(dim, x.rank))


@lowers(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return _gather(ctx, weight, indices, 0)


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
        columns = [emit.reshape(ctx, emit.cast(ctx, index, np.int32), column_shape) if a == axis
                   else ctx.const(grids[a].reshape(column_shape)) for a in range(x.rank)]
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
            iota = emit.op(ctx, "RANGE", [emit.scalar_like(ctx, 0, np.int32), size, emit.scalar_like(ctx, 1, np.int32)],
                           shape=(index.shape[a],), dtype=np.int32, signature=(-1,))
            unit_sig = [1] * (index.rank + 1)
            unit_sig[a] = -1
            column = emit.op(ctx, "RESHAPE", [iota, emit.int32(ctx, unit_sig)], {"newShape": unit_sig},
                             shape=unit, dtype=np.int32, signature=tuple(unit_sig))
        if a != axis:
            column = emit.op(ctx, "BROADCAST_TO", [column, target], shape=full_shape, dtype=np.int32, signature=full_sig)
        columns.append(column)
    return ctx.emit("GATHER_ND", [x, emit.concat(ctx, columns, axis=index.rank)])


@lowers(aten.index.Tensor)
def index(ctx, x, indices):
    """x[i0, i1, ...] with index tensors (None = full slice)."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) == 1:
        return _gather(ctx, x, indices[used[0]], used[0])
    if used != list(range(used[0], used[-1] + 1)):
        raise emit.unsupported(ctx, "advanced indexing with index tensors on axes that are not adjacent",
                               "Index adjacent axes (x[:, i, j]), or use index_select / gather per axis.")
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
            t = ctx.const(np.broadcast_to(t.data, shape)) if t.is_const else \
                emit.op(ctx, "BROADCAST_TO", [t, emit.int32(ctx, shape)], shape=shape, dtype=t.dtype)
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
            t = emit.op(ctx, "BROADCAST_TO", [t, symbolic.shape_tensor(ctx, dims)], shape=shape, dtype=np.int32,
                        signature=sig)
        columns.append(emit.op(ctx, "RESHAPE", [t, symbolic.shape_tensor(ctx, column_dims)], shape=(*shape, 1),
                               dtype=np.int32, signature=symbolic.signature_of(column_dims)))
    return ctx.emit("GATHER_ND", [x, emit.concat(ctx, columns, axis=rank)])


def _index_adjacent_axes(ctx, x: Tensor, indices, used: list[int]) -> Tensor:
    """x[:, i, j] (adjacent index tensors after full slices): merge the indexed axes and
    GATHER with the linear index; the result keeps PyTorch's order (prefix, broadcast
    index shape, suffix)."""
    first, last = used[0], used[-1] + 1
    sizes = x.shape[first:last]
    strides = [int(np.prod(sizes[k + 1:])) for k in range(len(sizes))]
    tensors = [_indices(ctx, indices[a], x.shape[a]) for a in used]
    if all(t.is_const for t in tensors):
        linear = ctx.const(sum(t.data.astype(np.int64) * stride for t, stride in zip(tensors, strides)).astype(np.int32))
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
