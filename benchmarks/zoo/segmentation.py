"""Dense prediction networks: per-pixel outputs at the input's resolution."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .blocks import ConvBNAct
from .registry import zoo_model


class DoubleConv(nn.Sequential):
    """UNet's unit: two 3x3 conv-BN-ReLU."""

    def __init__(self, cin, cout):
        super().__init__(ConvBNAct(cin, cout, 3), ConvBNAct(cout, cout, 3))


class UNet(nn.Module):
    """UNet: 4-level encoder (max pool), decoder of 2x2 stride-2 transposed convs concatenated
    with the encoder's skip features, 1x1 conv to class logits."""

    def __init__(self, cin=3, classes=4, base=16, levels=4):
        super().__init__()
        widths = [base * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList([DoubleConv(cin, widths[0])])
        self.down.extend(DoubleConv(widths[i], widths[i + 1]) for i in range(levels))
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(levels))
        )
        self.merge = nn.ModuleList(DoubleConv(2 * widths[i], widths[i]) for i in reversed(range(levels)))
        self.classify = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, down in enumerate(self.down):
            x = down(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1])):
            x = merge(torch.cat([skip, up(x)], 1))
        return self.classify(x)


@zoo_model("unet_small", [(1, 3, 64, 64)], "segmentation", fast=True)
def unet_small():
    """UNet (base width 16, 4 levels): transposed-conv upsampling and skip concatenation."""
    return UNet()


class DilatedBackbone(nn.Module):
    """A small residual backbone with output stride 8: two strided stages, then dilated stages
    (the DeepLab recipe of trading stride for dilation)."""

    def __init__(self, width=32):
        super().__init__()
        self.stem = nn.Sequential(ConvBNAct(3, width, 3, 2), ConvBNAct(width, width, 3), nn.MaxPool2d(3, 2, 1))
        self.stage2 = nn.Sequential(ConvBNAct(width, 2 * width, 3, 2), ConvBNAct(2 * width, 2 * width, 3))
        self.stage3 = nn.Sequential(
            ConvBNAct(2 * width, 4 * width, 3, dilation=2), ConvBNAct(4 * width, 4 * width, 3, dilation=2)
        )
        self.stage4 = nn.Sequential(
            ConvBNAct(4 * width, 8 * width, 3, dilation=4), ConvBNAct(8 * width, 8 * width, 3, dilation=4)
        )
        self.channels = 8 * width

    def forward(self, x):
        return self.stage4(self.stage3(self.stage2(self.stem(x))))


class FCN(nn.Module):
    """FCN: backbone at output stride 8, 3x3 conv-BN-ReLU-dropout-1x1 head, bilinear upsampling
    back to the input size."""

    def __init__(self, classes=5):
        super().__init__()
        self.backbone = DilatedBackbone()
        c = self.backbone.channels
        self.head = nn.Sequential(ConvBNAct(c, c // 4, 3), nn.Dropout(0.1), nn.Conv2d(c // 4, classes, 1))

    def forward(self, x):
        logits = self.head(self.backbone(x))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


@zoo_model("fcn_small", [(1, 3, 128, 128)], "segmentation")
def fcn_small():
    """FCN head on a dilated output-stride-8 backbone, bilinear upsampling (align_corners=False)."""
    return FCN()


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 conv, three dilated 3x3 convs and an image-level
    branch (adaptive average pool -> 1x1 conv -> bilinear upsample), concatenated and projected."""

    def __init__(self, cin, cout=64, rates=(2, 4, 6)):
        super().__init__()
        self.branches = nn.ModuleList([ConvBNAct(cin, cout, 1)] + [ConvBNAct(cin, cout, 3, dilation=r) for r in rates])
        self.image_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), ConvBNAct(cin, cout, 1))
        self.project = nn.Sequential(ConvBNAct(cout * (len(rates) + 2), cout, 1), nn.Dropout(0.5))

    def forward(self, x):
        pooled = F.interpolate(self.image_pool(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], 1))


class DeepLabV3(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.backbone = DilatedBackbone()
        self.head = nn.Sequential(ASPP(self.backbone.channels), ConvBNAct(64, 64, 3), nn.Conv2d(64, classes, 1))

    def forward(self, x):
        logits = self.head(self.backbone(x))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


@zoo_model("deeplabv3_small", [(1, 3, 128, 128)], "segmentation")
def deeplabv3_small():
    """DeepLabV3: dilated backbone, ASPP (rates 2/4/6 for the small input, image pooling), bilinear upsampling."""
    return DeepLabV3()
