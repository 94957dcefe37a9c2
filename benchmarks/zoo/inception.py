"""Inception-v3 with the layout, layer names and initialisation of torchvision's model.

Not a zoo entry (the zoo randomises batch-norm statistics, which tames what this model is
kept for): with torchvision's initialisation (truncated normal weights, std 0.1, over
[-2, 2]; batch norm weight 1, bias 0, eps 1e-3) the activations of a randomly initialised
Inception-v3 grow about 4x per block, to ~1e11 in Mixed_7c. That once left 46 of its 94
CONV_2D in float32 under full_int8, silently (issue 20). `width` scales every channel
count and `std` the initial weights' standard deviation: a quarter of the width with
twice the std keeps each layer's gain (std x sqrt(fan-in)), so the fast variant's
activations grow as the full model's do.

    model = inception_v3()                         # 23.8M parameters, input (1, 3, 299, 299)
    small = inception_v3(width=0.25, std=0.2)      # the same 94 convolutions, 1.9M parameters
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicConv2d(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d(eps 1e-3) -> ReLU, as torchvision names it."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


def _avg_pool(x):
    return F.avg_pool2d(x, 3, 1, 1)


class InceptionA(nn.Module):
    """35x35 block: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1."""

    def __init__(self, cin: int, pool_features: int, c):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(64), 1)
        self.branch5x5_1 = BasicConv2d(cin, c(48), 1)
        self.branch5x5_2 = BasicConv2d(c(48), c(64), 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), 1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x):
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch5x5_2(self.branch5x5_1(x)),
                self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                self.branch_pool(_avg_pool(x)),
            ],
            1,
        )


class InceptionB(nn.Module):
    """35x35 -> 17x17 reduction: strided 3x3 | 1x1-3x3-strided 3x3 | max pool."""

    def __init__(self, cin: int, c):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, c(384), 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), 1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), 3, stride=2)

    def forward(self, x):
        return torch.cat(
            [
                self.branch3x3(x),
                self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                F.max_pool2d(x, 3, 2),
            ],
            1,
        )


class InceptionC(nn.Module):
    """17x17 block with factorised 7x7 convolutions (1x7 and 7x1)."""

    def __init__(self, cin: int, c7: int, c):
        super().__init__()
        out = c(192)
        self.branch1x1 = BasicConv2d(cin, out, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, out, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, out, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, out, 1)

    def forward(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = self.branch7x7dbl_1(x)
        for layer in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            d = layer(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg_pool(x))], 1)


class InceptionD(nn.Module):
    """17x17 -> 8x8 reduction."""

    def __init__(self, cin: int, c):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, c(192), 1)
        self.branch3x3_2 = BasicConv2d(c(192), c(320), 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, c(192), 1)
        self.branch7x7x3_2 = BasicConv2d(c(192), c(192), (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(c(192), c(192), (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(c(192), c(192), 3, stride=2)

    def forward(self, x):
        b7 = x
        for layer in (self.branch7x7x3_1, self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            b7 = layer(b7)
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    """8x8 block with split 1x3 / 3x1 branches."""

    def __init__(self, cin: int, c):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(320), 1)
        self.branch3x3_1 = BasicConv2d(cin, c(384), 1)
        self.branch3x3_2a = BasicConv2d(c(384), c(384), (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(c(384), c(384), (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, c(448), 1)
        self.branch3x3dbl_2 = BasicConv2d(c(448), c(384), 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(c(384), c(384), (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(c(384), c(384), (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, c(192), 1)

    def forward(self, x):
        a = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        return torch.cat(
            [
                self.branch1x1(x),
                torch.cat([self.branch3x3_2a(a), self.branch3x3_2b(a)], 1),
                torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1),
                self.branch_pool(_avg_pool(x)),
            ],
            1,
        )


class InceptionV3(nn.Module):
    """The stem, Mixed_5b .. Mixed_7c, global average pool, dropout, fc (no aux logits)."""

    def __init__(self, classes: int = 1000, width: float = 1.0, std: float = 0.1):
        super().__init__()

        def c(n: int) -> int:
            return max(8, int(round(n * width)))

        self.Conv2d_1a_3x3 = BasicConv2d(3, c(32), 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(c(32), c(32), 3)
        self.Conv2d_2b_3x3 = BasicConv2d(c(32), c(64), 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(c(64), c(80), 1)
        self.Conv2d_4a_3x3 = BasicConv2d(c(80), c(192), 3)
        a_out = lambda pool: c(64) + c(64) + c(96) + pool  # noqa: E731
        self.Mixed_5b = InceptionA(c(192), c(32), c)
        self.Mixed_5c = InceptionA(a_out(c(32)), c(64), c)
        self.Mixed_5d = InceptionA(a_out(c(64)), c(64), c)
        self.Mixed_6a = InceptionB(a_out(c(64)), c)
        b_out = c(384) + c(96) + a_out(c(64))
        self.Mixed_6b = InceptionC(b_out, c(128), c)
        self.Mixed_6c = InceptionC(4 * c(192), c(160), c)
        self.Mixed_6d = InceptionC(4 * c(192), c(160), c)
        self.Mixed_6e = InceptionC(4 * c(192), c(192), c)
        self.Mixed_7a = InceptionD(4 * c(192), c)
        d_out = c(320) + c(192) + 4 * c(192)
        self.Mixed_7b = InceptionE(d_out, c)
        e_out = c(320) + 4 * c(384) + c(192)
        self.Mixed_7c = InceptionE(e_out, c)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(e_out, classes)
        self._init_like_torchvision(std)

    def _init_like_torchvision(self, std: float) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, 2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, 2)
        for block in (
            self.Mixed_5b,
            self.Mixed_5c,
            self.Mixed_5d,
            self.Mixed_6a,
            self.Mixed_6b,
            self.Mixed_6c,
            self.Mixed_6d,
            self.Mixed_6e,
            self.Mixed_7a,
            self.Mixed_7b,
            self.Mixed_7c,
        ):
            x = block(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.dropout(x))


def inception_v3(width: float = 1.0, classes: int = 1000, std: float = 0.1) -> InceptionV3:
    """Inception-v3 in eval mode, initialised as torchvision initialises it (seed first)."""
    return InceptionV3(classes, width, std).eval()
