"""Indexing: advanced indexing, gather/scatter families, index_* ops, embeddings, scatters.

In ATen's `index`/`index_put`, a None in the index list means "the whole dim" (a
slice), not a new axis; NumPy's advanced-indexing rules then match PyTorch's,
including moving the indexed dims to the front when advanced indices are separated.

Data-dependent shapes: `nonzero`, `masked_select` and indexing with a bool mask have
an output size that depends on tensor values, so they read values on the host (a
sync) and cannot be traced by `jax.jit`. `nonzero` and `masked_select` are in
`DATA_DEPENDENT`; `index`/`index_put` are in `DATA_DEPENDENT_WHEN`, with a predicate
that is true only for bool-mask indices (integer indexing stays jitted).
`x[mask] = scalar` is rewritten as a `where` and never syncs.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_backend.ops._common import canonical_dim, is_array, is_floating, require_shape
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _is_bool_index(index) -> bool:
    """True for bool masks, given as JAX arrays or (in predicates) torch tensors."""
    return index is not None and index.dtype in (jnp.bool_, torch.bool)


def _index_tuple(indices):
    """ATen's index list as a NumPy index: None -> ':'; bool masks -> integer arrays (host)."""
    converted = []
    for index in indices:
        if index is None:
            converted.append(slice(None))
        elif _is_bool_index(index):
            if not isinstance(index, (np.ndarray,)) and not _is_concrete(index):
                raise TypeError(
                    "indexing with a bool mask has a data-dependent shape; the tpu device runs such "
                    "aten.index/index_put calls eagerly (DATA_DEPENDENT_WHEN) - it was traced instead"
                )
            converted.extend(jnp.nonzero(index))
        else:
            converted.append(index)
    return tuple(converted)


def _is_concrete(array) -> bool:
    try:
        np.asarray(array)
        return True
    except Exception:  # a tracer
        return False


def _has_bool_index(args, kwargs) -> bool:
    """Predicate for DATA_DEPENDENT_WHEN: an index list holding a bool mask."""
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(_is_bool_index(i) for i in indices if i is not None and hasattr(i, "dtype"))


def _mask_put_needs_host(args, kwargs) -> bool:
    """index_put with a bool mask syncs unless it is `x[mask] = one value` (a where)."""
    if not _has_bool_index(args, kwargs):
        return False
    return _single_mask_fill(args[0], args[1], args[2] if len(args) > 2 else kwargs["values"]) is None


@lowers(aten.index.Tensor, data_dependent_when=_has_bool_index)
def index(x, indices):
    return x[_index_tuple(indices)]


def _single_mask_fill(x, indices, values):
    """The broadcast bool mask when index_put is `x[mask] = scalar`, else None."""
    present = [i for i in indices if i is not None]
    if len(present) != 1 or not _is_bool_index(present[0]) or indices[0] is None or math.prod(values.shape) != 1:
        return None
    mask = present[0]
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


@lowers(aten.index_put.default, aten._index_put_impl.default, data_dependent_when=_mask_put_needs_host)
def index_put(x, indices, values, accumulate=False, unsafe=False):
    if accumulate and x.dtype == jnp.bool_:
        return _accumulating_bools(index_put)(x, indices, values, True, values_at=1)
    mask = _single_mask_fill(x, indices, values)
    values = values.astype(x.dtype)
    if mask is not None:
        fill = values.reshape(())
        return jnp.where(mask, x + fill if accumulate else fill, x)
    where = _index_tuple(indices)
    try:
        return x.at[where].add(values) if accumulate else x.at[where].set(values)
    except ValueError:  # (JAX's broadcasting error; ATen's words)
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing result "
            f"of shape {list(x[where].shape)}"
        ) from None


@lowers(aten.index_select.default)
def index_select(x, dim, index):
    if index.ndim > 1:
        raise IndexError(f"aten.index_select: index must be a vector, got shape {list(index.shape)}")
    if x.ndim == 0:  # ATen: a scalar indexed by its only position stays a scalar
        return x
    return jnp.take(x, index.reshape(-1), axis=canonical_dim(dim, x.ndim))


def _accumulating_bools(lowering):
    """A lowering that accumulates into `x` (its first argument) from the values at position
    `values_at` of the arguments after it, taking bools as ATen does: as integers read back as
    bools, so a sum is an or, a product an and, a max an or (JAX's scatter-add and -multiply
    refuse bools)."""

    def accumulate(x, *args, values_at: int, **kwargs):
        if x.dtype != jnp.bool_:
            return lowering(x, *args, **kwargs)
        args = list(args)
        if is_array(args[values_at]):
            args[values_at] = args[values_at].astype(jnp.int32)
        return lowering(x.astype(jnp.int32), *args, **kwargs) != 0

    return accumulate


def _along(x, dim, index):
    """NumPy index that puts `index` on `dim` and takes everything else whole."""
    return (slice(None),) * canonical_dim(dim, x.ndim) + (index,)


def _index_source(op: str, x, dim, index, source):
    """index_add/index_copy's source, which ATen requires to be x's shape with `index.size`
    positions on `dim` (or one element for a 0-dim x, or a scalar for one index)."""
    expected = list(x.shape)
    if expected:
        expected[canonical_dim(dim, x.ndim)] = index.size
    if source.size == math.prod(expected) == 1 and source.ndim <= 1:
        return source
    require_shape(op, "source", source.shape, expected)
    return source


def _on_dim(update, x, dim, index, values):
    """`x.at[index on dim]` updated by `update(ref, values)`; a 0-dim x acts as 1-element."""
    flat = x.reshape(1) if x.ndim == 0 else x
    values = values if not hasattr(values, "ndim") or x.ndim else jnp.reshape(values, (-1,))
    return update(flat.at[_along(flat, dim, index.reshape(-1))], values).reshape(x.shape)


@lowers(aten.index_add.default)
def index_add(x, dim, index, source, *, alpha=1):
    source = _index_source("index_add", x, dim, index, source)
    return _accumulating_bools(_index_add)(x, dim, index, source, alpha, values_at=2)


def _index_add(x, dim, index, source, alpha):
    return _on_dim(lambda ref, v: ref.add(v), x, dim, index, (source * alpha).astype(x.dtype))


@lowers(aten.index_copy.default)
def index_copy(x, dim, index, source):
    source = _index_source("index_copy", x, dim, index, source)
    return _on_dim(lambda ref, v: ref.set(v), x, dim, index, source.astype(x.dtype))


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    return _on_dim(lambda ref, v: ref.set(v), x, dim, index, jnp.asarray(value).astype(x.dtype).reshape(()))


def _scatter_grid(index, dim, x, src=None):
    """Full coordinates for gather/scatter: `index` on `dim`, iotas elsewhere. ATen requires
    `index` no larger than `x` off `dim` (and than `src` everywhere): JAX would clamp the
    coordinates past x's end (a gather) or drop them (a scatter), with no error."""
    if max(index.ndim, 1) != max(x.ndim, 1) or any(
        i > n for d, (i, n) in enumerate(zip(index.shape, x.shape)) if d != canonical_dim(dim, max(x.ndim, 1))
    ):
        raise RuntimeError(
            f"gather/scatter: index of shape {list(index.shape)} does not fit x of shape {list(x.shape)}"
        )
    if (
        is_array(src)
        and src.ndim
        and (max(src.ndim, 1) != max(index.ndim, 1) or any(i > n for i, n in zip(index.shape, src.shape)))
    ):
        raise RuntimeError(f"scatter: index of shape {list(index.shape)} is larger than src of shape {list(src.shape)}")
    axis = canonical_dim(dim, max(index.ndim, 1))
    return tuple(index if d == axis else lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim))


@lowers(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    if index.size == 0:  # ATen allows any shape of empty index
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    if index.ndim == 0:  # (ATen takes a 0-dim index as one element)
        return gather(x, dim, index.reshape(1)).reshape(())
    return x[_scatter_grid(index, dim, x)]


def _source_values(src, index, dtype):
    if not is_array(src) or src.ndim == 0:
        return jnp.broadcast_to(jnp.asarray(src, dtype), index.shape)
    return src[tuple(slice(0, s) for s in index.shape)].astype(dtype)  # src may be larger than index


_SCATTER_REDUCE_ALIASES = {"add": "sum", "multiply": "prod"}


def _scatter(x, dim, index, src, reduce=None):
    if reduce is not None and x.dtype == jnp.bool_:
        return _accumulating_bools(_scatter)(x, dim, index, src, reduce, values_at=2)
    if index.size == 0:  # ATen allows any shape of empty index: nothing is written
        return x
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(-1)
        return _scatter(x, 0, index, src if not is_array(src) else src.reshape(-1), reduce).reshape(())
    if index.ndim == 0:  # (ATen takes a 0-dim index, and src, as one element)
        return _scatter(x, dim, index.reshape(1), src.reshape(-1) if is_array(src) else src, reduce)
    target = x.at[_scatter_grid(index, dim, x, src)]
    values = _source_values(src, index, x.dtype)
    if reduce is None:
        return target.set(values)
    reduce = _SCATTER_REDUCE_ALIASES.get(reduce, reduce)
    if reduce == "sum":
        return target.add(values)
    if reduce == "prod":
        return target.multiply(values)
    raise ValueError(f"aten.scatter: reduce must be 'add' or 'multiply', got {reduce!r}")


@lowers(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src)


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@lowers(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum")


def _reduction_identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    lowest, highest = (-jnp.inf, jnp.inf) if is_floating(dtype) else (jnp.iinfo(dtype).min, jnp.iinfo(dtype).max)
    return lowest if reduce == "amax" else highest


@lowers(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if x.dtype == jnp.bool_:
        return _accumulating_bools(scatter_reduce)(x, dim, index, src, reduce, values_at=2, include_self=include_self)
    if index.size == 0:
        return x
    if x.ndim == 0:
        return scatter_reduce(
            x.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce, include_self=include_self
        ).reshape(())
    if index.ndim == 0:
        return scatter_reduce(x, dim, index.reshape(1), src.reshape(-1), reduce, include_self=include_self)
    grid = _scatter_grid(index, dim, x, src)
    values = _source_values(src, index, x.dtype)
    touched = jnp.zeros(x.shape, jnp.bool_).at[grid].set(True)
    start = x if include_self else jnp.where(touched, jnp.asarray(_reduction_identity(reduce, x.dtype), x.dtype), x)
    target = start.at[grid]
    if reduce == "sum":
        return target.add(values)
    if reduce == "prod":
        return target.multiply(values)
    if reduce == "amax":
        return target.max(values)
    if reduce == "amin":
        return target.min(values)
    if reduce == "mean":
        counts = jnp.zeros(x.shape, jnp.int64).at[grid].add(1) + (1 if include_self else 0)
        total = target.add(values)
        mean = (
            total / jnp.maximum(counts, 1) if is_floating(x.dtype) else jnp.floor_divide(total, jnp.maximum(counts, 1))
        )
        return jnp.where(counts > 0, mean, x).astype(x.dtype)
    raise ValueError(f"aten.scatter_reduce: reduce must be sum, prod, mean, amax or amin, got {reduce!r}")


@lowers(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """scatter_reduce with the 1-d `index` spread along `dim` of `source`."""
    if x.ndim == 0:
        return index_reduce(x.reshape(1), 0, index, source.reshape(-1), reduce, include_self=include_self).reshape(())
    axis = canonical_dim(dim, x.ndim)
    shape = [1] * source.ndim
    shape[axis] = index.shape[0]
    full_index = jnp.broadcast_to(index.reshape(shape), source.shape)
    return scatter_reduce(x, axis, full_index, source, reduce, include_self=include_self)


@lowers(aten.take.default)
def take(x, index):
    return x.reshape(-1)[index]


@lowers(aten.put.default)
def put(x, index, source, accumulate=False):
    if accumulate and x.dtype == jnp.bool_:
        return _accumulating_bools(put)(x, index, source, True, values_at=1)
    if source.size != index.size:
        raise IndexError(
            "put_(): Expected source and index to have the same number of elements, but got source.numel() = "
            f"{source.size}, index.numel() = {index.size}"
        )
    flat = x.reshape(-1).at[index.reshape(-1)]
    values = source.reshape(-1).astype(x.dtype)
    return (flat.add(values) if accumulate else flat.set(values)).reshape(x.shape)


@lowers(aten.masked_select.default, data_dependent=True)
def masked_select(x, mask):
    """Data-dependent size: runs eagerly on concrete arrays (a host sync)."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    return jnp.broadcast_to(x, shape)[np.asarray(jnp.broadcast_to(mask, shape))]


@lowers(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    # The k-th True position takes source's k-th element: a cumulative count, no sync.
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    mask = jnp.broadcast_to(mask, shape)
    if source.size == 0:  # nothing to write (ATen requires as many source elements as True)
        return jnp.broadcast_to(x, shape)
    positions = jnp.cumsum(mask.reshape(-1)) - 1
    picked = source.reshape(-1)[jnp.clip(positions, 0, max(source.size - 1, 0))].reshape(shape)
    return jnp.where(mask, picked.astype(x.dtype), jnp.broadcast_to(x, shape))


@lowers(aten.nonzero.default, data_dependent=True)
def nonzero(x):
    """Data-dependent size: runs eagerly on concrete arrays (a host sync)."""
    host = np.asarray(x)
    if host.ndim == 0:  # one (empty) coordinate when the scalar is nonzero
        return jnp.zeros((int(host != 0), 0), jnp.int64)
    return jnp.asarray(np.stack(np.nonzero(host), axis=1).astype(np.int64)).reshape(-1, x.ndim)


@lowers(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if x.size == 0:  # no nonzero: every row is padding (jnp.nonzero pads with 0 here)
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(jnp.int64) if coords else jnp.zeros((size, 0), jnp.int64)


# --- scatters of slices (the functional forms of writes through views) -----------------------


@lowers(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    axis = canonical_dim(dim, x.ndim)
    return _scatter_into(x, _along(x, axis, index % x.shape[axis]), src, "select_scatter")


@lowers(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    axis = canonical_dim(dim, x.ndim)
    return _scatter_into(x, _along(x, axis, slice(start, end, step)), src, "slice_scatter")


def _scatter_into(x, where: tuple, src, op: str):
    """`x` with `src` written at the basic index `where`, whose shape ATen requires of it."""
    require_shape(op, "src", src.shape, np.broadcast_to(np.int8(0), x.shape)[where].shape)
    return x.at[where].set(src.astype(x.dtype))


# The backwards of `select` and `slice` (autograd's, e.g. of `MultiheadAttention`'s packed
# q/k/v projection): ATen's kernels allocate zeros and copy through a view, three device
# calls and a scatter each; as one op they are one call (one node in a fused graph).
@lowers(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    return select_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, dim, index)


@lowers(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, dim, start, end, step)


def _diagonal_coordinates(shape, offset, dim1, dim2):
    rows, cols = shape[dim1], shape[dim2]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    start_row, start_col = max(-offset, 0), max(offset, 0)
    return np.arange(length) + start_row, np.arange(length) + start_col


@lowers(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim)
    rows, cols = _diagonal_coordinates(x.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    require_shape("diagonal_scatter", "src", src.shape, (*moved.shape[:-2], len(rows)))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


def strided_positions(size, stride, storage_offset):
    """Flat storage positions of an as_strided view, in the view's shape."""
    positions = np.full(tuple(size), storage_offset or 0, np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        positions = positions + (np.arange(n) * s).reshape(shape)
    return positions


@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """Treats `x` as contiguous storage, as the functional form of a view write does."""
    positions = strided_positions(size, stride, storage_offset)
    if positions.size and positions.max() >= x.size:  # (JAX would drop those writes)
        itemsize = np.dtype(x.dtype).itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {storage_offset or 0}, and "
            f"itemsize {itemsize} requiring a storage size of {(int(positions.max()) + 1) * itemsize} are out of "
            f"bounds for storage of size {x.size * itemsize}"
        )
    require_shape("as_strided_scatter", "src", src.shape, positions.shape)
    return x.reshape(-1).at[positions].set(src.astype(x.dtype)).reshape(x.shape)


# --- embeddings -------------------------------------------------------------------------------


@lowers(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowers(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows named in `indices` whose p-norm exceeds max_norm are scaled to max_norm (ATen's
    `max_norm / (norm + 1e-7)`); the in-place `embedding_renorm_` of `F.embedding(max_norm=)`
    derives from this."""
    named = jnp.zeros((weight.shape[0],), bool).at[indices.reshape(-1)].set(True)
    rows = weight.astype(jnp.float32)
    magnitudes = jnp.abs(rows)  # norm_type arrives as a traced float: the p-norm by hand
    p_norms = jnp.sum(magnitudes**norm_type, axis=1) ** (1 / norm_type)
    norms = jnp.where(jnp.isinf(norm_type), jnp.max(magnitudes, axis=1), p_norms)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (rows * scale[:, None]).astype(weight.dtype)


@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grads = grad_output.reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        grads = jnp.where((flat == padding_idx)[:, None], 0, grads)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grads.dtype).at[flat].add(1)
        grads = grads / counts[flat][:, None]
    return jnp.zeros((num_weights, grads.shape[1]), grad_output.dtype).at[flat].add(grads)


# --- embedding_bag: bags of embedding rows reduced by sum (0), mean (1) or max (2) ------------
# The auxiliary outputs (offset2bag, bag_size, max_indices) feed only this file's backward.

_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bags(indices, offsets, include_last_offset):
    """(bag of each index, number of bags)."""
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = jnp.arange(indices.shape[0])
    owner = jnp.searchsorted(offsets, positions, side="right") - 1
    return jnp.clip(owner, 0, max(bags - 1, 0)), bags


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices); padding_idx entries are left out of every
    bag (and of the mean's count); empty bags give zeros."""
    owner, bags = _bags(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    rows = jnp.take(weight, indices, axis=0)
    if mode != _BAG_MAX and rows.dtype in (jnp.bfloat16, jnp.float16):
        rows = rows.astype(jnp.float32)  # sums and means accumulate in float32, rounded once at the end
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    size = jnp.zeros((bags,), jnp.int64).at[owner].add(valid.astype(jnp.int64))
    max_indices = jnp.zeros((bags, weight.shape[1]), jnp.int64)
    if mode == _BAG_MAX:
        lowest = jnp.asarray(-jnp.inf, rows.dtype)
        masked = jnp.where(valid[:, None], rows, lowest)
        output = jnp.full((bags, weight.shape[1]), lowest).at[owner].max(masked)
        # the first index (in bag order) reaching the maximum, as ATen's loop keeps
        is_max = valid[:, None] & (masked == output[owner])
        order = jnp.where(is_max, jnp.arange(indices.shape[0])[:, None], indices.shape[0])
        first = jnp.full((bags, weight.shape[1]), indices.shape[0]).at[owner].min(order)
        max_indices = jnp.where(size[:, None] > 0, indices[jnp.minimum(first, indices.shape[0] - 1)], 0).astype(
            jnp.int64
        )
        output = jnp.where(size[:, None] > 0, output, 0)
    else:
        output = jnp.zeros((bags, weight.shape[1]), rows.dtype).at[owner].add(jnp.where(valid[:, None], rows, 0))
        if mode == _BAG_MEAN:
            output = output / jnp.maximum(size, 1)[:, None].astype(rows.dtype)
    return output.astype(weight.dtype), owner.astype(jnp.int64), size, max_indices


@lowers(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    if mode == _BAG_MAX:
        columns = jnp.arange(grad.shape[1])[None, :]
        taken = jnp.where((bag_size > 0)[:, None], grad, 0)
        return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[maximum_indices, columns].add(taken)
    per_index = grad[offset2bag]
    if mode == _BAG_MEAN:
        per_index = per_index / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(grad.dtype)
    if per_sample_weights is not None:
        per_index = per_index * per_sample_weights[:, None].astype(grad.dtype)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[indices].add(1)
        per_index = per_index / counts[indices][:, None]
    per_index = jnp.where(valid[:, None], per_index, 0)
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[indices].add(per_index)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d output / d per_sample_weights (sum mode only): <grad of the bag, the index's row>."""
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    products = jnp.sum(grad[offset2bag] * jnp.take(weight, indices, axis=0), axis=1)
    return jnp.where(valid, products, 0).astype(grad.dtype)


@lowers(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    """The weight gradient, dense whatever `sparse` says (the device holds dense tensors)."""
    return embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )
