"""Reductions: LiteRT vs PyTorch (index outputs must match exactly, as int64)."""

from __future__ import annotations

import pytest
import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 4, 5)

REDUCTIONS = {
    "mean_dim": lambda x: x.mean(1),
    "mean_hw_keepdim": lambda x: x.mean((2, 3), keepdim=True),
    "mean_all": lambda x: x.mean(),
    "sum_dim": lambda x: x.sum(-1),
    "sum_all": lambda x: x.sum(),
    "sum_bool": lambda x: (x > 0).sum(1),
    "prod": lambda x: (x.abs() + 0.5).prod(2),
    "amax": lambda x: x.amax((1, 3)),
    "amin_keepdim": lambda x: x.amin(1, keepdim=True),
    "max_all": lambda x: x.max(),
    "min_all": lambda x: x.min(),
    "max_dim": lambda x: x.max(1),
    "min_dim_keepdim": lambda x: x.min(2, keepdim=True),
    "argmax": lambda x: x.argmax(3),
    "argmax_keepdim": lambda x: x.argmax(1, keepdim=True),
    "argmax_flat": lambda x: x.argmax(),
    "argmin": lambda x: x.argmin(-1),
    "var": lambda x: x.var(1),
    "var_unbiased_false": lambda x: x.var((2, 3), unbiased=False, keepdim=True),
    "var_all": lambda x: x.var(),
    "std": lambda x: x.std(0, correction=0),
    "std_keepdim": lambda x: x.std(-1, keepdim=True),
    "any": lambda x: (x > 1).any(1),
    "all": lambda x: (x > -2).all(-1),
    "cumsum": lambda x: x.cumsum(2),
    "norm": lambda x: x.norm(dim=1),
    "normalize": lambda x: torch.nn.functional.normalize(x, dim=-1),
    "logsumexp": lambda x: x.logsumexp(1),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction(name):
    assert_converts(Fn(REDUCTIONS[name]), (X,))


def test_argmax_picks_the_first_of_ties():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    assert_converts(Fn(lambda x: (x.argmax(1), x.argmin(1))), (x,))
