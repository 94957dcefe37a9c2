"""Attention masks and position biases computed from constants fold into constants.

transformers builds masks from arange/cumsum and advanced indexing, and T5 its position
buckets with a log that is -inf at distance 0 (discarded by a where): CUMSUM, GATHER_ND
and LOG(0) must fold, leaving only the ops that read the input.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers import assert_converts


class MaskedByPositions(nn.Module):
    def forward(self, x):  # x: (batch, length, length)
        length = x.shape[-1]
        positions = torch.cumsum(torch.ones(length, dtype=torch.int64), 0) - 1
        steps = torch.arange(length)
        grid = positions[:, None] - positions[None, :]
        distance = grid[steps[:, None], steps[None, :]]  # advanced indexing: GATHER_ND
        causal = distance >= 0
        buckets = torch.log(distance.abs().float())  # -inf on the diagonal, discarded below
        bias = torch.where(distance == 0, 0.0, -buckets)
        return x.masked_fill(~causal, -1e9) + bias


def test_masks_from_cumsum_indexing_and_log_fold_to_constants():
    edge = assert_converts(MaskedByPositions(), (torch.randn(2, 6, 6),))
    opcodes = {op.opcode for op in edge.ir_model.graphs[0].ops}
    assert not {"CUMSUM", "GATHER_ND", "LOG", "RANGE"} & opcodes, opcodes
