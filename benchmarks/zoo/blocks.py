"""Building blocks shared by several zoo families (torch only)."""

from __future__ import annotations

from torch import nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of `divisor`, never below 90% of `value`
    (the rule MobileNetV2/V3 and EfficientNet use for width multipliers)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias, 'same' padding for odd kernels) -> BatchNorm2d -> activation."""

    def __init__(self, cin, cout, kernel=3, stride=1, groups=1, dilation=1, act=nn.ReLU, eps=1e-5):
        padding = (kernel - 1) // 2 * dilation
        layers = [
            nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=eps),
        ]
        if act is not None:
            layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.SiLU) else act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: global average pool -> 1x1 reduce -> act -> 1x1 expand -> gate."""

    def __init__(self, channels, squeeze, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeeze, channels, 1)
        self.gate = gate()

    def forward(self, x):
        scale = self.gate(self.expand(self.act(self.reduce(self.pool(x)))))
        return x * scale


class ClassifierHead(nn.Sequential):
    """Global average pool -> flatten -> (dropout) -> linear, the usual CNN head."""

    def __init__(self, channels, classes=10, dropout=0.0):
        layers = [nn.AdaptiveAvgPool2d(1), nn.Flatten(1)]
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(channels, classes))
        super().__init__(*layers)
