"""torch.ao PT2E / QAT models: their quantize/dequantize pairs decide the integer model.

torch 2.13 moved `prepare_pt2e`/`convert_pt2e` to torchao, which this environment does not
install; the module below is written the way `convert_pt2e` leaves a model (checked
against torchao 0.18's XNNPACKQuantizer output): int8 per-channel weight buffers read
through `dequantize_per_channel`, activations fake-quantized by
`quantize_per_tensor` -> `dequantize_per_tensor` pairs with fixed scales and zero points.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.ao.quantization.fx import _decomposed  # noqa: F401  (defines quantized_decomposed)

import litert_torch
from litert_torch import quantize

qd = torch.ops.quantized_decomposed
ACTIVATIONS = {"x": (0.02, 4), "conv": (0.01, -128), "pool": (0.005, -128), "out": (0.003, 10)}


def _int8_per_channel(w: torch.Tensor):
    scale = w.abs().amax(dim=tuple(range(1, w.dim()))) / 127
    shape = (-1,) + (1,) * (w.dim() - 1)
    return torch.round(w / scale.reshape(shape)).to(torch.int8), scale.double()


class ConvertedPT2E(torch.nn.Module):
    """conv-relu, global pool, linear: as convert_pt2e returns it."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        for name, shape in (("conv", (8, 3, 3, 3)), ("fc", (4, 8))):
            q, scale = _int8_per_channel(torch.randn(shape, generator=g) * 0.3)
            self.register_buffer(f"{name}_q", q)
            self.register_buffer(f"{name}_scale", scale)
            self.register_buffer(f"{name}_zero", torch.zeros(shape[0], dtype=torch.int64))
        self.conv_bias = torch.nn.Parameter(torch.randn(8, generator=g) * 0.1)
        self.fc_bias = torch.nn.Parameter(torch.randn(4, generator=g) * 0.1)

    @staticmethod
    def fake_quant(x, key):
        scale, zero = ACTIVATIONS[key]
        q = qd.quantize_per_tensor(x, scale, zero, -128, 127, torch.int8)
        return qd.dequantize_per_tensor(q, scale, zero, -128, 127, torch.int8)

    def weight(self, name):
        return qd.dequantize_per_channel(
            getattr(self, f"{name}_q"),
            getattr(self, f"{name}_scale"),
            getattr(self, f"{name}_zero"),
            0,
            -127,
            127,
            torch.int8,
        )

    def forward(self, x):
        x = self.fake_quant(x, "x")
        y = self.fake_quant(torch.relu(F.conv2d(x, self.weight("conv"), self.conv_bias)), "conv")
        y = self.fake_quant(y.mean((2, 3)), "pool")
        return self.fake_quant(F.linear(y, self.weight("fc"), self.fc_bias), "out")


@pytest.fixture(scope="module")
def pt2e_model():
    model = ConvertedPT2E().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x).numpy()
    return model, x, expected


def test_pt2e_model_converts_to_integer_ops_with_its_own_parameters(pt2e_model):
    model, x, expected = pt2e_model
    edge = litert_torch.convert(model, (x,))  # no quant_config: the pairs are found and honoured
    ops = edge.ir_model.graphs[0].ops
    assert [op.opcode for op in ops] == ["QUANTIZE", "TRANSPOSE", "CONV_2D", "MEAN", "FULLY_CONNECTED", "DEQUANTIZE"]
    quantize_input = ops[0].outputs[0].quant
    assert quantize_input.scale[0] == pytest.approx(0.02) and quantize_input.zero_point[0] == 4
    conv = ops[2]
    assert conv.outputs[0].quant.scale[0] == pytest.approx(0.01) and conv.outputs[0].quant.zero_point[0] == -128
    # the weights are PT2E's integers (OIHW -> OHWI), not re-rounded
    np.testing.assert_array_equal(conv.inputs[1].data, model.conv_q.permute(0, 2, 3, 1).numpy())
    np.testing.assert_allclose(conv.inputs[1].quant.scale, model.conv_scale.numpy(), rtol=1e-6)
    fc = ops[4]
    np.testing.assert_array_equal(fc.inputs[1].data, model.fc_q.numpy())
    assert fc.outputs[0].quant.scale[0] == pytest.approx(0.003) and fc.outputs[0].quant.zero_point[0] == 10
    # the integer model reproduces PyTorch's fake-quantized output to within one output step
    assert np.max(np.abs(edge(x) - expected)) <= 0.003 + 1e-6


def test_pt2e_with_integer_io(pt2e_model):
    model, x, expected = pt2e_model
    edge = litert_torch.convert(model, (x,), quant_config=quantize.pt2e(io="int8"))
    graph = edge.ir_model.graphs[0]
    assert graph.inputs[0].dtype == np.int8 and graph.outputs[0].dtype == np.int8
    xq = np.clip(np.round(x.numpy() / 0.02) + 4, -128, 127).astype(np.int8)
    y = (edge(xq).astype(np.float64) - 10) * 0.003
    assert np.max(np.abs(y - expected)) <= 0.003 + 1e-6
