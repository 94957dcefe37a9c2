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
