"""Subprocess worker: a training loop on the "tpu" device in each eager mode, measuring
the payload table, the device's live bytes and the process's RSS as it goes.

    python -m tests.reliability.device_memory_worker --steps 300 --debug-steps 60 --modes strict,debug,fused

Prints one JSON line: per mode, the step count, payload_count / memory_allocated after the
warm-up and at the end, and RSS samples (step, bytes) every `--every` steps. A fresh
process keeps other tests' allocations out of the RSS figures.
"""

from __future__ import annotations

import argparse
import json
import time

WARMUP = 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS (Linux only)")


def run_mode(mode: str, steps: int, every: int) -> dict:
    import torch
    import torch.nn.functional as F

    import tpu_backend

    tpu_backend.set_eager_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)) for _ in range(4)]

    def step(i: int) -> float:
        x, y = batches[i % len(batches)]
        loss = F.cross_entropy(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if mode == "fused":
            tpu_backend.mark_step()
        return loss.item()

    for i in range(WARMUP):
        step(i)
    start = time.perf_counter()
    payloads, allocated = tpu_backend.payload_count(), torch.tpu.memory_allocated()
    samples, first_loss = [], None
    for i in range(steps):
        loss = step(WARMUP + i)
        first_loss = loss if first_loss is None else first_loss
        if i % every == 0 or i == steps - 1:
            samples.append((i, _rss()))
    result = {
        "mode": mode,
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 2),
        "payloads_after_warmup": payloads,
        "payloads_end": tpu_backend.payload_count(),
        "allocated_after_warmup": allocated,
        "allocated_end": torch.tpu.memory_allocated(),
        "rss": samples,
        "first_loss": first_loss,
        "last_loss": loss,
    }
    tpu_backend.set_eager_mode("strict")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--modes", default="strict,debug,fused")
    parser.add_argument(
        "--debug-steps",
        type=int,
        default=None,
        help="steps in debug mode (default --steps; it checks every op, so it is slower)",
    )
    ns = parser.parse_args()
    results = []
    for mode in ns.modes.split(","):
        steps = ns.debug_steps if mode == "debug" and ns.debug_steps else ns.steps
        results.append(run_mode(mode, steps, max(1, ns.every * steps // ns.steps)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
