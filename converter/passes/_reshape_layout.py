"""When can TRANSPOSE -> RESHAPE be written RESHAPE -> TRANSPOSE? (pure shape logic)

A RESHAPE splits and merges groups of consecutive dimensions; size-1 dimensions carry
no data and can sit anywhere. For o = RESHAPE(TRANSPOSE(x, perm)), each group of
y's dims that the RESHAPE merges or splits must come from dims of x that are adjacent
(size-1 dims aside). Then the same RESHAPE can act on x directly, giving w, and
o = TRANSPOSE(w, post) for a permutation `post` of whole groups. When a group's dims are
adjacent in x but in another order, a small TRANSPOSE of x (`pre`) puts them in order
first (a channel shuffle is exactly such a group).

Used by the layout pass to sink transposes through flatten/unflatten RESHAPEs (1-D
convolutions lifted to 2-D, classifier heads). The pass only takes plans without `pre`
(a transpose inserted before the reshape could be sunk again, and again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ._graph import inverse_perm


@dataclass(frozen=True)
class ReshapeFirst:
    """o = TRANSPOSE(RESHAPE(TRANSPOSE(x, pre), w_shape), post); `pre` None when not needed."""

    pre: list[int] | None
    w_shape: tuple[int, ...]
    post: list[int]


def _groups(y_shape: Sequence[int], o_shape: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Pair up the non-unit dims of y and o into groups with equal products."""
    a = [i for i, d in enumerate(y_shape) if d != 1]
    b = [j for j, d in enumerate(o_shape) if d != 1]
    groups, i, j = [], 0, 0
    try:
        while i < len(a) or j < len(b):
            ga, gb = [a[i]], [b[j]]
            pa, pb = y_shape[a[i]], o_shape[b[j]]
            i, j = i + 1, j + 1
            while pa != pb:
                if pa < pb:
                    ga.append(a[i])
                    pa *= y_shape[a[i]]
                    i += 1
                else:
                    gb.append(b[j])
                    pb *= o_shape[b[j]]
                    j += 1
            groups.append((ga, gb))
    except IndexError:
        return None  # element counts differ: not a reshape we understand
    return groups


def reshape_first(
    x_shape: Sequence[int], perm: Sequence[int], o_shape: Sequence[int], reader_perm: Sequence[int] | None = None
) -> ReshapeFirst | None:
    """Rewrite o = RESHAPE(TRANSPOSE(x, perm), o_shape) as reshape-then-transpose, or None.

    `reader_perm`: the perm of a TRANSPOSE that alone reads o, if any; size-1 dims of w
    are then placed so that `post` is its inverse and the two cancel.
    """
    y_shape = [x_shape[p] for p in perm]
    groups = _groups(y_shape, o_shape)
    if groups is None:
        return None
    x_nonunit = [k for k, d in enumerate(x_shape) if d != 1]
    rank_in_x = {k: n for n, k in enumerate(x_nonunit)}
    # Where each group's dims sit among x's non-unit dims: they must be adjacent.
    runs = []
    for ga, _ in groups:
        idx = [rank_in_x[perm[p]] for p in ga]
        if max(idx) - min(idx) + 1 != len(idx):
            return None
        runs.append(idx)
    pre = None
    if any(idx != sorted(idx) for idx in runs):
        slots = list(range(len(x_shape)))  # size-1 dims stay where they are
        for idx in runs:
            for slot, n in zip(sorted(idx), idx):
                slots[x_nonunit[slot]] = x_nonunit[n]
        pre = slots
    # w's non-unit dims: each group's o-dims, groups in x's order.
    order = sorted(range(len(groups)), key=lambda g: min(runs[g]))
    w_labels = [o_dim for g in order for o_dim in groups[g][1]]  # labelled by o position
    w_shape, post = _place_unit_dims(o_shape, w_labels, reader_perm)
    return ReshapeFirst(pre, w_shape, post)


def _place_unit_dims(o_shape, w_labels: list[int], reader_perm) -> tuple[tuple[int, ...], list[int]]:
    """w's full shape and `post` (o = TRANSPOSE(w, post)), given w's non-unit dims as o
    positions in w's order."""
    rank = len(o_shape)
    if reader_perm is not None and len(reader_perm) == rank:
        # Take w = TRANSPOSE(o, reader_perm) if its non-unit dims come in w's order.
        seen = [q for q in reader_perm if o_shape[q] != 1]
        if seen == w_labels:
            post = inverse_perm(reader_perm)
            return tuple(o_shape[q] for q in reader_perm), post
    # Otherwise size-1 dims keep their index, non-unit slots are filled in w's order.
    slots = [i for i in range(rank) if o_shape[i] != 1]
    w_of_o = {label: slot for label, slot in zip(w_labels, slots)}
    post = [i if o_shape[i] == 1 else w_of_o[i] for i in range(rank)]
    w_shape = [1] * rank
    for label, slot in w_of_o.items():
        w_shape[slot] = o_shape[label]
    return tuple(w_shape), post
