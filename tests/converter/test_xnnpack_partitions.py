"""Patterns that used to cost LiteRT latency (issue 24, item 5): each converts to ops that
XNNPACK takes in one partition, or folds to constants, with the numbers of PyTorch.

An op XNNPACK does not take (BROADCAST_TO, UNPACK, SPLIT_V) cuts the delegated graph in
two; on a small transformer that was 1.3x the latency (XCiT). Constants computed at run
time (a relative-position bucket table, a projection of a position embedding) cost the
same at every invoke (DeBERTa: 1.2x).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from ai_edge_litert.interpreter import Interpreter

from tests.helpers import assert_converts


def _opcodes(edge) -> list[str]:
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


def _xnnpack_partitions(edge) -> int:
    """How many XNNPACK partitions LiteRT makes of the file (1: the whole graph is one)."""
    interpreter = Interpreter(model_content=edge.model_content(), num_threads=1)
    interpreter.allocate_tensors()
    return sum(op["op_name"] == "DELEGATE" for op in interpreter._get_ops_details())


class _CrossCovariance(nn.Module):
    """XCiT's attention: q, k, v unbound from one projection, L2-normalized over tokens."""

    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).permute(0, 3, 1, 2).reshape(b, n, c))


def test_normalize_and_unbind_stay_in_one_xnnpack_partition():
    edge = assert_converts(_CrossCovariance().eval(), (torch.randn(1, 16, 32),))
    ops = _opcodes(edge)
    assert "BROADCAST_TO" not in ops and "UNPACK" not in ops, ops
    assert ops.count("SPLIT") == 1
    assert _xnnpack_partitions(edge) == 1


class _Chunks(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)  # SwiGLU-style halves
        p, q, r = (x * 2).split([4, 4, 8], dim=-1)  # unequal sizes: SPLIT_V
        return a * torch.sigmoid(b), p + q, r


def test_equal_chunks_are_split_unequal_sizes_split_v():
    edge = assert_converts(_Chunks(), (torch.randn(2, 5, 16),))
    ops = _opcodes(edge)
    assert ops.count("SPLIT") == 1 and ops.count("SPLIT_V") == 1, ops


class _IntegerAndWideUnbind(nn.Module):
    def forward(self, x, idx):
        i, j = idx.unbind(-1)  # int64: LiteRT's UNPACK refuses it (the file did not load)
        parts = x.unbind(1)  # 6 parts
        return x[:, 0][..., :1] * (i + j)[:, None].float(), sum(parts)


def test_unbind_of_int64_and_of_many_parts():
    idx = torch.randint(0, 5, (3, 2))
    edge = assert_converts(_IntegerAndWideUnbind(), (torch.randn(3, 6, 1), idx), check_fresh=False)
    assert "UNPACK" not in _opcodes(edge)


class _RelativePositionTable(nn.Module):
    """DeBERTa-style: log-bucketed relative positions and a projected position table, all
    built in forward from constants (a 0-d tensor among them)."""

    def __init__(self, n=8, dim=16):
        super().__init__()
        self.n = n
        self.rel = nn.Parameter(torch.randn(2 * n, dim))
        self.key = nn.Linear(dim, dim)

    def forward(self, x):
        pos = torch.arange(self.n)
        rel = (pos[:, None] - pos[None, :]).float()
        mid = torch.tensor(2.0)  # 0-d: must stay 0-d so LOG and DIV fold
        bucket = torch.sign(rel) * torch.ceil(torch.log(rel.abs().clamp(min=1)) / torch.log(mid))
        index = (bucket + self.n).long().clamp(0, 2 * self.n - 1)
        keys = self.key(self.rel)  # a projection of a parameter: a constant
        bias = torch.gather(x @ keys.T, -1, index.expand(x.shape[0], -1, -1))
        return bias.softmax(-1)


def test_constants_built_in_forward_fold_to_constants():
    edge = assert_converts(_RelativePositionTable().eval(), (torch.randn(2, 8, 16),))
    ops = _opcodes(edge)
    for opcode in ("LOG", "CEIL", "SIGN", "DIV", "FULLY_CONNECTED"):
        assert opcode not in ops, ops
    assert ops.count("BATCH_MATMUL") == 1  # x @ keys.T, with keys folded
