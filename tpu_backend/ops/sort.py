"""Sorting and searching: sort, topk, searchsorted/bucketize, isin, histc; unique, bincount.

NaN sorts as the largest value, as in ATen (last ascending, first descending). Sorts
are stable, which is also a valid answer where ATen does not promise stability.
`unique*` and `bincount` have value-dependent output sizes: they are in
`DATA_DEPENDENT` and run eagerly on host values (a sync).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_backend.ops._common import canonical_dim, is_floating
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _descending_key(x):
    """A key whose ascending order is x's descending order with NaN first (ATen's)."""
    if is_floating(x.dtype):
        return jnp.where(jnp.isnan(x), -jnp.inf, -x), jnp.isnan(x)
    if x.dtype == jnp.bool_:
        return ~x, None
    return ~x, None  # bitwise not reverses integer order without overflow


def _sort(x, dim, descending):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    index = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if descending:
        key, nan_first = _descending_key(x)
        if nan_first is not None:
            # Primary key: NaN first; secondary: descending value; ties keep input order.
            _, _, order = lax.sort((~nan_first, key, index), dimension=axis, num_keys=2, is_stable=True)
        else:
            _, order = lax.sort((key, index), dimension=axis, num_keys=1, is_stable=True)
    else:
        _, order = lax.sort((x, index), dimension=axis, num_keys=1, is_stable=True)  # lax puts NaN last
    return jnp.take_along_axis(x, order, axis=axis), order


@lowers(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowers(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowers(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) along dim, in sorted order (always sorted here)."""
    values, indices = _sort(x, dim, descending=largest)
    axis = canonical_dim(dim, x.ndim) if x.ndim else 0
    if x.ndim == 0:
        return values, indices
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)


def _search(sorted_sequence, values, right, sorter):
    side = "right" if right else "left"
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    if sorted_sequence.shape[-1] == 0 or values.size == 0:  # nothing to search, or in
        return jnp.zeros(values.shape, jnp.int64)
    if sorted_sequence.ndim == 1:
        return jnp.searchsorted(sorted_sequence, values, side=side)
    # batched: row i of the values searches row i of the sequence (shapes explicit: rows may be empty)
    flat_seq = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    flat_val = values.reshape(flat_seq.shape[0], values.shape[-1])
    rows = jax.vmap(lambda seq, val: jnp.searchsorted(seq, val, side=side))(flat_seq, flat_val)
    return rows.reshape(values.shape)


@lowers(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    return _search(sorted_sequence, x, right, sorter).astype(jnp.int32 if out_int32 else jnp.int64)


@lowers(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    return searchsorted(
        sorted_sequence,
        jnp.asarray(x, sorted_sequence.dtype),
        out_int32=out_int32,
        right=right,
        side=side,
        sorter=sorter,
    )


@lowers(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    # bucketize's `right` means the opposite side from searchsorted's.
    return jnp.searchsorted(boundaries, x, side="right" if right else "left").astype(
        jnp.int32 if out_int32 else jnp.int64
    )


@lowers(aten.bucketize.Scalar)
def bucketize_scalar(value, boundaries, *, out_int32=False, right=False):
    """The bucket of one number (0-d). It promotes like ATen's wrapped scalar: a float
    against integer boundaries compares as float32, anything else in their dtype."""
    float_value = jnp.issubdtype(jnp.result_type(value), jnp.floating)
    dtype = jnp.float32 if float_value and not is_floating(boundaries.dtype) else boundaries.dtype
    return bucketize(jnp.asarray(value, dtype), boundaries.astype(dtype), out_int32=out_int32, right=right)


@lowers(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """Equal-width histogram over [min, max]; min == max means the data's own range."""
    if x.size == 0:
        return jnp.zeros((bins,), x.dtype)
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    same = lo == hi
    lo, hi = jnp.where(same, jnp.min(x), lo), jnp.where(same, jnp.max(x), hi)
    lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    position = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int32)
    position = jnp.clip(position, 0, bins - 1)  # x == max falls in the last bin
    return jnp.zeros((bins,), x.dtype).at[position].add(inside.astype(x.dtype))


def _histogram_counts(x, edges, weight, density):
    """Counts (or weights) per bin [edges[i], edges[i+1]); the last bin also holds its right
    edge; values outside are dropped. density divides by the total and the bin widths."""
    flat = x.reshape(-1)
    bins = edges.shape[0] - 1
    position = jnp.searchsorted(edges, flat, side="right") - 1
    position = jnp.where(flat == edges[-1], bins - 1, position)
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    amount = (weight.reshape(-1) if weight is not None else jnp.ones_like(flat)).astype(x.dtype)
    hist = jnp.zeros((bins,), x.dtype).at[jnp.clip(position, 0, bins - 1)].add(jnp.where(inside, amount, 0))
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist


@lowers(aten.histogram.bin_ct)
def histogram(x, bins=100, *, range=None, weight=None, density=False):
    """bins equal-width bins over `range`, else over the data's [min, max] (widened by 0.5
    each side when they are equal; [0, 1] for empty input), as ATen."""
    if range is not None:
        lo, hi = jnp.asarray(range[0], x.dtype), jnp.asarray(range[1], x.dtype)
    elif x.size == 0:
        lo, hi = jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype)
    else:
        lo, hi = jnp.min(x), jnp.max(x)
    lo, hi = jnp.where(lo == hi, lo - 0.5, lo), jnp.where(lo == hi, hi + 0.5, hi)
    edges = jnp.linspace(lo, hi, bins + 1, dtype=x.dtype)
    return _histogram_counts(x, edges, weight, density), edges


@lowers(aten.histogram.bins_tensor)
def histogram_edges(x, bins, *, weight=None, density=False):
    return _histogram_counts(x, bins.astype(x.dtype), weight, density), bins


def _histogramdd_edges(x, bins, range):
    """Per dim: equal-width edges over range[2d:2d+2] or the column's [min, max] (as histogram)."""
    points = x.reshape(-1, x.shape[-1])
    edges = []
    for d, count in enumerate(bins):
        if range is not None:
            lo, hi = jnp.asarray(range[2 * d], x.dtype), jnp.asarray(range[2 * d + 1], x.dtype)
        elif points.shape[0] == 0:
            lo, hi = jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype)
        else:
            lo, hi = jnp.min(points[:, d]), jnp.max(points[:, d])
        lo, hi = jnp.where(lo == hi, lo - 0.5, lo), jnp.where(lo == hi, hi + 0.5, hi)
        edges.append(jnp.linspace(lo, hi, count + 1, dtype=x.dtype))
    return edges


def _histogramdd_counts(x, edges, weight, density):
    points = x.reshape(-1, x.shape[-1])
    shape = tuple(e.shape[0] - 1 for e in edges)
    inside = jnp.ones(points.shape[0], bool)
    positions = []
    for d, e in enumerate(edges):
        column = points[:, d]
        position = jnp.where(column == e[-1], shape[d] - 1, jnp.searchsorted(e, column, side="right") - 1)
        positions.append(jnp.clip(position, 0, shape[d] - 1))
        inside &= (column >= e[0]) & (column <= e[-1])
    amount = (weight.reshape(-1) if weight is not None else jnp.ones(points.shape[0])).astype(x.dtype)
    hist = jnp.zeros(shape, x.dtype).at[tuple(positions)].add(jnp.where(inside, amount, 0))
    if density:
        volume = functools.reduce(jnp.multiply, jnp.ix_(*[e[1:] - e[:-1] for e in edges]))
        hist = hist / (jnp.sum(hist) * volume)
    return hist


@lowers(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_edges(x, bins, range)


@lowers(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_counts(x, _histogramdd_edges(x, bins, range), weight, density)


@lowers(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd_counts(x, [b.astype(x.dtype) for b in bins], weight, density)


@lowers(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    found = jnp.isin(jnp.asarray(elements), jnp.asarray(test_elements))
    return ~found if invert else found


# --- data-dependent sizes (run eagerly on host values) -------------------------------------------


def _host(x):
    return np.asarray(x)


def _unique_outputs(values, inverse, counts, x, return_inverse, return_counts, inverse_shape):
    empty = np.zeros((0,), np.int64)
    inverse_out = inverse.reshape(inverse_shape).astype(np.int64) if return_inverse else empty
    counts_out = counts.astype(np.int64) if return_counts else empty
    return jnp.asarray(values, x.dtype), jnp.asarray(inverse_out), jnp.asarray(counts_out)


@lowers(aten._unique2.default, data_dependent=True)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    """(unique values, inverse, counts); unused outputs are empty, as in ATen."""
    values, inverse, counts = np.unique(_host(x).reshape(-1), return_inverse=True, return_counts=True)
    return _unique_outputs(values, inverse, counts, x, return_inverse, return_counts, x.shape)


@lowers(aten._unique.default, data_dependent=True)
def unique(x, sorted=True, return_inverse=False):
    """(sorted unique values, inverse or empty)."""
    values, inverse, _ = unique2(x, sorted, return_inverse, False)
    return values, inverse


@lowers(aten.unique_dim.default, data_dependent=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    axis = canonical_dim(dim, x.ndim)
    values, inverse, counts = np.unique(_host(x), axis=axis, return_inverse=True, return_counts=True)
    return _unique_outputs(values, inverse, counts, x, return_inverse, return_counts, (x.shape[axis],))


@lowers(aten.unique_consecutive.default, data_dependent=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    host = _host(x)
    if dim is None:
        flat = host.reshape(-1)
        starts = np.concatenate([[True], flat[1:] != flat[:-1]]) if flat.size else np.zeros((0,), bool)
        values = flat[starts]
        inverse_shape = x.shape
    else:
        axis = canonical_dim(dim, x.ndim)
        moved = np.moveaxis(host, axis, 0)
        changed = (
            np.any((moved[1:] != moved[:-1]).reshape(moved.shape[0] - 1, math.prod(moved.shape[1:])), axis=1)
            if moved.shape[0]
            else np.zeros((0,), bool)
        )
        starts = np.concatenate([[True], changed]) if moved.shape[0] else changed
        values = np.moveaxis(moved[starts], 0, axis)
        inverse_shape = (x.shape[axis],)
    inverse = np.cumsum(starts) - 1
    counts = np.diff(np.append(np.flatnonzero(starts), starts.size))
    return _unique_outputs(values, inverse, counts, x, return_inverse, return_counts, inverse_shape)


@lowers(aten.repeat_interleave.Tensor, data_dependent=True)
def repeat_interleave_indices(repeats, *, output_size=None):
    """i repeated repeats[i] times (the index form; repeat_interleave(x, tensor) gathers by it)."""
    counts = _host(repeats).reshape(-1)
    return jnp.asarray(np.repeat(np.arange(counts.size, dtype=np.int64), counts))


@lowers(aten.bincount.default, data_dependent=True)
def bincount(x, weights=None, minlength=0):
    host = _host(x)
    length = max(int(host.max()) + 1 if host.size else 0, minlength)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    dtype = weights.dtype if is_floating(weights.dtype) else jnp.float64
    return jnp.zeros((length,), dtype).at[x].add(weights.astype(dtype))
