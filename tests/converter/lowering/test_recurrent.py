"""Sequence models: nn.LSTM / nn.GRU (recurrent.py) and conv1d audio front ends.

Every case converts, runs in LiteRT and matches PyTorch (max relative error <= 1e-4) on
the output sequence AND the final states. Batch 3 exercises the unrolled form, batch 1
LiteRT's fused LSTM. The default suite runs a representative
subset; `-m slow` sweeps every combination of direction, depth, batch_first, initial
states and biases.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
import torch.nn as nn

from tests.helpers import assert_converts

torch.manual_seed(0)


def _args(kind: str, layer: nn.Module, batch: int = 3, steps: int = 5, initial_state: bool = False) -> tuple:
    x = (
        torch.randn(batch, steps, layer.input_size)
        if layer.batch_first
        else torch.randn(steps, batch, layer.input_size)
    )
    if not initial_state:
        return (x,)
    directions = 2 if layer.bidirectional else 1
    h = torch.randn(layer.num_layers * directions, batch, getattr(layer, "proj_size", 0) or layer.hidden_size)
    if kind == "LSTM":
        return (x, (h, torch.randn(layer.num_layers * directions, batch, layer.hidden_size)))
    return (x, h)


def opcodes(edge) -> Counter:
    return Counter(op.opcode for op in edge.ir_model.graphs[0].ops)


# (kind, bidirectional, layers, batch_first, initial_state, bias)
FAST = [
    ("LSTM", True, 2, False, True, True),
    ("GRU", True, 2, True, True, True),
    ("GRU", False, 1, False, False, False),
]
SWEEP = [
    c
    for c in itertools.product(["LSTM", "GRU"], [False, True], [1, 2, 3], [True, False], [False, True], [True, False])
    if c not in FAST
]


def _check(kind, bidirectional, layers, batch_first, initial_state, bias):
    layer = getattr(nn, kind)(6, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias)
    return assert_converts(layer, _args(kind, layer, initial_state=initial_state))


@pytest.mark.parametrize("kind,bidirectional,layers,batch_first,initial_state,bias", FAST)
def test_recurrent_matches_pytorch(kind, bidirectional, layers, batch_first, initial_state, bias):
    _check(kind, bidirectional, layers, batch_first, initial_state, bias)


@pytest.mark.slow
@pytest.mark.parametrize("kind,bidirectional,layers,batch_first,initial_state,bias", SWEEP)
def test_recurrent_sweep(kind, bidirectional, layers, batch_first, initial_state, bias):
    _check(kind, bidirectional, layers, batch_first, initial_state, bias)


LSTM_BATCH_ONE = list(itertools.product([False, True], [1, 2], [True, False], [False, True], [True, False]))


def _check_batch_one(bidirectional, layers, batch_first, initial_state, bias):
    """Batch 1 takes LiteRT's fused UNIDIRECTIONAL_SEQUENCE_LSTM (one per layer and
    direction); its state variables are refreshed on every call, so repeated calls with
    new inputs and states stay exact."""
    layer = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias)
    edge = assert_converts(
        layer,
        _args("LSTM", layer, batch=1, initial_state=initial_state),
        check_inputs=[_args("LSTM", layer, batch=1, initial_state=initial_state) for _ in range(2)],
    )
    assert opcodes(edge)["UNIDIRECTIONAL_SEQUENCE_LSTM"] == layers * (2 if bidirectional else 1)


def test_lstm_batch_one_uses_the_fused_builtin():
    _check_batch_one(True, 2, True, True, True)


@pytest.mark.slow
@pytest.mark.parametrize("bidirectional,layers,batch_first,initial_state,bias", LSTM_BATCH_ONE)
def test_lstm_batch_one_sweep(bidirectional, layers, batch_first, initial_state, bias):
    _check_batch_one(bidirectional, layers, batch_first, initial_state, bias)


def test_lstm_is_unrolled_with_one_input_projection():
    """One FULLY_CONNECTED projects the whole sequence; each step adds one recurrent
    FULLY_CONNECTED, except the first (zero initial state); gates take one LOGISTIC and
    two TANH per step."""
    steps = 6
    layer = nn.LSTM(8, 16, batch_first=True)
    ops = opcodes(assert_converts(layer, (torch.randn(2, steps, 8),)))
    assert ops["FULLY_CONNECTED"] == 1 + (steps - 1)
    assert ops["LOGISTIC"] == steps and ops["TANH"] == 2 * steps
    assert ops["UNPACK"] == 1 and ops["PACK"] == 3  # the sequence, h_n, c_n


def test_lstm_projection():
    layer = nn.LSTM(6, 8, proj_size=3, num_layers=2)
    assert_converts(layer, _args("LSTM", layer, initial_state=True))


@pytest.mark.slow
def test_unbatched_input():
    layer = nn.GRU(6, 5)
    assert_converts(layer, (torch.randn(4, 6),))


class SpeechTagger(nn.Module):
    """A typical on-device sequence model: embedding, bidirectional LSTM, per-step classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.lstm = nn.LSTM(12, 16, bidirectional=True, batch_first=True)
        self.head = nn.Linear(32, 7)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out).log_softmax(-1)


def test_lstm_inside_a_model():
    assert_converts(SpeechTagger(), (torch.randint(0, 50, (2, 5)),))


def test_training_dropout_is_reported():
    layer = nn.LSTM(4, 4, num_layers=2, dropout=0.5)
    with pytest.raises(Exception, match="dropout"):
        assert_converts(layer, (torch.randn(3, 1, 4),), eval_mode=False)


# ---- conv1d audio front ends ----------------------------------------------------------------


class Wav2Vec2FeatureEncoder(nn.Module):
    """Wav2Vec2's convolutional feature encoder (group-norm variant), scaled down: a raw
    waveform through strided conv1d + GELU layers, then a feature projection."""

    def __init__(self, dim: int = 32, kernels=(10, 3, 3, 2), strides=(5, 2, 2, 2)):
        super().__init__()
        layers = []
        for k, (kernel, stride) in enumerate(zip(kernels, strides)):
            layers.append(nn.Conv1d(1 if k == 0 else dim, dim, kernel, stride=stride, bias=False))
            if k == 0:
                layers.append(nn.GroupNorm(dim, dim))
            layers.append(nn.GELU())
        self.conv = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dim)
        self.project = nn.Linear(dim, 48)

    def forward(self, waveform):  # (batch, samples)
        features = self.conv(waveform[:, None]).transpose(1, 2)
        return self.project(self.norm(features))


class LogMelFrontEnd(nn.Module):
    """A mel-spectrogram-like front end: framing + DFT as one strided conv1d (cos and sin
    filters), power, mel filterbank as a 1x1 conv1d, log; then a small conv classifier."""

    def __init__(self, n_fft: int = 64, hop: int = 16, mels: int = 20):
        super().__init__()
        t = torch.arange(n_fft, dtype=torch.float32)
        bins = torch.arange(n_fft // 2 + 1, dtype=torch.float32)[:, None]
        window = torch.hann_window(n_fft)
        dft = torch.cat([torch.cos(2 * torch.pi * bins * t / n_fft), -torch.sin(2 * torch.pi * bins * t / n_fft)])
        self.dft = nn.Conv1d(1, dft.shape[0], n_fft, stride=hop, bias=False)
        self.dft.weight.data = (dft * window)[:, None, :]
        self.mel = nn.Conv1d(n_fft // 2 + 1, mels, 1, bias=False)
        self.mel.weight.data = torch.rand(mels, n_fft // 2 + 1, 1)
        self.classifier = nn.Sequential(
            nn.Conv1d(mels, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 5)
        )

    def forward(self, waveform):  # (batch, 1, samples)
        real, imag = self.dft(waveform).chunk(2, dim=1)
        log_mel = torch.log(self.mel(real * real + imag * imag) + 1e-6)
        return log_mel, self.classifier(log_mel)


def test_wav2vec2_feature_encoder():
    torch.manual_seed(1)
    assert_converts(Wav2Vec2FeatureEncoder(), (torch.randn(2, 400),))


def test_log_mel_front_end():
    torch.manual_seed(2)
    assert_converts(LogMelFrontEnd(), (torch.randn(2, 1, 512),))


@pytest.mark.slow
def test_conv1d_front_end_then_gru():
    """An audio keyword-spotting shape: conv1d feature stack -> GRU -> classifier."""

    class KeywordSpotter(nn.Module):
        def __init__(self):
            super().__init__()
            self.front = nn.Sequential(
                nn.Conv1d(1, 8, 9, stride=4), nn.ReLU(), nn.Conv1d(8, 12, 3, stride=2), nn.ReLU()
            )
            self.gru = nn.GRU(12, 16, batch_first=True)
            self.head = nn.Linear(16, 4)

        def forward(self, waveform):
            features = self.front(waveform).transpose(1, 2)
            _, h = self.gru(features)
            return self.head(h[-1])

    torch.manual_seed(3)
    assert_converts(KeywordSpotter(), (torch.randn(2, 1, 100),))
