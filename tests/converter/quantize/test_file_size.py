"""What a full-int8 file stores above a quarter of the float file, on a depthwise-separable
network (the kind that misses 0.27x): int8 weights, int32 biases, and per output channel a
float32 weight scale and a float32 bias scale; int64 zero points once per channel count.
The bias scales and zero points are needed (XNNPACK rejects convolutions whose bias has no
quantization; the interpreter rejects scales without zero points), so the test also checks
that XNNPACK takes the whole graph and that the outputs match PyTorch."""

from __future__ import annotations

import struct

import numpy as np
import torch
from ai_edge_litert.interpreter import Interpreter
from torch import nn

import litert_torch
from litert_torch import quantize

TABLE_BYTES = 160  # generous per-tensor bound for a tensor table + quantization table + name


def _separable(width: int = 64, blocks: int = 4) -> nn.Module:
    layers = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(blocks):  # equal widths: the zero-point vectors can be shared
        layers += [
            nn.Conv2d(width, width, 3, padding=1, groups=width),
            nn.ReLU(),
            nn.Conv2d(width, width, 1),
            nn.ReLU(),
        ]
    torch.manual_seed(0)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(width, 10)).eval()


def test_full_int8_stores_per_channel_parameters_once_and_runs_on_xnnpack():
    model, width = _separable(), 64
    calibration = [(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(i)),) for i in range(8)]
    float_size = len(litert_torch.convert(model, calibration[0]).model_content())
    edge = litert_torch.convert(model, calibration[0], quant_config=quantize.full_int8(), calibration_data=calibration)
    content = edge.model_content()

    # one all-zero int64 zero-point vector per distinct channel count (64 and 10), each
    # with its uint32 length in front, shared by every weight and bias of that width
    for channels in (width, 10):
        assert content.count(struct.pack("<I", channels) + bytes(8 * channels)) == 1, channels

    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    channels = sum(m.weight.shape[0] for m in layers)
    per_channel = channels * (4 + 4 + 3)  # weight scale, bias scale, int32 bias beyond 1/4 of float
    zero_points = 8 * (width + 10)
    tensors = len(edge.ir_model.graphs[0].ops) * 3
    excess = len(content) - float_size / 4
    assert per_channel < excess <= per_channel + zero_points + TABLE_BYTES * tensors, (excess, per_channel)

    interpreter = Interpreter(model_content=content)  # XNNPACK by default
    interpreter.allocate_tensors()
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert ops.count("DELEGATE") == 1, ops  # every conv delegated: one partition
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(100))
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.numpy())
    interpreter.invoke()
    actual = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(actual - expected).max() <= 0.05 * np.abs(expected).max()


class _Ghost(nn.Module):
    """GhostNet's pattern: a 1x1 conv and a cheap depthwise conv on it, concatenated; the
    two halves have ranges ~10x apart."""

    def __init__(self):
        super().__init__()
        self.primary = nn.Conv2d(8, 16, 1)
        self.cheap = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = nn.Conv2d(32, 8, 1)
        with torch.no_grad():
            self.cheap.weight.mul_(0.1)  # the union is the first half's range

    def forward(self, x):
        a = torch.relu(self.primary(x))
        return self.head(torch.cat([a, self.cheap(a)], 1))


def test_concat_inputs_are_written_at_the_concat_scale():
    """int8 CONCATENATION needs equal input and output scales: the depthwise conv writes the
    union range directly (no requantizing QUANTIZE; `a` also feeds the depthwise conv, so it
    keeps its own range and is requantized), and the result still matches PyTorch."""
    torch.manual_seed(0)
    model = _Ghost().eval()
    calibration = [(torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(8)]
    edge = litert_torch.convert(model, calibration[0], quant_config=quantize.full_int8(), calibration_data=calibration)
    graph = edge.ir_model.graphs[0]
    concat = next(op for op in graph.ops if op.opcode == "CONCATENATION")
    producers = {t.id: op.opcode for op in graph.ops for t in op.outputs}
    assert [producers[t.id] for t in concat.inputs] == ["QUANTIZE", "DEPTHWISE_CONV_2D"]
    assert sum(op.opcode == "QUANTIZE" for op in graph.ops) == 2  # the model input, `a`
    x = torch.randn(1, 8, 8, 8, generator=torch.Generator().manual_seed(100))
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(edge(x) - expected).max() <= 0.03 * np.abs(expected).max()
