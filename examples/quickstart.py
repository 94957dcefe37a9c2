"""Quickstart: convert a small CNN to LiteRT, run it, and compare it with PyTorch.

    .venv/bin/python examples/quickstart.py

Builds a CNN (conv, batch norm, ReLU, pooling, linear) in code, converts it with
`litert_torch.convert`, runs the .tflite model in the LiteRT interpreter (XNNPACK) and
prints, for PyTorch and LiteRT side by side: the max relative error on a fresh input
(max|a-b| / max|b|), the median latency (one thread each), and the .tflite size.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

import litert_torch
from runtimes.litert import max_relative_error


class SmallCNN(torch.nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = torch.nn.Linear(32, num_classes)

    def forward(self, images):
        return self.classifier(torch.flatten(self.features(images), 1))


def median_ms(fn, *, repeats: int = 50) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    sample = torch.randn(1, 3, 64, 64)

    start = time.perf_counter()
    edge = litert_torch.convert(model, (sample,))
    convert_s = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as folder:
        path = edge.export(os.path.join(folder, "small_cnn.tflite"))
        size = os.path.getsize(path)
        edge = litert_torch.load(path)  # what an app would ship and load

    x = torch.randn(1, 3, 64, 64)  # not the sample: the model must generalize
    with torch.no_grad():
        expected = model(x).numpy()
    actual = edge(x)

    # One thread each: the LiteRT interpreter uses one unless told otherwise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        torch_ms = median_ms(lambda: model(x))
    torch.set_num_threads(threads)
    litert_ms = median_ms(lambda: edge(x))

    table = Table(title=f"SmallCNN, input {list(x.shape)} (converted in {convert_s:.2f} s)")
    for col in ("runtime", "max relative error", "median latency", "size"):
        table.add_column(col, justify="right" if col != "runtime" else "left")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    table.add_row("PyTorch (eager, 1 thread)", "reference", f"{torch_ms:.3f} ms", f"{params:,} B of parameters")
    table.add_row("LiteRT (XNNPACK, 1 thread)", f"{max_relative_error(actual, expected):.2e}", f"{litert_ms:.3f} ms",
                  f"{size:,} B .tflite")
    console = Console()
    console.print(table)
    console.print("top-1 agrees:", bool(actual.argmax() == expected.argmax()))
    console.print(edge)


if __name__ == "__main__":
    main()
