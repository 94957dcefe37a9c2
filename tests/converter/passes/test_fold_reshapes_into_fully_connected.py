"""fold_reshapes_into_fully_connected: view(-1, in) -> addmm -> view(*lead, out) is one FULLY_CONNECTED."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers import assert_converts


class Conv1DProjection(nn.Module):
    """transformers' GPT-2 `Conv1D`: addmm on the flattened input, then unflatten."""

    def __init__(self, features_in=16, features_out=24):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features_in, features_out) * 0.1)
        self.bias = nn.Parameter(torch.randn(features_out))

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.size()[:-1] + (self.weight.size(-1),))


def opcodes(edge):
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


def test_flatten_fc_unflatten_is_one_fully_connected():
    edge = assert_converts(Conv1DProjection(), (torch.randn(2, 5, 16),))
    assert opcodes(edge) == ["FULLY_CONNECTED"]
    assert edge.ir_model.graphs[0].ops[0].options["keepNumDims"] is True


def test_flattened_output_used_elsewhere_keeps_the_reshapes():
    class Both(Conv1DProjection):
        def forward(self, x):
            flat = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return flat.view(2, 5, 24), flat.sum()

    edge = assert_converts(Both(), (torch.randn(2, 5, 16),))
    assert opcodes(edge).count("FULLY_CONNECTED") == 1
