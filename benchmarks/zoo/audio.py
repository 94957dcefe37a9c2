"""1D convolutional networks over time series: a raw-audio classifier and a TCN."""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from .registry import zoo_model


def conv1d_bn_relu(cin, cout, kernel, stride=1):
    return nn.Sequential(nn.Conv1d(cin, cout, kernel, stride), nn.BatchNorm1d(cout), nn.ReLU())


@zoo_model("audio_m5", [(1, 1, 8000)], "audio", fast=True)
def audio_m5():
    """M5 raw-waveform classifier (1 s at 8 kHz): 80-tap stride-4 conv1d, batch norm, max pool 1d."""
    return nn.Sequential(
        conv1d_bn_relu(1, 32, 80, 4), nn.MaxPool1d(4),
        conv1d_bn_relu(32, 32, 3), nn.MaxPool1d(4),
        conv1d_bn_relu(32, 64, 3), nn.MaxPool1d(4),
        conv1d_bn_relu(64, 64, 3), nn.MaxPool1d(4),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(1), nn.Linear(64, 12),
    )  # fmt: skip


class TemporalBlock(nn.Module):
    """TCN residual block: two causal dilated conv1d (left padding only), ReLU, dropout, and a
    1x1 conv on the shortcut when the width changes."""

    def __init__(self, cin, cout, kernel, dilation):
        super().__init__()
        self.left_pad = (kernel - 1) * dilation
        self.conv1 = nn.Conv1d(cin, cout, kernel, dilation=dilation)
        self.conv2 = nn.Conv1d(cout, cout, kernel, dilation=dilation)
        self.dropout = nn.Dropout(0.2)
        self.shortcut = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def causal(self, conv, x):
        return conv(F.pad(x, (self.left_pad, 0)))

    def forward(self, x):
        y = self.dropout(F.relu(self.causal(self.conv1, x)))
        y = self.dropout(F.relu(self.causal(self.conv2, y)))
        return F.relu(y + self.shortcut(x))


class TCN(nn.Module):
    def __init__(self, cin=16, width=32, levels=4, kernel=3, classes=5):
        super().__init__()
        blocks = [TemporalBlock(cin if i == 0 else width, width, kernel, 2**i) for i in range(levels)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(width, classes)

    def forward(self, x):  # x: (batch, channels, time); predict from the last step
        return self.head(self.blocks(x)[:, :, -1])


@zoo_model("tcn", [(1, 16, 128)], "audio", fast=True)
def tcn():
    """Temporal convolutional network: causal dilated conv1d (dilations 1/2/4/8), residuals, last-step head."""
    return TCN()
