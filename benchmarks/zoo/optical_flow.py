"""Optical flow and spatial transformers (torch only): grid_sample at positions computed
from the inputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .registry import zoo_model


def warp(image, flow):
    """Backward warp of `image` by `flow` (pixels): a base grid from meshgrid plus the flow."""
    _, _, h, w = image.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=image.dtype), torch.arange(w, dtype=image.dtype), indexing="ij")
    grid = torch.stack([(xs + flow[:, 0]) * (2 / (w - 1)) - 1, (ys + flow[:, 1]) * (2 / (h - 1)) - 1], dim=-1)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def conv_relu(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.LeakyReLU(0.1))


class PWCStyleFlow(nn.Module):
    """Coarse-to-fine flow: feature pyramid of both frames, a correlation-free estimator per
    level; each finer level upsamples the flow and warps frame 2's features with it."""

    def __init__(self, levels=(16, 32)):
        super().__init__()
        chans = (3, *levels)
        self.pyramid = nn.ModuleList(
            nn.Sequential(conv_relu(chans[i], chans[i + 1], 2), conv_relu(chans[i + 1], chans[i + 1]))
            for i in range(len(levels))
        )
        self.estimators = nn.ModuleList(
            nn.Sequential(conv_relu(2 * c + 2, 32), conv_relu(32, 16), nn.Conv2d(16, 2, 3, 1, 1)) for c in levels
        )

    def forward(self, frame1, frame2):
        feats1, feats2 = [], []
        a, b = frame1, frame2
        for stage in self.pyramid:
            a, b = stage(a), stage(b)
            feats1.append(a)
            feats2.append(b)
        flow = torch.zeros_like(feats1[-1][:, :2])
        for level in reversed(range(len(feats1))):
            if flow.shape[-1] != feats1[level].shape[-1]:
                flow = 2 * F.interpolate(flow, scale_factor=2, mode="bilinear", align_corners=False)
            warped = warp(feats2[level], flow)
            flow = flow + self.estimators[level](torch.cat([feats1[level], warped, flow], dim=1))
        return flow


class SpatialTransformerNet(nn.Module):
    """Spatial transformer classifier: a localisation net predicts an affine matrix,
    affine_grid + grid_sample (border padding) warp the input, a CNN classifies it."""

    def __init__(self, classes=10):
        super().__init__()
        self.localisation = nn.Sequential(
            nn.Conv2d(1, 8, 5, 2), nn.ReLU(), nn.Conv2d(8, 8, 3, 2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, 6)
        )
        nn.init.normal_(self.localisation[-1].weight, std=0.01)
        with torch.no_grad():
            self.localisation[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1.0, 0]))
        self.classifier = nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 14 * 14, classes)
        )

    def forward(self, image):
        theta = self.localisation(image).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(image.shape), align_corners=False)
        return self.classifier(F.grid_sample(image, grid, padding_mode="border", align_corners=False))


@zoo_model("pwc_style_flow", [(1, 3, 32, 32), (1, 3, 32, 32)], "optical_flow", fast=True)
def pwc_style_flow():
    """PWC-Net-style optical flow: two-frame pyramid, bilinear flow upsampling, grid_sample warping."""
    return PWCStyleFlow()


@zoo_model("spatial_transformer", [(1, 1, 28, 28)], "optical_flow")
def spatial_transformer():
    """Spatial transformer network: predicted affine_grid + grid_sample (border) before a CNN."""
    return SpatialTransformerNet()
