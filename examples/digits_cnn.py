"""Train a ResNet-style CNN on "tpu", ship it to LiteRT as float32 and full int8.

    .venv/bin/python examples/digits_cnn.py             # 4 epochs (about a minute; --no-int8 skips int8)
    .venv/bin/python examples/digits_cnn.py --epochs 2  # the quick form (the quickstart)

Data: scikit-learn's handwritten digits (1,797 8x8 images, shipped inside the package,
nothing downloads), split 80/20 with a fixed seed. The model trains on the "tpu"
device, converts straight from it, and is evaluated on the held-out split three ways:
PyTorch, LiteRT float32 and LiteRT full-integer int8 (calibrated on 128 training
images; float inputs and outputs). Printed: accuracy, agreement with PyTorch, latency
(one thread) and file size.
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
from litert_torch import quantize  # noqa: E402


def digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test): images as float32 (N, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class DigitsResNet(nn.Module):
    """stem conv -> residual block -> strided conv -> residual block -> pool -> linear."""

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stage1 = ResidualBlock(width)
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU()
        )
        self.stage2 = ResidualBlock(2 * width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, images):
        x = self.stage2(self.down(self.stage1(self.stem(images))))
        return self.head(x.mean(dim=(2, 3)))


def batches(x, y, *, epochs: int, batch_size: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x) - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]


def run(epochs: int = 4, batch_size: int = 64, lr: float = 3e-3, int8: bool = True, seed: int = 0) -> dict:
    """Train, convert, evaluate; returns the figures the table shows."""
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test = digits_split(seed)
    model = DigitsResNet().to("tpu")
    losses = train(
        model,
        batches(x_train, y_train, epochs=epochs, batch_size=batch_size, seed=seed),
        nn.functional.cross_entropy,
        lr=lr,
    )

    with torch.no_grad():
        torch_scores = model(x_test.to("tpu")).cpu().numpy()
    sample = (x_test[:1],)
    variants = {"float32": litert_torch.convert(model, sample)}
    if int8:
        calibration = [(x_train[i : i + 1],) for i in range(128)]
        variants["int8"] = litert_torch.convert(
            model, sample, quant_config=quantize.full_int8(), calibration_data=calibration
        )

    labels = y_test.numpy()
    results = {
        "loss_start_end": mean_loss(losses),
        "steps": len(losses),
        "pytorch": {
            "accuracy": float((torch_scores.argmax(1) == labels).mean()),
            "latency_us": torch_cpu_latency_us(model, sample),
        },
    }
    with tempfile.TemporaryDirectory() as folder:
        for name, edge in variants.items():
            path = edge.export(os.path.join(folder, f"digits_{name}.tflite"))
            edge = litert_torch.load(path)  # what the app ships
            scores = run_per_sample(edge, x_test)
            results[name] = {
                "accuracy": float((scores.argmax(1) == labels).mean()),
                "agreement": float((scores.argmax(1) == torch_scores.argmax(1)).mean()),
                "max_abs_error": float(np.abs(scores - torch_scores).max()),
                "latency_us": median_us(lambda edge=edge: edge(x_test[:1])),
                "bytes": os.path.getsize(path),
            }
    return results


COLUMNS = ["model", "accuracy", "agrees with PyTorch", "latency", "size"]


def title(results: dict) -> str:
    start, end = results["loss_start_end"]
    return (
        f"Digits ResNet trained on tpu ({results['steps']} steps, loss {start:.2f} -> {end:.2f}), 360 held-out images"
    )


def table_rows(results: dict) -> list[list[str]]:
    """The printed table's rows (`COLUMNS`); the README and docs/tutorial.md show them."""
    rows = [
        [
            "PyTorch (CPU, 1 thread)",
            f"{results['pytorch']['accuracy']:.1%}",
            "-",
            f"{results['pytorch']['latency_us']:.0f} us",
            "-",
        ]
    ]
    for name in ("float32", "int8"):
        if name in results:
            r = results[name]
            rows.append(
                [
                    f"LiteRT {name}",
                    f"{r['accuracy']:.1%}",
                    f"{r['agreement']:.1%}",
                    f"{r['latency_us']:.0f} us",
                    f"{r['bytes']:,} B",
                ]
            )
    return rows


def report(results: dict) -> None:
    console.print(results_table(title(results), COLUMNS, table_rows(results)))


def main(argv=None) -> dict:
    return cli(__doc__, run, report, argv, epochs=4, batch_size=64, lr=3e-3, int8=True)


if __name__ == "__main__":
    main()
