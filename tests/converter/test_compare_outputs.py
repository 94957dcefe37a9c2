"""The comparison every converter test relies on (`tests.helpers.compare_outputs`) and the
fresh inputs `assert_converts` adds: a metric that a -1e9 mask or a baked-in input would
switch off lets real errors through."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers import compare_outputs, fresh_inputs

MASK = -1e9


def masked_scores() -> np.ndarray:
    scores = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    scores[np.triu_indices(4, 1, 6)] = MASK
    return scores


def test_a_real_error_next_to_a_mask_value_fails():
    want = masked_scores()
    got = want.copy()
    got[2, 0] += 0.05  # 0.05 against values of ~1: an error, however large -1e9 is
    problems = compare_outputs([got], [want], rtol=1e-4, atol=1e-5)
    assert len(problems) == 1 and "max relative error" in problems[0] and "(2, 0)" in problems[0], problems


def test_mask_values_must_sit_at_the_same_positions():
    want = masked_scores()
    got = want.copy()
    got[0, 1] = 0.0  # a masked position left open
    problems = compare_outputs([got], [want], rtol=1e-4, atol=1e-5)
    assert len(problems) == 1 and "sentinel" in problems[0] and "(0, 1)" in problems[0], problems


def test_mask_values_and_infinities_that_agree_pass():
    want = masked_scores()
    want[3, 5] = -np.inf
    got = want.copy()
    got[0, 3] = np.float32(MASK + 64)  # float32 rounding of -1e9 plus a score: one ulp away
    got[1, 0] += 1e-6
    assert compare_outputs([got], [want], rtol=1e-4, atol=1e-5) == []
    got[3, 5] = np.inf
    assert "sentinel values differ" in compare_outputs([got], [want], rtol=1e-4, atol=1e-5)[0]


def test_fresh_inputs_keep_shape_range_and_integer_inputs():
    x, ids, mask = torch.rand(3, 5) + 1, torch.arange(6).reshape(2, 3), torch.tensor([True, False])
    fresh_x, fresh_ids, fresh_mask = fresh_inputs((x, ids, mask))
    assert fresh_x.shape == x.shape and not torch.equal(fresh_x, x)
    assert torch.equal(fresh_x.flatten().sort().values, x.flatten().sort().values)  # same values, other places
    assert fresh_ids is ids and fresh_mask is mask
