"""Batch (inference and batch statistics), group, instance and layer norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 6, 5, 4) * 3 + 1


def trained_batch_norm(cls, channels, **kwargs):
    """A batch norm with non-trivial running statistics and affine parameters."""
    bn = cls(channels, **kwargs)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
    return bn.eval()


NORMS = {
    "batch_norm_2d": (trained_batch_norm(nn.BatchNorm2d, 6), X),
    "batch_norm_no_affine": (trained_batch_norm(nn.BatchNorm2d, 6, affine=False), X),
    "batch_norm_1d": (trained_batch_norm(nn.BatchNorm1d, 6), torch.randn(3, 6, 7)),
    "batch_norm_1d_features": (trained_batch_norm(nn.BatchNorm1d, 6), torch.randn(3, 6)),
    "group_norm": (nn.GroupNorm(3, 6), X),
    "group_norm_no_affine": (nn.GroupNorm(2, 6, affine=False), X),
    "instance_norm": (nn.InstanceNorm2d(6), X),
    "instance_norm_affine": (nn.InstanceNorm2d(6, affine=True), X),
    "layer_norm_last": (nn.LayerNorm(4), X),
    "layer_norm_two_axes": (nn.LayerNorm((5, 4)), X),
    "layer_norm_no_bias": (nn.LayerNorm(4, bias=False), X),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_norm(name):
    module, x = NORMS[name]
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # away from the trivial 1/0 initialisation
    assert_converts(module, (x,))


def test_batch_norm_after_conv_is_folded_away():
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), trained_batch_norm(nn.BatchNorm2d, 6), nn.ReLU())
    edge = assert_converts(model, (torch.randn(1, 3, 8, 8),))
    opcodes = [op.opcode for op in edge.ir_model.graphs[0].ops]
    assert "MUL" not in opcodes and "ADD" not in opcodes, opcodes
