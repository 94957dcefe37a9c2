"""The shape logic behind sinking a TRANSPOSE through a RESHAPE, checked in numpy."""

import numpy as np

from converter.passes._reshape_layout import reshape_first


def apply(plan, x):
    x = np.transpose(x, plan.pre) if plan.pre is not None else x
    return np.transpose(x.reshape(plan.w_shape), plan.post)


def test_flatten_after_nhwc_to_nchw_needs_no_transpose():
    plan = reshape_first((2, 1, 1, 8), [0, 3, 1, 2], (2, 8))
    assert plan.pre is None and plan.w_shape == (2, 8) and plan.post == [0, 1]


def test_unflatten_matches_the_next_transpose_so_they_cancel():
    # (N, L, C) -> [0,2,1] -> (N, C, L) -> reshape (N, C, 1, L) -> read by [0,2,3,1]
    plan = reshape_first((2, 12, 6), [0, 2, 1], (2, 6, 1, 12), reader_perm=[0, 2, 3, 1])
    assert plan.w_shape == (2, 1, 12, 6) and plan.post == [0, 3, 1, 2]


def test_merging_dims_that_are_not_adjacent_is_refused():
    assert reshape_first((2, 3, 5, 7), [0, 2, 1, 3], (2, 5, 21)) is None


def test_random_transpose_reshape_pairs_agree_with_numpy():
    rng = np.random.default_rng(0)
    rewritten = 0
    for _ in range(3000):
        rank = int(rng.integers(1, 6))
        x_shape = tuple(int(d) for d in rng.choice([1, 1, 2, 3, 4, 6], rank))
        perm = [int(p) for p in rng.permutation(rank)]
        dims = [x_shape[p] for p in perm]
        for _ in range(int(rng.integers(0, 3))):  # random merges, splits, unit insertions
            kind, i = int(rng.integers(0, 3)), int(rng.integers(0, len(dims) + 1))
            if kind == 0 and 0 < i < len(dims):
                dims[i - 1 : i + 1] = [dims[i - 1] * dims[i]]
            elif kind == 1:
                dims.insert(i, 1)
            elif kind == 2 and i < len(dims) and dims[i] in (4, 6):
                dims[i : i + 1] = [2, dims[i] // 2]
        reader = [int(p) for p in rng.permutation(len(dims))] if rng.random() < 0.3 else None
        plan = reshape_first(x_shape, perm, tuple(dims), reader)
        if plan is None:
            continue
        x = rng.standard_normal(x_shape)
        np.testing.assert_array_equal(apply(plan, x), np.transpose(x, perm).reshape(dims))
        rewritten += 1
    assert rewritten > 2500
