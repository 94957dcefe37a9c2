"""Child process for the cross-process cache test: one compiled training step, as JSON.

Run as `python cache_child.py [--cache-only]` with `TPU_CACHE_DIR` set. It trains a small
MLP for one step with `torch.compile(backend="tpu")` on CPU tensors and prints one JSON
line: our compile statistics, the programs XLA compiled by JAX's own count (its
backend-compile events), the time of the first step (capture + compile or load + run)
and the loss.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import torch
from torch import nn

import tpu_backend.compile as tpu_compile

xla_compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kwargs: (
        xla_compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


def first_step() -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = nn.functional.cross_entropy(torch.compile(model, backend="tpu")(x), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    start = time.perf_counter()
    if "--cache-only" in sys.argv:
        with tpu_compile.cache_only():
            loss = first_step()
    else:
        loss = first_step()
    seconds = time.perf_counter() - start
    total = tpu_compile.compile_stats().total()
    print(
        json.dumps(
            {
                "misses": total.misses,
                "disk_hits": total.disk_hits,
                "compile_seconds": total.compile_seconds,
                "xla_compiles": len(xla_compiles),
                "first_step_seconds": seconds,
                "loss": loss,
                "cache_dir": str(tpu_compile.cache_dir()),
            }
        )
    )


if __name__ == "__main__":
    main()
