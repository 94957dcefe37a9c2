"""index_select, gather, advanced indexing and embedding: LiteRT vs PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(4, 5, 6)
IDX = torch.tensor([3, 0, 2, 2])


class ConstIndex(nn.Module):
    """Indices held as a buffer (constant in the graph)."""

    def __init__(self, fn, index):
        super().__init__()
        self.fn = fn
        self.register_buffer("index", index)

    def forward(self, x):
        return self.fn(x, self.index)


CASES = {
    "index_select": (Fn(lambda x, i: x.index_select(1, i)), (X, IDX)),
    "index_select_int32": (Fn(lambda x, i: x.index_select(2, i.int())), (X, IDX)),
    "getitem_tensor": (Fn(lambda x, i: x[i]), (X, IDX)),
    "getitem_middle_axis": (Fn(lambda x, i: x[:, i]), (X, IDX)),
    "getitem_two_tensors": (Fn(lambda x, i: x[i, i.flip(0)]), (X, IDX)),
    "gather_last": (Fn(lambda x, i: torch.gather(x, 2, i)), (X, torch.randint(0, 6, (4, 5, 3)))),
    "gather_middle": (Fn(lambda x, i: torch.gather(x, 1, i)), (X, torch.randint(0, 5, (4, 2, 6)))),
    "gather_const": (ConstIndex(lambda x, i: torch.gather(x, 0, i), torch.randint(0, 4, (2, 5, 6))), (X,)),
    "getitem_const_negative": (ConstIndex(lambda x, i: x[:, i], torch.tensor([-1, 0, -2])), (X,)),
    "getitem_adjacent_after_slice": (Fn(lambda x, i, j: x[:, i, j]), (X, torch.tensor([[4, 0], [1, 2]]), IDX[:2])),
    "getitem_const_pairs_after_slice": (ConstIndex(lambda x, p: x[:, p[0], p[1]], torch.triu_indices(5, 6, 1)), (X,)),
    "take_along_dim_argsort_free": (Fn(lambda x, i: x.gather(-1, x.argmax(-1, keepdim=True))), (X, IDX)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_indexing(name):
    module, args = CASES[name]
    assert_converts(module, args)


def test_embedding():
    assert_converts(nn.Embedding(10, 4), (torch.tensor([[1, 2, 9], [0, 3, 3]]),))


def test_boolean_mask_is_refused_with_a_hint():
    from converter.errors import ConversionError

    with pytest.raises(ConversionError, match="where"):
        assert_converts(Fn(lambda x, m: x[m]), (X, X > 0))


def test_non_adjacent_index_tensors_are_refused_with_a_hint():
    from converter.errors import ConversionError

    with pytest.raises(ConversionError, match="not adjacent"):
        assert_converts(Fn(lambda x, i: x[i, :, i]), (X, IDX))


def test_one_hot_of_an_argmax_is_one_equal_and_a_cast():
    """A mixture-of-experts router's one-hot: lowered whole (its decomposition asserts on
    the indices' values, which LiteRT cannot)."""
    edge = assert_converts(
        Fn(lambda x: torch.nn.functional.one_hot(x.argmax(-1), num_classes=5)), (torch.randn(3, 7, 5),)
    )
    assert {op.opcode for op in edge.ir_model.graphs[0].ops} >= {"EQUAL", "CAST"}
