"""Networks built from dense layers: a plain MLP and an MLP-Mixer."""

from __future__ import annotations

from torch import nn

from .registry import zoo_model


@zoo_model("mlp", [(1, 784)], "mlp")
def mlp():
    """MLP 784-256-128-10 with ReLU (MNIST-sized)."""
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


class MixerBlock(nn.Module):
    """Mixer layer: token-mixing MLP across patches (transposed), then channel-mixing MLP, each
    after a layer norm and with a residual."""

    def __init__(self, tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x):  # x: (batch, tokens, dim)
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image=32, patch=4, dim=128, depth=4, classes=10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patchify = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim, dim // 2, dim * 4) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patchify(x).flatten(2).transpose(1, 2)  # (batch, tokens, dim)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


@zoo_model("mlp_mixer", [(1, 3, 32, 32)], "mlp", fast=True)
def mlp_mixer():
    """MLP-Mixer (patch 4, dim 128, depth 4) on 32x32 images: patch conv, token/channel MLPs, LN, GELU."""
    return MLPMixer()
