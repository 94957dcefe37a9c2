"""sink_row_slices: a slice of rows after row-wise ops moves above them, so they compute
only the kept rows (an LM prefill's last-position logits), with the same numbers."""

from __future__ import annotations

import torch
import torch.nn as nn

from tests.helpers import assert_converts


class _LastPosition(nn.Module):
    """A decoder-style tail: residual MLP, norm, vocabulary projection of the last row."""

    def __init__(self):
        super().__init__()
        self.attn_out = nn.Linear(16, 16)
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
        self.norm, self.head = nn.LayerNorm(16), nn.Linear(16, 50)

    def forward(self, x, keys):
        h = x + self.attn_out(torch.softmax(x @ keys.transpose(1, 2), -1) @ keys)
        h = h + self.down(torch.nn.functional.silu(self.up(self.norm(h))))
        return self.head(self.norm(h)[:, -1:]), x.sum()  # x is read elsewhere too


def _rows_in(edge, opcode: str) -> list[int]:
    return [op.inputs[0].shape[-2] for op in edge.ir_model.graphs[0].ops if op.opcode == opcode]


def test_the_last_rows_slice_moves_above_the_mlp_norms_and_attention_rows():
    x, keys = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    edge = assert_converts(_LastPosition().eval(), (x, keys))
    assert _rows_in(edge, "FULLY_CONNECTED") == [1, 1, 1, 1]  # output projection, MLP, head: one row each
    assert _rows_in(edge, "SOFTMAX") == [1]  # the query rows of the attention too
    # the keys' rows are contracted, never sliced: the scores still read all 8 keys
    assert [op.inputs[1].shape for op in edge.ir_model.graphs[0].ops if op.opcode == "BATCH_MATMUL"][-1][-2] == 8


class _NotRowWise(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)[:, -2:]  # each row depends on the rows before it


def test_a_slice_after_an_op_that_mixes_rows_stays():
    edge = assert_converts(_NotRowWise(), (torch.randn(1, 6, 4),))
    assert [op.opcode for op in edge.ir_model.graphs[0].ops][-1] == "STRIDED_SLICE"


def test_a_slice_reused_from_earlier_keeps_the_ops_in_topological_order():
    """The rows of t were already sliced for an op that comes before t's other reader:
    the sunk slice reuses that one where it is (moving it would put it after its reader)."""
    import numpy as np

    from converter.ir import Model
    from converter.passes.sink_row_slices import sink_row_slices
    from converter.writer import validate
    from tests.converter.passes.passes_helpers import GraphBuilder, run

    def rows(b, t):
        ends = [1, 4, 3]
        return b.op("STRIDED_SLICE", [t, b.const([0, 3, 0], np.int32), b.const(ends, np.int32), b.const([1, 1, 1], np.int32)],
                    {"beginMask": 0, "endMask": 0, "ellipsisMask": 0, "newAxisMask": 0, "shrinkAxisMask": 0, "offset": False},
                    shape=(1, 1, 3))  # fmt: skip

    b = GraphBuilder()
    x = b.input((1, 4, 3))
    t = b.op("RELU", [x])
    early = b.op("EXP", [rows(b, t)])
    late = rows(b, b.op("NEG", [t]))
    graph = b.output(early, late)
    data = np.random.default_rng(0).standard_normal((1, 4, 3)).astype(np.float32)
    expected = run(graph, [data])
    sink_row_slices(graph)
    validate(Model([graph]))  # raises on an op reading a tensor made after it
    # one slice, shared, then sunk above RELU too once it was t's only reader
    assert [op.opcode for op in graph.ops] == ["STRIDED_SLICE", "RELU", "EXP", "NEG"]
    for got, want in zip(run(graph, [data]), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)


class _GroupedAttentionLastRow(nn.Module):
    """Grouped-query attention as export_generative writes it ((G, B, H_kv, T, D) queries),
    keeping only the last token's output, as a prefill returning the last logits does."""

    def forward(self, q, k, v, bias):
        from litert_torch.generative.attention import grouped_attention

        return grouped_attention(q, k, v, bias, 0.25)[:, :, -1:]


def test_the_last_row_slice_sinks_through_grouped_attention():
    q, k, v = torch.randn(1, 8, 6, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    bias = torch.randn(6, 20)
    edge = assert_converts(_GroupedAttentionLastRow(), (q, k, v, bias))
    softmax = [op for op in edge.ir_model.graphs[0].ops if op.opcode == "SOFTMAX"]
    assert [op.inputs[0].shape for op in softmax] == [(4, 1, 2, 1, 20)]  # (G, B, H_kv, T, S): one query row
