"""Ordering: topk, sort and argsort, all through TOPK_V2; bucketize by counting.

LiteRT has one ordering builtin, TOPK_V2: the k largest values along the LAST axis, in
descending order, ties broken by the lower index first, with int32 indices. So:
- another axis is moved last with a TRANSPOSE (and back);
- smallest-first (topk(largest=False), ascending sort) is TOPK_V2 of -x, negated back;
- sort is a TOPK_V2 with k = the axis length; argsort (which decomposes to sort) keeps
  only the indices;
- indices are cast to int64, PyTorch's dtype.
Boolean tensors are refused (TOPK_V2 has no boolean kernel). XNNPACK does not delegate
TOPK_V2: it runs on LiteRT's builtin kernel.

`bucketize(x, boundaries)` (sorted 1-D boundaries) is the number of boundaries below each
value (at or below with `right=True`): GREATER(_EQUAL) against the boundaries on a new last
axis, CAST, SUM. No search op needed; the cost is one comparison per boundary (SmolVLM's
patch-position buckets: a few dozen).
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _top(ctx, x: Tensor, k: int, dim: int, largest: bool) -> tuple[Tensor, Tensor]:
    """(values, int64 indices) of the k largest (or smallest) entries along `dim`, in order."""
    if x.dtype == np.bool_:
        raise emit.unsupported(ctx, "topk/sort of a boolean tensor", "Cast it to an integer or float dtype first.")
    if x.is_dynamic:
        raise emit.unsupported(
            ctx,
            "topk/sort of a tensor with dynamic dimensions",
            "Export with static shapes for this part of the model.",
        )
    axis = emit.normalize_dim(dim, x.rank) if x.rank else 0
    if x.rank == 0:
        x = emit.reshape(ctx, x, (1,))
    perm = list(range(x.rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = emit.transpose(ctx, x, perm)
    if not largest:
        moved = emit.unary(ctx, "NEG", moved)
    shape = (*moved.shape[:-1], k)
    values, indices = ctx.emit("TOPK_V2", [moved, emit.int32(ctx, k)], shape=shape, dtype=moved.dtype, num_outputs=2)
    indices.dtype = np.dtype(np.int32)
    if not largest:
        values = emit.unary(ctx, "NEG", values)
    values = emit.transpose(ctx, values, perm)
    indices = emit.cast(ctx, emit.transpose(ctx, indices, perm), np.int64)
    return values, indices


@lowers(aten.topk.default)
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    values, indices = _top(ctx, x, int(k), dim, bool(largest))
    return emit.reshape(ctx, values, ctx.out_shape(0)), emit.reshape(ctx, indices, ctx.out_shape(1))


@lowers(aten.sort.default)
def sort(ctx, x, dim=-1, descending=False):
    length = x.shape[emit.normalize_dim(dim, x.rank)] if x.rank else 1
    values, indices = _top(ctx, x, length, dim, bool(descending))
    return emit.reshape(ctx, values, ctx.out_shape(0)), emit.reshape(ctx, indices, ctx.out_shape(1))


@lowers(aten.sort.stable)
def sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    # TOPK_V2 keeps equal values in index order whichever the direction: a stable sort.
    return sort(ctx, x, dim, descending)


@lowers(aten.bucketize.Tensor)
def bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    if boundaries.rank != 1:
        raise emit.unsupported(ctx, "bucketize with boundaries of rank != 1", "Pass 1-D sorted boundaries.")
    values = emit.reshape(ctx, x, (*x.shape, 1))
    below = emit.binary(ctx, "GREATER_EQUAL" if right else "GREATER", values, boundaries, dtype=np.dtype(np.bool_))
    count = emit.reduce(ctx, "SUM", emit.cast(ctx, below, np.int32), [x.rank], keep_dims=False)
    return emit.cast(ctx, count, np.int32 if out_int32 else np.int64)
