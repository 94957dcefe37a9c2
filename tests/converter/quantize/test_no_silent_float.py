"""Nothing left float without a word: a full-integer scheme quantizes every op it can,
and every op that stays float is reported (a QuantizationWarning and
`edge.quant_report`: the op, the user's layer, why)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import litert_torch
from benchmarks.zoo.inception import inception_v3
from converter.quantize import QuantizationWarning
from litert_torch import quantize
from tests.converter.quantize.test_quantize import _model, _rel_error, assert_fully_integer


def _convert_inception(width: float, std: float, size: int, samples: int, float_file: bool):
    torch.manual_seed(0)
    model = inception_v3(width=width, std=std)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(100))
    calibration = [(torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(i)),) for i in range(samples)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)  # a float op would raise here
        edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    if float_file:
        float_size = len(litert_torch.convert(model, (x,)).model_content())
    else:  # the float32 parameters' bytes (a little less than the float file): saves a conversion
        float_size = 4 * sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        expected = model(x).numpy()
    return edge, x, expected, float_size


def _check_inception(edge, x, expected, float_size):
    # Random-weight Inception-v3's activations reach ~1e8 (small) to ~1e11 (full): once
    # taken for mask sentinels, they left half the convolutions float.
    ops = edge.ir_model.graphs[0].ops
    assert sum(op.opcode == "CONV_2D" and op.outputs[0].dtype == np.int8 for op in ops) == 94
    assert_fully_integer(edge)
    assert len(edge.model_content()) <= 0.27 * float_size
    actual = edge(x)
    assert _rel_error(actual, expected) < 0.1
    assert np.argmax(actual) == np.argmax(expected)


def test_inception_v3_with_huge_activations_quantizes_fully():
    _check_inception(*_convert_inception(width=0.25, std=0.2, size=75, samples=4, float_file=False))


@pytest.mark.slow
def test_torchvision_sized_inception_v3_quantizes_fully():
    _check_inception(*_convert_inception(width=1.0, std=0.1, size=299, samples=8, float_file=True))


class SentinelSum(nn.Module):
    """A -3.4e38 constant added to activations that no softmax reads: nothing int8 can do."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("mask", torch.triu(torch.full((6, 16), torch.finfo(torch.float32).min), diagonal=1))

    def forward(self, x):
        return self.proj(torch.relu(self.proj(x) + self.mask))


def test_float_ops_are_reported_with_layer_and_reason():
    model = _model(SentinelSum)
    x = torch.randn(1, 6, 16)
    calibration = [(torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    with pytest.warns(QuantizationWarning, match=r"1 op\(s\) stay float32 \(ADD in \(model\): constant input 1"):
        edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    report = edge.quant_report
    # the relu is fused into the ADD; the projections around it are int8
    assert [(f.op, f.requested) for f in report.float_ops] == [("ADD", False)]
    assert "constant input 1 holds sentinel values" in report.float_ops[0].reason
    assert report.to_dict()["float_ops"][0]["op"] == "ADD"
    # every op not in the report computes in int8
    floats = [
        op
        for op in edge.ir_model.graphs[0].ops
        if op.outputs[0].dtype == np.float32 and op.opcode not in ("DEQUANTIZE",)
    ]
    assert sorted(op.opcode for op in floats) == sorted(f.op for f in report.float_ops)


class ConvGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.exp(self.conv(x)).mean((2, 3)))


def test_kept_layers_are_reported_as_requested_and_missing_kernels_warned():
    model = _model(ConvGelu)
    x = torch.randn(1, 3, 8, 8)
    calibration = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(3)]
    with pytest.warns(QuantizationWarning, match="EXP in conv.*no int8 kernel for EXP|EXP in .*no int8 kernel"):
        edge = litert_torch.convert(
            model, (x,), quant_config=quantize.full_int8(keep_float=["head"]), calibration_data=calibration
        )
    by_op = {f.op: f for f in edge.quant_report.float_ops}
    assert by_op["FULLY_CONNECTED"].requested and by_op["FULLY_CONNECTED"].layer == "head"
    assert not by_op["EXP"].requested and "no int8 kernel for EXP" in by_op["EXP"].reason
    assert "[keep_float] head: 1 op(s) (FULLY_CONNECTED)" in str(edge.quant_report)


def test_weight_only_schemes_have_no_report():
    model = _model(ConvGelu)
    edge = litert_torch.convert(model, (torch.randn(1, 3, 8, 8),), quant_config=quantize.dynamic_int8())
    assert edge.quant_report is None


class PaddedMaxPool(nn.Module):
    """ResNet's stem: conv, batch norm, relu, 3x3/2 max pool with padding 1 (lowered as a
    PADV2 with -3.4e38 padding and a MAX_POOL_2D)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return self.pool(self.conv(x))  # no relu: negative maxima at the border matter


def test_max_pool_padding_with_minus_infinity_quantizes():
    model = _model(PaddedMaxPool)
    x = torch.randn(1, 3, 12, 12)
    calibration = [(torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    assert "PADV2" in [op.opcode for op in edge.ir_model.graphs[0].ops]
    assert_fully_integer(edge)
    with torch.no_grad():
        assert _rel_error(edge(x), model(x).numpy()) < 0.03


class HardSigmoidGate(nn.Module):
    """GhostNet/MobileNetV3's gate written by hand: x * relu6(x + 3) / 6 (a DIV by a constant)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y * (F.relu6(y + 3) / 6)


def test_division_by_a_constant_quantizes_as_a_multiplication():
    model = _model(HardSigmoidGate)
    x = torch.randn(1, 3, 8, 8)
    calibration = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    float_ops = [op.opcode for op in litert_torch.convert(model, (x,)).ir_model.graphs[0].ops]
    assert "DIV" in float_ops
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    assert_fully_integer(edge)
    kept = litert_torch.convert(
        model, (x,), quant_config=quantize.full_int8(keep_float=["DIV"]), calibration_data=calibration
    )
    assert "DIV" in [op.opcode for op in kept.ir_model.graphs[0].ops]
    with torch.no_grad():
        expected = model(x).numpy()
    # as accurate as with the division in float (both ~0.12 RMS here: the same with MUL,
    # ADD or CONV_2D kept float, so it is the input's range from 4 calibration samples)
    assert _rel_error(edge(x), expected) <= 1.05 * _rel_error(kept(x), expected) + 0.005
