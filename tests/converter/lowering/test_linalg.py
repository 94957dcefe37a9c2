"""linear / matmul / mm / bmm / addmm / baddbmm: LiteRT vs PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)


def opcodes(edge) -> list[str]:
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


class ConstMatmul(nn.Module):
    """x @ W with W a buffer: the constant right operand becomes FULLY_CONNECTED."""

    def __init__(self, *shape):
        super().__init__()
        self.register_buffer("w", torch.randn(*shape))

    def forward(self, x):
        return x @ self.w


CASES = {
    "linear_2d": (nn.Linear(8, 5), (torch.randn(3, 8),)),
    "linear_3d": (nn.Linear(8, 5), (torch.randn(2, 3, 8),)),
    "linear_4d": (nn.Linear(8, 5), (torch.randn(2, 2, 3, 8),)),
    "linear_1d": (nn.Linear(8, 5), (torch.randn(8),)),
    "linear_no_bias": (nn.Linear(8, 5, bias=False), (torch.randn(3, 8),)),
    "const_matmul_2d": (ConstMatmul(8, 5), (torch.randn(3, 8),)),
    "const_matmul_3d": (ConstMatmul(8, 5), (torch.randn(2, 3, 8),)),
    "matmul_3d": (Fn(torch.matmul), (torch.randn(2, 3, 4), torch.randn(2, 4, 5))),
    "matmul_broadcast": (Fn(torch.matmul), (torch.randn(2, 2, 3, 4), torch.randn(4, 5))),
    "matmul_batch_broadcast": (Fn(torch.matmul), (torch.randn(2, 1, 3, 4), torch.randn(3, 4, 5))),
    "matmul_vector_right": (Fn(torch.matmul), (torch.randn(2, 3, 4), torch.randn(4))),
    "matmul_vector_left": (Fn(torch.matmul), (torch.randn(4), torch.randn(2, 4, 5))),
    "mm": (Fn(torch.mm), (torch.randn(3, 4), torch.randn(4, 5))),
    "bmm": (Fn(torch.bmm), (torch.randn(2, 3, 4), torch.randn(2, 4, 5))),
    "addmm": (Fn(torch.addmm), (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5))),
    "addmm_scaled": (
        Fn(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
        (torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)),
    ),
    "baddbmm": (
        Fn(lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5)),
        (torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)),
    ),
    "attention_scores": (
        Fn(lambda q, k: torch.softmax(q @ k.transpose(-2, -1) / 2, -1)),
        (torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)),
    ),
    "sdpa": (
        Fn(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)),
        (torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matrix_products(name):
    module, args = CASES[name]
    assert_converts(module, args)


def test_linear_is_one_fully_connected_with_the_torch_weight():
    model = nn.Linear(8, 5)
    edge = assert_converts(model, (torch.randn(2, 3, 8),))
    (op,) = edge.ir_model.graphs[0].ops
    assert op.opcode == "FULLY_CONNECTED" and op.options["keepNumDims"] is True
    assert op.inputs[1].shape == (5, 8)


def test_mlp_has_no_transposes():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    edge = assert_converts(model, (torch.randn(3, 8),))
    assert opcodes(edge) == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
