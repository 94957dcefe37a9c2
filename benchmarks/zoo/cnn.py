"""Image classification CNNs, written from the papers' architecture descriptions.

Widths, depths and input sizes are the papers' unless an entry's summary says it is
reduced ("-ish", "-small"): reductions keep the topology and the op mix and only shrink
what makes a test slow.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .blocks import ClassifierHead, ConvBNAct, SqueezeExcite, make_divisible
from .registry import zoo_model

IMAGENET = [(1, 3, 224, 224)]


# ---------------------------------------------------------------------------- LeNet, AlexNet, VGG


@zoo_model("lenet5", [(1, 1, 32, 32)], "cnn", fast=True)
def lenet5():
    """LeNet-5: 5x5 convs, tanh, average pooling, three dense layers."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Flatten(1),
        nn.Linear(16 * 5 * 5, 120), nn.Tanh(),
        nn.Linear(120, 84), nn.Tanh(),
        nn.Linear(84, 10),
    )  # fmt: skip


@zoo_model("alexnet_small", IMAGENET, "cnn")
def alexnet_small():
    """AlexNet at half width (11x11 stride-4 conv, overlapping max pools, 6x6 adaptive pool, dropout FCs)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(32, 96, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(96, 192, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(192, 128, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(1),
        nn.Dropout(0.5), nn.Linear(128 * 36, 1024), nn.ReLU(inplace=True),
        nn.Dropout(0.5), nn.Linear(1024, 1024), nn.ReLU(inplace=True),
        nn.Linear(1024, 10),
    )  # fmt: skip


@zoo_model("vgg11_bn", IMAGENET, "cnn")
def vgg11_bn():
    """VGG-11 with batch norm at quarter width (3x3 conv stacks, 5 max pools, 7x7 adaptive pool)."""
    layers, cin = [], 3
    for v in [16, "M", 32, "M", 64, 64, "M", 128, 128, "M", 128, 128, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            cin = v
    return nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(1),
        nn.Linear(128 * 49, 512), nn.ReLU(inplace=True), nn.Dropout(),
        nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Dropout(),
        nn.Linear(512, 10),
    )  # fmt: skip


# ---------------------------------------------------------------------------- ResNet family


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride=1, groups=1, base_width=64):
        super().__init__()
        self.conv1 = ConvBNAct(cin, width, 3, stride)
        self.conv2 = ConvBNAct(width, width, 3, act=None)
        self.downsample = _projection(cin, width, stride)

    def forward(self, x):
        return F.relu(self.conv2(self.conv1(x)) + self.downsample(x))


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (grouped for ResNeXt, wider for Wide-ResNet) -> 1x1 expand (x4)."""

    expansion = 4

    def __init__(self, cin, planes, stride=1, groups=1, base_width=64):
        super().__init__()
        width = int(planes * base_width / 64) * groups
        self.conv1 = ConvBNAct(cin, width, 1)
        self.conv2 = ConvBNAct(width, width, 3, stride, groups=groups)
        self.conv3 = ConvBNAct(width, planes * 4, 1, act=None)
        self.downsample = _projection(cin, planes * 4, stride)

    def forward(self, x):
        return F.relu(self.conv3(self.conv2(self.conv1(x))) + self.downsample(x))


def _projection(cin, cout, stride):
    """The shortcut: identity when shapes match, else a strided 1x1 conv + batch norm."""
    if stride == 1 and cin == cout:
        return nn.Identity()
    return ConvBNAct(cin, cout, 1, stride, act=None)


class ResNet(nn.Module):
    """ResNet v1.5 (stride on the 3x3 conv): 7x7 stem, max pool, four stages, global pool."""

    def __init__(self, block, depths, groups=1, base_width=64, classes=10):
        super().__init__()
        self.stem = nn.Sequential(ConvBNAct(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, depth in enumerate(depths):
            planes = 64 * 2**i
            for j in range(depth):
                stages.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1, groups, base_width))
                cin = planes * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = ClassifierHead(cin, classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


@zoo_model("resnet18", IMAGENET, "cnn")
def resnet18():
    """ResNet-18: basic residual blocks [2, 2, 2, 2]."""
    return ResNet(BasicBlock, [2, 2, 2, 2])


@zoo_model("resnet50", IMAGENET, "cnn")
def resnet50():
    """ResNet-50: bottleneck residual blocks [3, 4, 6, 3]."""
    return ResNet(Bottleneck, [3, 4, 6, 3])


@zoo_model("resnext26_32x4d", [(1, 3, 128, 128)], "cnn")
def resnext26_32x4d():
    """ResNeXt-26 32x4d: bottlenecks with 32-group 3x3 convs, [2, 2, 2, 2], 128x128 input."""
    return ResNet(Bottleneck, [2, 2, 2, 2], groups=32, base_width=4)


class WidePreActBlock(nn.Module):
    """Wide-ResNet block: BN-ReLU-conv3x3-dropout-BN-ReLU-conv3x3 (pre-activation)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.dropout = nn.Dropout(0.3)
        self.shortcut = None if (stride == 1 and cin == cout) else nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.dropout(self.conv1(pre)))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


@zoo_model("wide_resnet16_4", [(1, 3, 32, 32)], "cnn", fast=True)
def wide_resnet16_4():
    """WRN-16-4 (CIFAR): pre-activation wide blocks, 3 stages of 2 blocks, widths 64/128/256."""
    layers, cin = [nn.Conv2d(3, 16, 3, padding=1, bias=False)], 16
    for stage, width in enumerate([64, 128, 256]):
        for j in range(2):
            layers.append(WidePreActBlock(cin, width, 2 if (j == 0 and stage > 0) else 1))
            cin = width
    layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), ClassifierHead(cin)]
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------- mobile networks


@zoo_model("mobilenet_v1", IMAGENET, "cnn")
def mobilenet_v1():
    """MobileNetV1 (width 1.0): depthwise-separable conv stack with ReLU."""
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    layers, cin = [ConvBNAct(3, 32, 3, 2)], 32
    for cout, stride in plan:
        layers += [ConvBNAct(cin, cin, 3, stride, groups=cin), ConvBNAct(cin, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, ClassifierHead(cin))


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and EfficientNet block: 1x1 expand -> kxk depthwise -> (SE) -> 1x1 project,
    with a residual connection when stride is 1 and channels match."""

    def __init__(self, cin, expanded, cout, kernel, stride, act=nn.ReLU6, se=None, eps=1e-5):
        super().__init__()
        layers = [] if expanded == cin else [ConvBNAct(cin, expanded, 1, act=act, eps=eps)]
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=act, eps=eps))
        if se is not None:
            layers.append(se(expanded))
        layers.append(ConvBNAct(expanded, cout, 1, act=None, eps=eps))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return out + x if self.residual else out


@zoo_model("mobilenet_v2", IMAGENET, "cnn")
def mobilenet_v2():
    """MobileNetV2 (width 1.0): inverted residuals with linear bottlenecks and ReLU6."""
    plan = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    layers, cin = [ConvBNAct(3, 32, 3, 2, act=nn.ReLU6)], 32
    for t, c, n, s in plan:
        for i in range(n):
            layers.append(InvertedResidual(cin, cin * t, c, 3, s if i == 0 else 1))
            cin = c
    layers.append(ConvBNAct(cin, 1280, 1, act=nn.ReLU6))
    return nn.Sequential(*layers, ClassifierHead(1280, dropout=0.2))


@zoo_model("mobilenet_v3_small", IMAGENET, "cnn")
def mobilenet_v3_small():
    """MobileNetV3-Small: hardswish, squeeze-excite with hardsigmoid gates, 5x5 depthwise convs."""
    RE, HS = nn.ReLU, nn.Hardswish
    plan = [  # kernel, expanded, out, squeeze-excite, activation, stride
        (3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
        (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
        (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
        (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1),
    ]  # fmt: skip
    layers, cin = [ConvBNAct(3, 16, 3, 2, act=HS, eps=1e-3)], 16
    for k, exp, cout, use_se, act, s in plan:
        se = (lambda ch: SqueezeExcite(ch, make_divisible(ch / 4), nn.ReLU, nn.Hardsigmoid)) if use_se else None
        layers.append(InvertedResidual(cin, exp, cout, k, s, act=act, se=se, eps=1e-3))
        cin = cout
    layers.append(ConvBNAct(cin, 576, 1, act=HS, eps=1e-3))
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
        nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(1024, 10),
    )  # fmt: skip
    return nn.Sequential(*layers, head)


@zoo_model("efficientnet_b0", IMAGENET, "cnn")
def efficientnet_b0():
    """EfficientNet-B0: MBConv blocks with SiLU and squeeze-excite (sigmoid gates)."""
    plan = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
            (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # fmt: skip
    layers, cin = [ConvBNAct(3, 32, 3, 2, act=nn.SiLU, eps=1e-3)], 32
    for expand, k, s, cout, n in plan:
        for i in range(n):
            squeeze = max(1, cin // 4)
            se = lambda ch, sq=squeeze: SqueezeExcite(ch, sq, nn.SiLU, nn.Sigmoid)  # noqa: E731
            layers.append(InvertedResidual(cin, cin * expand, cout, k, s if i == 0 else 1, nn.SiLU, se, 1e-3))
            cin = cout
    layers.append(ConvBNAct(cin, 1280, 1, act=nn.SiLU, eps=1e-3))
    return nn.Sequential(*layers, ClassifierHead(1280, dropout=0.2))


class Fire(nn.Module):
    """SqueezeNet fire module: 1x1 squeeze, then 1x1 and 3x3 expands concatenated."""

    def __init__(self, cin, squeeze, expand1, expand3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1 = nn.Conv2d(squeeze, expand1, 1)
        self.expand3 = nn.Conv2d(squeeze, expand3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1(x)), F.relu(self.expand3(x))], 1)


@zoo_model("squeezenet1_1", IMAGENET, "cnn")
def squeezenet1_1():
    """SqueezeNet 1.1: fire modules (concat), ceil-mode max pools, conv classifier."""
    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(inplace=True), pool(),
        Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool(),
        Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool(),
        Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256),
        nn.Dropout(0.5), nn.Conv2d(512, 10, 1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
    )  # fmt: skip


def channel_shuffle(x, groups):
    """ShuffleNet's channel shuffle: (n, g, c/g, h, w) -> swap g and c/g -> back to (n, c, h, w)."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: split channels (stride 1) or duplicate input (stride 2), concat, shuffle."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        self.branch1 = nn.Sequential(
            ConvBNAct(cin, cin, 3, stride, groups=cin, act=None), ConvBNAct(cin, half, 1),
        ) if stride > 1 else None  # fmt: skip
        branch2_in = cin if stride > 1 else half
        self.branch2 = nn.Sequential(
            ConvBNAct(branch2_in, half, 1),
            ConvBNAct(half, half, 3, stride, groups=half, act=None),
            ConvBNAct(half, half, 1),
        )

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat([x1, self.branch2(x2)], 1)
        else:
            out = torch.cat([self.branch1(x), self.branch2(x)], 1)
        return channel_shuffle(out, 2)


@zoo_model("shufflenet_v2_x0_5", IMAGENET, "cnn")
def shufflenet_v2_x0_5():
    """ShuffleNetV2 x0.5: channel split (chunk), concat and channel shuffle (view/transpose)."""
    layers = [ConvBNAct(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
    cin = 24
    for cout, repeats in [(48, 4), (96, 8), (192, 4)]:
        for i in range(repeats):
            layers.append(ShuffleUnit(cin, cout, 2 if i == 0 else 1))
            cin = cout
    layers.append(ConvBNAct(cin, 1024, 1))
    return nn.Sequential(*layers, ClassifierHead(1024))


# ---------------------------------------------------------------------------- multi-branch networks


class DenseLayer(nn.Module):
    """DenseNet-BC layer: BN-ReLU-1x1 (4k) -> BN-ReLU-3x3 (k), concatenated to its input."""

    def __init__(self, cin, growth):
        super().__init__()
        self.layers = nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
        )  # fmt: skip

    def forward(self, x):
        return torch.cat([x, self.layers(x)], 1)


@zoo_model("densenet_bc_40", [(1, 3, 64, 64)], "cnn")
def densenet_bc_40():
    """DenseNet-BC (k=12, 3 dense blocks of 6 layers): concatenation-heavy, transitions with avg pool."""
    growth, cin = 12, 24
    layers = [nn.Conv2d(3, cin, 3, padding=1, bias=False)]
    for block in range(3):
        for _ in range(6):
            layers.append(DenseLayer(cin, growth))
            cin += growth
        if block < 2:
            cout = cin // 2
            layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2)]
            cin = cout
    layers += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), ClassifierHead(cin)]
    return nn.Sequential(*layers)


class Inception(nn.Module):
    """GoogLeNet inception block: 1x1 | 1x1->3x3 | 1x1->3x3 | 3x3 max pool->1x1, concatenated."""

    def __init__(self, cin, c1, c3r, c3, c5r, c5, pool_proj):
        super().__init__()
        conv = lambda i, o, k: ConvBNAct(i, o, k, eps=1e-3)  # noqa: E731
        self.branch1 = conv(cin, c1, 1)
        self.branch2 = nn.Sequential(conv(cin, c3r, 1), conv(c3r, c3, 3))
        self.branch3 = nn.Sequential(conv(cin, c5r, 1), conv(c5r, c5, 3))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv(cin, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


@zoo_model("googlenet_small", IMAGENET, "cnn")
def googlenet_small():
    """GoogLeNet up to inception 4a: 7x7 stem, ceil-mode pools, 4-branch inception blocks."""
    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
    return nn.Sequential(
        ConvBNAct(3, 64, 7, 2, eps=1e-3), pool(),
        ConvBNAct(64, 64, 1, eps=1e-3), ConvBNAct(64, 192, 3, eps=1e-3), pool(),
        Inception(192, 64, 96, 128, 16, 32, 32), Inception(256, 128, 128, 192, 32, 96, 64), pool(),
        Inception(480, 192, 96, 208, 16, 48, 64),
        ClassifierHead(512, dropout=0.2),
    )  # fmt: skip


class RegNetBlock(nn.Module):
    """RegNetY block: 1x1 -> grouped 3x3 (group width 8) -> SE (1/4 of the input width) -> 1x1."""

    def __init__(self, cin, cout, stride, group_width=8):
        super().__init__()
        self.body = nn.Sequential(
            ConvBNAct(cin, cout, 1),
            ConvBNAct(cout, cout, 3, stride, groups=cout // group_width),
            SqueezeExcite(cout, max(1, cin // 4)),
            ConvBNAct(cout, cout, 1, act=None),
        )
        self.shortcut = _projection(cin, cout, stride)

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


@zoo_model("regnety_200mf", IMAGENET, "cnn")
def regnety_200mf():
    """RegNetY-200MF: widths 24/56/152/368, depths 1/1/4/7, group width 8, squeeze-excite."""
    layers, cin = [ConvBNAct(3, 32, 3, 2)], 32
    for width, depth in [(24, 1), (56, 1), (152, 4), (368, 7)]:
        for i in range(depth):
            layers.append(RegNetBlock(cin, width, 2 if i == 0 else 1))
            cin = width
    return nn.Sequential(*layers, ClassifierHead(cin))


class LayerNorm2d(nn.LayerNorm):
    """Layer norm over the channels of an NCHW tensor (permute to NHWC, normalize, permute back)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt block: 7x7 depthwise -> NHWC layer norm -> 4x MLP with GELU -> layer scale -> residual."""

    def __init__(self, dim, layer_scale=0.5):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        # The paper starts layer scale at 1e-6; a larger value keeps every block visible in the output.
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x):
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


@zoo_model("convnext_nano", [(1, 3, 128, 128)], "cnn")
def convnext_nano():
    """ConvNeXt at half tiny width (48..384), depths 2/2/6/2: patchify stem, 7x7 depthwise, LN, GELU, permutes."""
    dims, depths = (48, 96, 192, 384), (2, 2, 6, 2)
    layers = [nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0], eps=1e-6)]
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i > 0:
            layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
        layers += [ConvNeXtBlock(dim) for _ in range(depth)]
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(1), LayerNorm2d(dims[-1], eps=1e-6), nn.Flatten(1), nn.Linear(dims[-1], 10)
    )
    return nn.Sequential(*layers, head)


# ---------------------------------------------------------------------------- GhostNet


class HardSigmoidGate(nn.Module):
    """GhostNet's gate: relu6(x + 3) / 6, written out as the reference code does."""

    def forward(self, x):
        return F.relu6(x + 3.0) / 6.0


class GhostModule(nn.Module):
    """Half the output channels from a 1x1 conv, the other half from a cheap 3x3 depthwise conv on them."""

    def __init__(self, cin, cout, relu=True):
        super().__init__()
        self.cout = cout
        init = math.ceil(cout / 2)
        act = nn.ReLU if relu else None
        self.primary = ConvBNAct(cin, init, 1, act=act)
        self.cheap = ConvBNAct(init, init, 3, groups=init, act=act)

    def forward(self, x):
        x1 = self.primary(x)
        return torch.cat([x1, self.cheap(x1)], 1)[:, : self.cout]


class GhostBottleneck(nn.Module):
    def __init__(self, cin, mid, cout, kernel, stride, se):
        super().__init__()
        layers = [GhostModule(cin, mid)]
        if stride > 1:
            layers.append(ConvBNAct(mid, mid, kernel, stride, groups=mid, act=None))
        if se:
            layers.append(SqueezeExcite(mid, make_divisible(mid / 4, 4), nn.ReLU, HardSigmoidGate))
        layers.append(GhostModule(mid, cout, relu=False))
        self.body = nn.Sequential(*layers)
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(
                ConvBNAct(cin, cin, kernel, stride, groups=cin, act=None), ConvBNAct(cin, cout, 1, act=None)
            )

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


@zoo_model("ghostnet_0_5", IMAGENET, "cnn")
def ghostnet_0_5():
    """GhostNet x0.5: ghost modules (conv + cheap depthwise, concat, slice), SE with hard-sigmoid gates."""
    plan = [  # kernel, expanded, out, squeeze-excite, stride
        (3, 16, 16, 0, 1), (3, 48, 24, 0, 2), (3, 72, 24, 0, 1), (5, 72, 40, 1, 2), (5, 120, 40, 1, 1),
        (3, 240, 80, 0, 2), (3, 200, 80, 0, 1), (3, 184, 80, 0, 1), (3, 184, 80, 0, 1), (3, 480, 112, 1, 1),
        (3, 672, 112, 1, 1), (5, 672, 160, 1, 2), (5, 960, 160, 0, 1), (5, 960, 160, 1, 1), (5, 960, 160, 0, 1),
        (5, 960, 160, 1, 1),
    ]  # fmt: skip
    w = lambda c: make_divisible(c * 0.5, 4)  # noqa: E731
    layers, cin = [ConvBNAct(3, w(16), 3, 2)], w(16)
    for k, exp, cout, se, s in plan:
        layers.append(GhostBottleneck(cin, w(exp), w(cout), k, s, se))
        cin = w(cout)
    layers.append(ConvBNAct(cin, w(960), 1))
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(1), nn.Conv2d(w(960), 1280, 1), nn.ReLU(inplace=True), nn.Flatten(1),
        nn.Dropout(0.2), nn.Linear(1280, 10),
    )  # fmt: skip
    return nn.Sequential(*layers, head)
