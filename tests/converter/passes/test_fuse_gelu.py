"""fuse_gelu: a hand-written tanh GELU (GPT-2's) becomes one GELU op and still matches PyTorch."""

from __future__ import annotations

import math

import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts


def new_gelu(x):
    """transformers' NewGELUActivation (GPT-2)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def cubed_gelu(x):
    return x * 0.5 * (1.0 + torch.tanh((x * x * x * 0.044715 + x) * math.sqrt(2.0 / math.pi)))


def opcodes(edge):
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


def test_hand_written_tanh_gelu_becomes_one_gelu():
    for fn in (new_gelu, cubed_gelu):
        edge = assert_converts(Fn(fn), (torch.randn(2, 8, 16) * 3,))
        assert opcodes(edge) == ["GELU"], fn.__name__


def test_other_constants_are_left_alone():
    def not_gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(0.7 * (x + 0.044715 * torch.pow(x, 3.0))))

    edge = assert_converts(Fn(not_gelu), (torch.randn(2, 16),))
    assert "GELU" not in opcodes(edge) and "TANH" in opcodes(edge)


def test_shared_intermediates_stay_correct():
    def gelu_and_cube(x):
        cube = torch.pow(x, 3.0)
        return new_gelu(x), cube * 2

    edge = assert_converts(Fn(gelu_and_cube), (torch.randn(2, 16),))
    assert "GELU" in opcodes(edge)
