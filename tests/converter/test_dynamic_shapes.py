"""Dynamic shapes: `convert(..., dynamic_shapes=...)` with torch.export `Dim`s.

Each model is converted once, its dynamic dims are -1 in the LiteRT signature, and the
same EdgeModel is then called at several sizes other than the sample (LiteRT resizes
the inputs); every output must match PyTorch at every size (max relative error <= 1e-4).
Sizes computed from symbols (`x.view(B * 2, T, -1)`, `torch.arange(T)`, `x[:, 1:T-1]`,
`expand(B, -1, -1)`) become SHAPE + STRIDED_SLICE + int32 arithmetic in the model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import litert_torch
from converter.errors import ConversionError, UnsupportedOpsError
from tests.helpers import assert_converts

torch.manual_seed(0)
BATCH = Dim("batch", min=1, max=64)
SEQ = Dim("seq", min=4, max=256)


def _signature(edge):
    sig = edge.signatures[0]
    return ([s.shape_signature or s.shape for s in sig.inputs], [s.shape_signature or s.shape for s in sig.outputs])


def test_mlp_dynamic_batch():
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    edge = assert_converts(
        mlp, (torch.randn(3, 8),), dynamic_shapes=({0: BATCH},), check_inputs=[torch.randn(1, 8), torch.randn(17, 8)]
    )
    assert _signature(edge) == ([(-1, 8)], [(-1, 4)])


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1, groups=8),
            nn.ReLU(),
        )
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1)).softmax(-1)


def test_cnn_dynamic_batch():
    edge = assert_converts(
        SmallCNN().eval(),
        (torch.randn(2, 3, 8, 8),),
        dynamic_shapes=({0: BATCH},),
        check_inputs=[torch.randn(1, 3, 8, 8), torch.randn(5, 3, 8, 8)],
    )
    assert _signature(edge)[0] == [(-1, 3, 8, 8)]


def test_transformer_encoder_dynamic_batch_and_sequence():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    edge = assert_converts(
        layer,
        (torch.randn(2, 6, 16),),
        dynamic_shapes=({0: BATCH, 1: SEQ},),
        check_inputs=[torch.randn(1, 4, 16), torch.randn(3, 11, 16)],
    )
    assert _signature(edge) == ([(-1, -1, 16)], [(-1, -1, 16)])


class CausalSelfAttention(nn.Module):
    """Hand-written attention: head split with view(B, T, heads, -1), a causal mask from
    arange(T), and a learned positional table sliced to T."""

    def __init__(self, dim: int = 16, heads: int = 2, max_len: int = 64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.1)

    def forward(self, x):
        B, T, C = x.shape
        x = x + self.pos[:T]
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (C // self.heads) ** 0.5
        steps = torch.arange(T)
        scores = scores.masked_fill(steps[None, :] > steps[:, None], float("-inf"))
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_hand_written_attention_dynamic_sequence():
    seq = Dim("seq", min=2, max=64)  # the positional table holds 64 positions
    assert_converts(
        CausalSelfAttention(),
        (torch.randn(2, 5, 16),),
        dynamic_shapes=({0: BATCH, 1: seq},),
        check_inputs=[torch.randn(1, 9, 16), torch.randn(4, 4, 16)],
    )


def test_causal_sdpa_dynamic_sequence():
    """is_causal attention over a run-time length: the mask is built from RANGE comparisons."""

    class Causal(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    qkv = tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
    spec = {0: BATCH, 2: SEQ}
    assert_converts(
        Causal(),
        qkv,
        dynamic_shapes=(spec, spec, spec),
        check_inputs=[tuple(torch.randn(1, 2, 9, 8) for _ in range(3))],
    )


def test_fully_convolutional_dynamic_height_and_width():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )
    height, width = Dim("height", min=4, max=512), Dim("width", min=4, max=512)
    assert_converts(
        net,
        (torch.randn(2, 3, 8, 8),),
        dynamic_shapes=({0: BATCH, 2: 2 * height, 3: 2 * width},),
        check_inputs=[torch.randn(1, 3, 12, 6), torch.randn(3, 3, 32, 16)],
    )


def test_lstm_dynamic_batch():
    lstm = nn.LSTM(6, 8, bidirectional=True, batch_first=True)
    edge = assert_converts(
        lstm,
        (torch.randn(3, 5, 6),),
        dynamic_shapes=({0: BATCH},),
        check_inputs=[torch.randn(1, 5, 6), torch.randn(9, 5, 6)],
    )
    assert _signature(edge)[1] == [(-1, 5, 16), (2, -1, 8), (2, -1, 8)]


@pytest.mark.slow
def test_gru_dynamic_batch_with_initial_state():
    gru = nn.GRU(6, 8, batch_first=True)
    assert_converts(
        gru,
        (torch.randn(3, 5, 6), torch.randn(1, 3, 8)),
        dynamic_shapes=({0: BATCH}, {1: BATCH}),
        check_inputs=[(torch.randn(6, 5, 6), torch.randn(1, 6, 8))],
    )


class SymbolicSizes(nn.Module):
    """reshape/view/flatten/expand/arange/slicing/zeros whose sizes depend on symbols."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x):  # (B, T, 8)
        B, T, C = x.shape
        heads = x.view(B, T, 2, C // 2).transpose(1, 2).reshape(B * 2, T, C // 2)
        with_cls = torch.cat([self.cls.expand(B, -1, -1), x], dim=1)
        positions = torch.arange(T) * 2 + 1
        shifted = x[:, 1:] - x[:, : T - 1]
        middle = x[:, 1 : T - 1]
        last, first = x[:, -1], x[:, 0]
        flat = x.flatten(1)
        pad = torch.zeros(B, 2, C)
        return (
            heads,
            with_cls,
            positions,
            shifted,
            middle,
            last,
            first,
            flat,
            torch.cat([x, pad], 1),
            x[:, -2:],
            x[:, T - 2],
        )


def test_symbolic_sizes():
    edge = assert_converts(
        SymbolicSizes(),
        (torch.randn(2, 6, 8),),
        dynamic_shapes=({0: BATCH, 1: SEQ},),
        check_inputs=[torch.randn(3, 9, 8), torch.randn(1, 4, 8)],
    )
    ops = {op.opcode for op in edge.ir_model.graphs[0].ops}
    assert {"SHAPE", "RANGE", "BROADCAST_TO", "FILL", "STRIDED_SLICE"} <= ops


def test_conv1d_audio_dynamic_length():
    """A 1-D conv stack over waveforms of any length (dynamic time axis)."""
    net = nn.Sequential(nn.Conv1d(1, 8, 9, stride=4, padding=4), nn.ReLU(), nn.Conv1d(8, 8, 3, padding=1), nn.ReLU())
    length = Dim("samples", min=16, max=16000)
    edge = assert_converts(
        net,
        (torch.randn(2, 1, 64),),
        dynamic_shapes=({0: BATCH, 2: 4 * length},),
        check_inputs=[torch.randn(1, 1, 128), torch.randn(3, 1, 400)],
    )
    assert _signature(edge)[0] == [(-1, 1, -1)]


def test_wrong_static_dim_is_a_clear_error():
    edge = litert_torch.convert(nn.Linear(8, 4), (torch.randn(3, 8),), dynamic_shapes=({0: BATCH},))
    with pytest.raises(ValueError, match=r"shape \(3, 5\), the model expects \[\?, 8\]"):
        edge(np.zeros((3, 5), np.float32))
    static = litert_torch.convert(nn.Linear(8, 4), (torch.randn(3, 8),))
    with pytest.raises(ValueError, match="dynamic_shapes"):
        static(np.zeros((4, 8), np.float32))


def test_dynamic_sequence_lstm_is_a_clear_error():
    """torch.export fixes nn.LSTM's sequence length (its shape rule unrolls the loop): the
    error names the model and the recurrent layer, and says what to keep static."""

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 4, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    with pytest.raises((ConversionError, UnsupportedOpsError)) as info:
        litert_torch.convert(Tagger(), (torch.randn(2, 6, 4),), dynamic_shapes=({1: SEQ},))
    text = str(info.value)
    assert "Tagger" in text and "recurrent layer(s) lstm" in text and "sequence length" in text


def test_data_dependent_size_names_the_op_and_line():
    class Positive(nn.Module):
        def forward(self, x):
            return x[x > 0].sum()[None] * torch.ones(int((x > 0).sum()))

    with pytest.raises((ConversionError, UnsupportedOpsError)) as info:
        litert_torch.convert(Positive(), (torch.randn(3, 4),))
    assert "test_dynamic_shapes.py" in str(info.value)


# ---- transformers models (random weights from configs), dynamic batch and sequence -------------


def _hf_case(name: str):
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    small = dict(num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    if name == "bert":
        return BertModel(BertConfig(vocab_size=50, hidden_size=16, **small)), True
    if name == "gpt2":
        return GPT2Model(
            GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
        ), False
    return LlamaModel(LlamaConfig(vocab_size=50, hidden_size=16, num_key_value_heads=1, **small)), False


class _LastHidden(nn.Module):
    def __init__(self, model, with_mask: bool):
        super().__init__()
        self.model, self.with_mask = model, with_mask

    def forward(self, ids, mask=None):
        kwargs = {"attention_mask": mask} if self.with_mask else {"use_cache": False}
        return self.model(input_ids=ids, **kwargs).last_hidden_state


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_transformers_dynamic_batch_and_sequence(name):
    model, with_mask = _hf_case(name)
    wrapper = _LastHidden(model.eval(), with_mask)
    seq = Dim("seq", min=4, max=64)

    def inputs(batch, steps):
        ids = torch.randint(0, 50, (batch, steps))
        return (ids, torch.ones(batch, steps, dtype=torch.long)) if with_mask else (ids,)

    shapes = ({0: BATCH, 1: seq}, {0: BATCH, 1: seq}) if with_mask else ({0: BATCH, 1: seq},)
    assert_converts(wrapper, inputs(2, 6), dynamic_shapes=shapes, check_inputs=[inputs(1, 9), inputs(3, 4)])
