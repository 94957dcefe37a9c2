"""topk / sort / argsort through TOPK_V2: LiteRT vs PyTorch (values close, indices exact)."""

from __future__ import annotations

import pytest
import torch

import litert_torch
from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)

CASES = {
    "topk_last": (Fn(lambda x: torch.topk(x, 3)), (torch.randn(2, 10),)),
    "topk_smallest_dim0": (Fn(lambda x: torch.topk(x, 2, dim=0, largest=False)), (torch.randn(5, 3),)),
    "topk_middle_axis": (Fn(lambda x: torch.topk(x, 4, dim=1)), (torch.randn(2, 6, 3),)),
    "topk_int32": (Fn(lambda x: torch.topk(x, 2)), (torch.randperm(21).reshape(3, 7).int(),)),
    "sort_ascending": (Fn(lambda x: torch.sort(x)), (torch.randn(2, 10),)),
    "sort_descending_dim0": (Fn(lambda x: torch.sort(x, dim=0, descending=True)), (torch.randn(6, 3),)),
    "sort_stable_ties": (Fn(lambda x: torch.sort(x, dim=1, stable=True)), (torch.randint(0, 3, (3, 9)).float(),)),
    "argsort": (Fn(lambda x: torch.argsort(x, dim=-1, descending=True)), (torch.randn(4, 8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_ordering_matches_pytorch(name):
    module, args = CASES[name]
    edge = assert_converts(module, args)
    assert "TOPK_V2" in {op.opcode for op in edge.ir_model.graphs[0].ops}


@pytest.mark.parametrize("right", [False, True])
def test_bucketize_counts_the_boundaries_below(right):
    boundaries = torch.tensor([0.25, 0.5, 0.75])
    x = torch.tensor([[0.0, 0.25, 0.3, 0.5], [0.6, 0.75, 0.9, 1.0]])  # values on the boundaries too
    module = Fn(lambda v: torch.bucketize(v, boundaries, right=right))
    edge = assert_converts(module, (x,))
    assert "SUM" in {op.opcode for op in edge.ir_model.graphs[0].ops}


def test_sorting_booleans_is_refused_with_a_hint():
    with pytest.raises(litert_torch.UnsupportedOpsError, match="boolean"):
        litert_torch.convert(Fn(lambda x: torch.sort(x > 0, stable=True)), (torch.randn(2, 5),), progress=False)
