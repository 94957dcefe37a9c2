"""Ops that reached the converter only through their decompositions, traced one node at a
time (40-300 ms each: a tenth of some models' conversion), now lowered directly: LiteRT
against PyTorch, and the ops they become."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from converter.lowering import decompositions
from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 4, 5)
BIAS, A, B = torch.randn(2, 4, 6), torch.randn(2, 4, 5), torch.randn(2, 5, 6)


class _Bmm(nn.Module):
    def forward(self, bias, a, b):
        return torch.baddbmm(bias, a, b, beta=0.5, alpha=0.25), torch.baddbmm(bias, a, b)


CASES = {
    "softmax_dtype": (Fn(lambda x: torch.softmax(x, -1, dtype=torch.float32)), (X,), ["SOFTMAX"]),
    "log_softmax_dtype": (Fn(lambda x: torch.log_softmax(x, -1, dtype=torch.float32)), (X,), ["LOG_SOFTMAX"]),
    "type_as": (Fn(lambda x: (x > 0).type_as(x) * x), (X,), None),
    "expand_as": (Fn(lambda x: x[:, :1].expand_as(x) + x), (X,), None),
    "masked_fill_scalar": (Fn(lambda x: x.masked_fill(x > 0.5, -1.0)), (X,), ["GREATER", "SELECT_V2"]),
    "masked_fill_tensor": (Fn(lambda x: x.masked_fill(x < 0, torch.tensor(2.0))), (X,), ["LESS", "SELECT_V2"]),
    "baddbmm": (_Bmm(), (BIAS, A, B), None),
    "repeat_interleave_dim": (Fn(lambda x: x.repeat_interleave(3, dim=1)), (X,), ["GATHER"]),
    "repeat_interleave_flat": (Fn(lambda x: x.repeat_interleave(2)), (X,), ["RESHAPE", "GATHER"]),
    "weight_norm_conv": (nn.utils.weight_norm(nn.Conv1d(3, 6, 3)), (torch.randn(2, 3, 9),), None),
    "weight_norm_whole": (nn.utils.weight_norm(nn.Linear(5, 4), dim=None), (torch.randn(3, 5),), None),
    "adaptive_avg_pool3d": (nn.AdaptiveAvgPool3d(1), (torch.randn(1, 3, 4, 5, 6),), ["MEAN"]),
}


@pytest.fixture
def no_decomposition(monkeypatch):
    """Any per-node decomposition trace fails the test: the op must be lowered directly."""

    def refuse(op, *rest, **kwargs):
        raise AssertionError(f"{op} was decomposed instead of lowered directly")

    monkeypatch.setattr(decompositions, "trace_decomposition", refuse)


@pytest.mark.parametrize("name", list(CASES))
def test_lowered_directly_and_equal_to_pytorch(name, no_decomposition):
    module, args, ops = CASES[name]
    edge = assert_converts(module.eval(), args)
    if ops is not None:
        assert [op.opcode for op in edge.ir_model.graphs[0].ops] == ops


class _Einsum(nn.Module):
    def __init__(self, equation: str, weight: torch.Tensor | None = None):
        super().__init__()
        self.equation, self.weight = equation, weight

    def forward(self, *operands):
        return torch.einsum(self.equation, *operands, *([self.weight] if self.weight is not None else []))


EINSUMS = {
    "batched_matmul": ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], None),
    "output_reordered": ("bij,bjk->kbi", [(2, 3, 4), (2, 4, 5)], None),
    "outer": ("i,j->ij", [(3,), (4,)], None),
    "summed_alone": ("bij,bkl->bik", [(2, 3, 4), (2, 5, 6)], None),
    "implicit_output": ("ij,jk", [(3, 4), (4, 5)], None),
    "transpose_sum": ("ijk->ki", [(3, 4, 5)], None),
    "by_constant": ("bnc,dc->bnd", [(2, 7, 5)], torch.randn(6, 5)),
    "maxvit_rel_pos": ("bhwc,hkc->bhwk", [(2, 4, 4, 8), (4, 7, 8)], None),
}


@pytest.mark.parametrize("name", list(EINSUMS))
def test_einsum_lowered_directly(name, no_decomposition):
    equation, shapes, weight = EINSUMS[name]
    edge = assert_converts(_Einsum(equation, weight), tuple(torch.randn(*s) for s in shapes))
    kinds = {op.opcode for op in edge.ir_model.graphs[0].ops}
    assert kinds <= {"BATCH_MATMUL", "FULLY_CONNECTED", "TRANSPOSE", "RESHAPE", "SUM"}, kinds


def test_einsum_with_an_ellipsis_still_converts():
    assert_converts(_Einsum("...ij,...jk->...ik"), (torch.randn(2, 3, 4), torch.randn(2, 4, 5)))  # decomposed
