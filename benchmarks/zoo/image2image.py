"""Image-to-image networks: super-resolution and an autoencoder."""

from __future__ import annotations

from torch import nn

from .registry import zoo_model


@zoo_model("espcn_x3", [(1, 1, 64, 64)], "image2image", fast=True)
def espcn_x3():
    """ESPCN x3 super-resolution: 5x5/3x3 convs with tanh, sub-pixel convolution (pixel_shuffle)."""
    scale = 3
    return nn.Sequential(
        nn.Conv2d(1, 64, 5, padding=2), nn.Tanh(),
        nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, scale**2, 3, padding=1),
        nn.PixelShuffle(scale),
    )  # fmt: skip


@zoo_model("conv_autoencoder", [(1, 1, 28, 28)], "image2image", fast=True)
def conv_autoencoder():
    """Convolutional autoencoder: stride-2 conv encoder to a dense code, transposed-conv decoder
    (with output_padding), sigmoid output."""
    encoder = nn.Sequential(
        nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),   # 14x14
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),  # 7x7
        nn.Flatten(1), nn.Linear(32 * 7 * 7, 32),
    )  # fmt: skip
    decoder = nn.Sequential(
        nn.Linear(32, 32 * 7 * 7), nn.ReLU(), nn.Unflatten(1, (32, 7, 7)),
        nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),  # 14x14
        nn.ConvTranspose2d(16, 1, 3, stride=2, padding=1, output_padding=1), nn.Sigmoid(),  # 28x28
    )  # fmt: skip
    return nn.Sequential(encoder, decoder)
