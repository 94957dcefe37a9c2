"""Video models (torch only): 3-D convolutions, 3-D pooling and 3-D upsampling on
(N, C, T, H, W) clips."""

from __future__ import annotations

import torch
from torch import nn

from .registry import zoo_model


def conv3d_bn(cin, cout, kernel, stride=1, padding=0):
    return nn.Sequential(
        nn.Conv3d(cin, cout, kernel, stride, padding, bias=False), nn.BatchNorm3d(cout), nn.ReLU(inplace=True)
    )


class C3DSmall(nn.Module):
    """C3D-style: 3x3x3 convolutions and 3-D max pooling (first pool spatial only)."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            conv3d_bn(3, 16, 3, padding=1),
            nn.MaxPool3d((1, 2, 2)),
            conv3d_bn(16, 32, 3, padding=1),
            nn.MaxPool3d(2),
            conv3d_bn(32, 32, 3, padding=1),
            nn.AvgPool3d(2),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, clip):
        return self.head(self.features(clip).mean(dim=(2, 3, 4)))


class R2Plus1DBlock(nn.Module):
    """(2+1)-D residual block: a spatial 1x3x3 conv then a temporal 3x1x1 conv."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        mid = (cin + cout) // 2
        self.spatial = conv3d_bn(cin, mid, (1, 3, 3), (1, stride, stride), (0, 1, 1))
        self.temporal = nn.Sequential(
            nn.Conv3d(mid, cout, (3, 1, 1), (stride, 1, 1), (1, 0, 0), bias=False), nn.BatchNorm3d(cout)
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout))
        )

    def forward(self, x):
        return torch.relu(self.temporal(self.spatial(x)) + self.skip(x))


class R2Plus1DSmall(nn.Module):
    """R(2+1)D-style video classifier: factorized 3-D convolutions, residual, adaptive pool."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = conv3d_bn(3, 16, (3, 7, 7), (1, 2, 2), (1, 3, 3))
        self.blocks = nn.Sequential(R2Plus1DBlock(16, 16), R2Plus1DBlock(16, 32, 2))
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(32, classes)

    def forward(self, clip):
        return self.head(self.pool(self.blocks(self.stem(clip))).flatten(1))


class UNet3DSmall(nn.Module):
    """3-D U-Net (volumetric segmentation): conv3d encoder, max pool, transposed-conv and
    trilinear decoders, skip concatenations."""

    def __init__(self, classes=3):
        super().__init__()
        self.enc1, self.enc2 = conv3d_bn(1, 8, 3, padding=1), conv3d_bn(8, 16, 3, padding=1)
        self.pool = nn.MaxPool3d(2)
        self.bottom = conv3d_bn(16, 16, 3, padding=1)
        self.up2 = nn.ConvTranspose3d(16, 16, 2, stride=2)
        self.dec2 = conv3d_bn(32, 8, 3, padding=1)
        self.dec1 = conv3d_bn(16, 8, 3, padding=1)
        self.out = nn.Conv3d(8, classes, 1)

    def forward(self, volume):
        e1 = self.enc1(volume)
        e2 = self.enc2(self.pool(e1))
        d2 = self.dec2(torch.cat([self.up2(self.bottom(self.pool(e2))), e2], dim=1))
        up1 = nn.functional.interpolate(d2, scale_factor=2, mode="trilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([up1, e1], dim=1)))


@zoo_model("c3d_small", [(1, 3, 8, 32, 32)], "video", fast=True)
def c3d_small():
    """C3D-style video classifier: 3x3x3 conv3d + BN (folded), 3-D max/avg pooling."""
    return C3DSmall()


@zoo_model("r2plus1d_small", [(1, 3, 8, 32, 32)], "video")
def r2plus1d_small():
    """R(2+1)D-style video classifier: factorized spatial/temporal conv3d, residual, adaptive pool."""
    return R2Plus1DSmall()


@zoo_model("unet3d_small", [(1, 1, 8, 16, 16)], "video")
def unet3d_small():
    """3-D U-Net: conv3d encoder/decoder, max_pool3d, conv_transpose3d and trilinear upsampling."""
    return UNet3DSmall()
