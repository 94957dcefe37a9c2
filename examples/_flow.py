"""Shared steps of the examples' flow: train on "tpu", then measure in PyTorch and LiteRT.

Every example is: build a model, `train(...)` it on the "tpu" device, convert it with
`litert_torch.convert` (straight from the device: no `.cpu()`), check the LiteRT model
against the trained PyTorch model, and print a `results_table`. These helpers keep the
examples about their model and data.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Iterable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import tpu_backend  # noqa: F401  (registers the "tpu" device)
from converter.pipeline import cpu_view

console = Console()


def train(
    model: torch.nn.Module,
    batches: Iterable[tuple],
    loss_fn: Callable,
    *,
    lr: float,
    device: str = "tpu",
    weight_decay: float = 0.0,
    log_every: int = 0,
) -> list[float]:
    """One AdamW pass over `batches` (tuples of CPU tensors: inputs..., target) on `device`.
    Returns the loss of every step. The model must already be on `device`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    losses = []
    for step, batch in enumerate(batches):
        *inputs, target = (t.to(device) for t in batch)
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if log_every and step % log_every == 0:
            console.log(f"step {step:4d}  loss {losses[-1]:.4f}")
    model.eval()
    return losses


def run_per_sample(edge, *inputs: torch.Tensor) -> np.ndarray:
    """LiteRT outputs for a batch, one sample at a time (as an app calls the model),
    concatenated along the batch axis."""
    return np.concatenate([np.atleast_1d(edge(*(x[i : i + 1] for x in inputs))) for i in range(len(inputs[0]))])


def mean_loss(losses: list[float], n: int = 5) -> tuple[float, float]:
    """(mean of the first n losses, mean of the last n): noise-robust start and end."""
    n = max(1, min(n, len(losses) // 2))
    return float(np.mean(losses[:n])), float(np.mean(losses[-n:]))


def median_us(fn: Callable, *, repeats: int = 50, warmup: int = 3) -> float:
    """Median wall time of `fn()` in microseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def torch_cpu_latency_us(model: torch.nn.Module, args: tuple, **kwargs) -> float:
    """PyTorch eager latency on one CPU thread (the LiteRT interpreter's default), on a
    CPU copy of the model: the comparison a phone's CPU makes."""
    cpu_model = cpu_view(model).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return median_us(lambda: cpu_model(*args), **kwargs)
    finally:
        torch.set_num_threads(threads)


def results_table(title: str, columns: list[str], rows: list[list]) -> Table:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[str(cell) for cell in row])
    return table


def cli(doc: str, run: Callable, report: Callable, argv=None, *, choices: dict | None = None, **defaults) -> dict:
    """An example's command line: one flag per keyword of `run` given in `defaults`
    (`steps=300` -> `--steps 300`; a True default -> `--no-<name>`), then `report(run(...))`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in defaults.items():
        flag = name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(f"--no-{flag}", dest=name, action="store_false", help=f"skip {flag}")
        else:
            parser.add_argument(f"--{flag}", type=type(default), default=default, choices=(choices or {}).get(name))
    results = run(**vars(parser.parse_args(argv)))
    report(results)
    return results
