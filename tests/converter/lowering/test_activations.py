"""Activations, clamps and (log-)softmax: LiteRT vs PyTorch, plus the builtins they map to."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 5, 5) * 4

ACTIVATIONS = {
    "relu": nn.ReLU(),
    "relu6": nn.ReLU6(),
    "leaky_relu": nn.LeakyReLU(0.1),
    "prelu_per_channel": nn.PReLU(3, init=0.2),
    "prelu_single": nn.PReLU(),
    "elu": nn.ELU(),
    "elu_alpha": nn.ELU(alpha=0.5),
    "selu": nn.SELU(),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "silu": nn.SiLU(),
    "hardswish": nn.Hardswish(),
    "hardsigmoid": nn.Hardsigmoid(),
    "sigmoid": nn.Sigmoid(),
    "tanh": nn.Tanh(),
    "softplus": nn.Softplus(),
    "softplus_beta": nn.Softplus(beta=2.0, threshold=5.0),
    "mish": nn.Mish(),
    "hardtanh": nn.Hardtanh(-2.0, 3.0),
    "hardtanh_unit": nn.Hardtanh(),
    "softmax_last": nn.Softmax(dim=-1),
    "softmax_channels": nn.Softmax(dim=1),
    "log_softmax_last": nn.LogSoftmax(dim=-1),
    "log_softmax_channels": nn.LogSoftmax(dim=1),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation(name):
    assert_converts(ACTIVATIONS[name], (X,))


CLAMPS = {
    "clamp_0_6": lambda x: x.clamp(0, 6),
    "clamp_min_only": lambda x: x.clamp(min=0.5),
    "clamp_max_only": lambda x: x.clamp(max=-0.5),
    "clamp_both": lambda x: x.clamp(-1.5, 2.5),
    "clamp_min_zero": lambda x: x.clamp(min=0),
    "clamp_unit": lambda x: x.clamp(0, 1),
    "clamp_tensor": lambda x: torch.clamp(x, min=x[:, :1] * 0 - 1, max=x[:1] * 0 + 1),
    "clamp_int": lambda x: x.round().int().clamp(-2, 3),
}


@pytest.mark.parametrize("name", list(CLAMPS))
def test_clamp(name):
    assert_converts(Fn(CLAMPS[name]), (X,))


@pytest.mark.parametrize(
    "module, opcode",
    [
        (nn.ReLU6(), "RELU6"),
        (nn.GELU(), "GELU"),
        (nn.Hardswish(), "HARD_SWISH"),
        (nn.Softmax(-1), "SOFTMAX"),
        (Fn(lambda x: x.clamp(0, 6)), "RELU6"),
    ],
)
def test_maps_to_one_builtin(module, opcode):
    edge = assert_converts(module, (X,))
    assert [op.opcode for op in edge.ir_model.graphs[0].ops] == [opcode]


def test_gelu_approximation_flag_reaches_the_builtin():
    edge = assert_converts(nn.GELU(approximate="tanh"), (X,))
    assert edge.ir_model.graphs[0].ops[0].options["approximate"] is True
