"""Lazy constants: weights the lowering transposes and batch-norm folding scales are
computed once, by the writer, straight into the file. The file must be the very bytes
that computing every constant first (the eager way) gives, and run like PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import litert_torch
from converter import ir
from converter.writer import write_flatbuffer
from litert_torch import quantize
from runtimes.litert import LiteRTModel

from .test_writer import read


class ConvBNNet(nn.Module):
    """Conv + BN, depthwise conv + BN, a bias-free conv + BN and a classifier: every fold."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.Conv2d(16, 32, 1, bias=False),
            nn.BatchNorm2d(32),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def conv_bn_net() -> nn.Module:
    torch.manual_seed(0)
    net = ConvBNNet().eval()
    for m in net.modules():  # non-trivial statistics, so the folds change the weights
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return net


def lazy_constants(model: ir.Model) -> list[ir.LazyConstant]:
    return [t.constant for g in model.graphs for t in g.tensors() if isinstance(t.constant, ir.LazyConstant)]


def eager_bytes(model: ir.Model) -> bytes:
    """The file written after computing every constant (what the writer did before)."""
    for graph in model.graphs:
        for t in graph.tensors():
            t.data  # noqa: B018  (computes a lazy constant in place)
    assert not lazy_constants(model)
    return write_flatbuffer(model)


def test_folded_cnn_file_equals_the_eager_file_and_matches_torch():
    net, x = conv_bn_net(), torch.randn(1, 3, 12, 12)
    edge = litert_torch.convert(net, (x,))
    lazy = lazy_constants(edge.ir_model)
    assert sum(1 for c in lazy if c.scales) == 3  # the three convolutions' folded filters
    assert edge.model_content() == eager_bytes(edge.ir_model)
    np.testing.assert_allclose(edge(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [quantize.dynamic_int8, quantize.float16], ids=["dynamic_int8", "float16"])
def test_quantized_file_equals_the_eager_file(config):
    net, x = conv_bn_net(), torch.randn(1, 3, 12, 12)
    edge = litert_torch.convert(net, (x,), quant_config=config())
    assert edge.model_content() == eager_bytes(edge.ir_model)
    reference = net(x).detach().numpy()
    np.testing.assert_allclose(edge(x.numpy()), reference, atol=0.05 * np.abs(reference).max())


def test_recipe_matches_numpy():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    s1 = rng.standard_normal((6, 1, 1, 1), dtype=np.float32)
    s2 = rng.standard_normal((1, 1, 1, 4), dtype=np.float32)
    lazy = ir.transposed(w, (0, 2, 3, 1)).scaled(s1.transpose(0, 2, 3, 1)).scaled(s2)
    expected = np.transpose(w, (0, 2, 3, 1)) * s1.transpose(0, 2, 3, 1) * s2
    values = lazy.materialize()
    assert values.flags.c_contiguous and values.dtype == np.float32
    np.testing.assert_array_equal(values, expected)
    positions = np.array([0, 7, 100, expected.size - 1])
    np.testing.assert_array_equal(lazy.take(positions), expected.reshape(-1)[positions])
    # transposing a scaled recipe moves its scales along
    np.testing.assert_array_equal(lazy.transpose((3, 0, 1, 2)).materialize(), np.transpose(expected, (3, 0, 1, 2)))
    assert np.shares_memory(lazy.source, w)  # nothing was copied to build it


def test_writer_shares_equal_lazy_and_eager_constants():
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    perm = (2, 0, 1)
    first = ir.Tensor("first", (4, 2, 3), np.float32, data=ir.transposed(w, perm))
    same_recipe = ir.Tensor("same_recipe", (4, 2, 3), np.float32, data=ir.transposed(w, perm))
    eager = ir.Tensor("eager", (4, 2, 3), np.float32, data=np.ascontiguousarray(np.transpose(w, perm)))
    other = ir.Tensor("other", (4, 2, 3), np.float32, data=ir.transposed(w, perm).scaled(np.float32([2])))
    x = ir.Tensor("x", (4, 2, 3), np.float32)
    outs = [ir.Tensor(f"y{i}", (4, 2, 3), np.float32) for i in range(4)]
    ops = [ir.Op("ADD", [x, c], [y]) for c, y in zip([first, same_recipe, eager, other], outs)]
    content = write_flatbuffer(ir.Model([ir.Graph(inputs=[x], outputs=outs, ops=ops)]))
    sg = read(content).Subgraphs(0)
    buffer_of = {sg.Tensors(i).Name().decode(): sg.Tensors(i).Buffer() for i in range(sg.TensorsLength())}
    assert buffer_of["first"] == buffer_of["same_recipe"] == buffer_of["eager"] != buffer_of["other"]
    results = LiteRTModel(content).run([np.zeros((4, 2, 3), np.float32)])
    np.testing.assert_array_equal(results[2], np.transpose(w, perm))
    np.testing.assert_array_equal(results[3], 2 * np.transpose(w, perm))


def test_external_data_layout_writes_lazy_constants():
    net, x = conv_bn_net(), torch.randn(1, 3, 12, 12)
    edge = litert_torch.convert(net, (x,))
    external = write_flatbuffer(edge.ir_model, external_data_threshold=0)
    np.testing.assert_array_equal(LiteRTModel(external).run([x.numpy()])[0], edge(x.numpy()))
