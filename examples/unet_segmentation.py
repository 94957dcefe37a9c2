"""Train a small UNet on "tpu" to segment generated shapes, ship it to LiteRT.

    .venv/bin/python examples/unet_segmentation.py               # 300 steps
    .venv/bin/python examples/unet_segmentation.py --steps 40    # the quick form

Data is generated: 32x32 grey images with a random disc (class 1) and a random square
(class 2) on a noisy background (class 0). The model is a two-level UNet (conv blocks,
max-pool down, transposed-conv up, skip concatenations). Printed: pixel accuracy and
mean IoU on 64 fresh images in PyTorch and LiteRT, the largest difference between the
two, latency (one thread) and file size.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, mean_loss, median_us, results_table, run_per_sample, torch_cpu_latency_us, train  # noqa: E402

import litert_torch  # noqa: E402
from runtimes.litert import max_relative_error  # noqa: E402

SIZE, CLASSES = 32, 3


def shapes_batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (n, 1, 32, 32) and their masks (n, 32, 32) of {0: background, 1: disc, 2: square}."""
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    masks = torch.zeros(n, SIZE, SIZE, dtype=torch.long)
    for i in range(n):
        cy, cx = torch.randint(6, SIZE - 6, (2,), generator=gen)
        radius = torch.randint(3, 7, (1,), generator=gen)
        masks[i][(yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2] = 1
        top, left = torch.randint(0, SIZE - 10, (2,), generator=gen)
        side = torch.randint(4, 10, (1,), generator=gen)
        masks[i, top : top + side, left : left + side] = 2
    brightness = torch.tensor([0.0, 0.6, 1.0])
    images = brightness[masks] + 0.15 * torch.randn(n, SIZE, SIZE, generator=gen)
    return images.unsqueeze(1), masks


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class UNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = CLASSES):
        super().__init__()
        self.enc1, self.enc2 = conv_block(1, width), conv_block(width, 2 * width)
        self.bottom = conv_block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = conv_block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = conv_block(2 * width, width)
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, images):
        e1 = self.enc1(images)
        e2 = self.enc2(nn.functional.max_pool2d(e1, 2))
        b = self.bottom(nn.functional.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.out(d1)


def mean_iou(predicted: np.ndarray, masks: np.ndarray) -> float:
    ious = []
    for c in range(CLASSES):
        inter = np.logical_and(predicted == c, masks == c).sum()
        union = np.logical_or(predicted == c, masks == c).sum()
        if union:
            ious.append(inter / union)
    return float(np.mean(ious))


def run(steps: int = 300, batch_size: int = 16, lr: float = 3e-3, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = UNet().to("tpu")
    losses = train(model, (shapes_batch(batch_size, gen) for _ in range(steps)), nn.functional.cross_entropy, lr=lr)

    images, masks = shapes_batch(64, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        torch_logits = model(images.to("tpu")).cpu().numpy()
    sample = (images[:1],)
    edge = litert_torch.convert(model, sample)
    with tempfile.TemporaryDirectory() as folder:
        path = edge.export(os.path.join(folder, "unet.tflite"))
        size = os.path.getsize(path)
        edge = litert_torch.load(path)
        litert_logits = run_per_sample(edge, images)
        litert_us = median_us(lambda: edge(*sample))
    truth = masks.numpy()
    results = {
        "loss_start_end": mean_loss(losses),
        "steps": steps,
        "bytes": size,
        "max_relative_error": max_relative_error(litert_logits, torch_logits),
    }
    for name, logits, latency in (
        ("pytorch", torch_logits, torch_cpu_latency_us(model, sample)),
        ("litert", litert_logits, litert_us),
    ):
        predicted = logits.argmax(1)
        results[name] = {
            "pixel_accuracy": float((predicted == truth).mean()),
            "mean_iou": mean_iou(predicted, truth),
            "latency_us": latency,
        }
    return results


def report(results: dict) -> None:
    start, end = results["loss_start_end"]
    rows = [
        [
            "PyTorch (CPU, 1 thread)",
            f"{results['pytorch']['pixel_accuracy']:.1%}",
            f"{results['pytorch']['mean_iou']:.3f}",
            "reference",
            f"{results['pytorch']['latency_us']:.0f} us",
            "-",
        ],
        [
            "LiteRT float32",
            f"{results['litert']['pixel_accuracy']:.1%}",
            f"{results['litert']['mean_iou']:.3f}",
            f"{results['max_relative_error']:.1e}",
            f"{results['litert']['latency_us']:.0f} us",
            f"{results['bytes']:,} B",
        ],
    ]
    console.print(
        results_table(
            f"UNet trained on tpu ({results['steps']} steps, loss {start:.2f} -> {end:.2f}), 64 fresh images",
            ["model", "pixel acc.", "mean IoU", "max rel. error", "latency", "size"],
            rows,
        )
    )


def main(argv=None) -> dict:
    return cli(__doc__, run, report, argv, steps=300, batch_size=16, lr=3e-3)


if __name__ == "__main__":
    main()
