"""Tensor factories become constants: LiteRT vs PyTorch, and no ops left for them."""

from __future__ import annotations

import pytest
import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

X = torch.randn(2, 3, 4)

FACTORIES = {
    "arange": lambda x: x + torch.arange(4),
    "arange_start_step": lambda x: x + torch.arange(1, 3, 0.5),
    "arange_int": lambda x: torch.arange(2, 14, 3) * 2,
    "full": lambda x: x + torch.full((3, 4), 2.5),
    "zeros": lambda x: x + torch.zeros(4),
    "ones": lambda x: x * torch.ones(3, 1),
    "zeros_like": lambda x: torch.zeros_like(x) + x,
    "ones_like": lambda x: torch.ones_like(x) - x,
    "full_like": lambda x: torch.full_like(x, 7.0) / (x.abs() + 1),
    "new_zeros": lambda x: x.new_zeros(4) + x,
    "scalar_tensor": lambda x: torch.where(x > 0, x, torch.tensor(-1.0)),
    "empty_like_filled": lambda x: torch.empty_like(x).fill_(3.0) + x,
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory(name):
    assert_converts(Fn(FACTORIES[name]), (X,))


def test_factories_fold_to_constants():
    edge = assert_converts(Fn(lambda x: x + torch.arange(4) * torch.ones(3, 4)), (X,))
    assert [op.opcode for op in edge.ir_model.graphs[0].ops] == ["ADD"]
