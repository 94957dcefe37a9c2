"""The pass pipeline on real PyTorch models: converted graphs match PyTorch in LiteRT
(rtol 1e-4) and have the op counts a hand-written TFLite model would have."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from converter.passes import opcode_histogram
from tests.helpers import assert_converts


def bn(channels):
    """A batch norm with non-trivial statistics (a fresh one is an identity)."""
    norm = nn.BatchNorm2d(channels)
    with torch.no_grad():
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 1.5)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    return norm


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), bn(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), bn(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), bn(8), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(8), ResidualBlock(8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual add."""

    def __init__(self, channels, expand=4):
        super().__init__()
        hidden = channels * expand
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            bn(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            bn(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1, bias=False),
            bn(channels),
        )

    def forward(self, x):
        return x + self.body(x)


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), bn(16), nn.ReLU())
        self.dec = nn.Sequential(nn.Conv2d(24, 8, 3, padding=1), bn(8), nn.ReLU())
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        skip = self.enc(x)
        y = self.mid(F.max_pool2d(skip, 2))
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        return self.head(self.dec(torch.cat([y, skip], dim=1)))


def converted_histogram(module, *shape):
    torch.manual_seed(0)
    edge = assert_converts(module.eval(), (torch.randn(*shape),), rtol=1e-4)
    return opcode_histogram(edge.ir_model.graphs[0]), edge.ir_model.graphs[0]


def test_conv_bn_relu_stack():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), bn(8), nn.ReLU6()
    )
    hist, graph = converted_histogram(model, 1, 3, 12, 12)
    assert hist == {"TRANSPOSE": 2, "CONV_2D": 2}
    assert [op.options["fusedActivationFunction"] for op in graph.ops if op.opcode == "CONV_2D"] == ["RELU", "RELU6"]


def test_residual_network_has_no_batch_norm_fused_relus_and_one_transpose():
    torch.manual_seed(0)
    hist, graph = converted_histogram(ResNetish(), 2, 3, 8, 8)
    assert hist.get("TRANSPOSE") == 1 and graph.ops[0].opcode == "TRANSPOSE"
    assert "MUL" not in hist and "RELU" not in hist
    assert hist["CONV_2D"] == 5 and hist["ADD"] == 2
    assert len(graph.ops) == 1 + 5 + 2 + 1 + 1  # transpose, convs, adds, mean, fully connected


def test_depthwise_inverted_residual():
    torch.manual_seed(0)
    hist, _ = converted_histogram(InvertedResidual(8), 1, 8, 10, 10)
    assert hist == {"TRANSPOSE": 2, "CONV_2D": 2, "DEPTHWISE_CONV_2D": 1, "ADD": 1}


def test_tiny_unet_with_concat_and_upsample():
    torch.manual_seed(0)
    hist, graph = converted_histogram(TinyUNet(), 1, 3, 16, 16)
    assert hist["TRANSPOSE"] == 2
    assert "MUL" not in hist and "RELU" not in hist
    concat = next(op for op in graph.ops if op.opcode == "CONCATENATION")
    assert concat.options["axis"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("name, anchor_ops", [("resnet18", 37), ("mobilenet_v2", 70)])
def test_zoo_cnn_op_counts_match_or_beat_the_anchor(name, anchor_ops):
    import benchmarks.zoo.cnn  # noqa: F401  (registers the CNNs)
    from benchmarks.zoo import registry

    model, args = registry.build(name)
    edge = assert_converts(model, args, rtol=1e-4)
    graph = edge.ir_model.graphs[0]
    hist = opcode_histogram(graph)
    print(name, len(graph.ops), hist)
    assert hist["TRANSPOSE"] == 1 and len(graph.ops) <= anchor_ops
