"""Fused vs strict eager training step, A/B in one process, by process CPU time.

    python benchmarks/fused_ab.py --batch 1 --rounds 30            # median CPU ms per step, ratio
    python benchmarks/fused_ab.py --batch 8 --modes cpu-eager,tpu-strict,tpu-fused
    python benchmarks/fused_ab.py --batch 1 --phases               # ... split: forward, backward, optimizer, sync
    python benchmarks/fused_ab.py --batch 1 --profile tpu-fused    # cProfile of fused steps (top functions)

The machine this runs on is shared, so wall time is noise: each step is timed by
`time.process_time()` (CPU seconds of every thread of this process, XLA's included), the
modes interleaved round by round, and the median per mode reported with the ratios to
strict. Steps are `benchmarks/backend_bench.py`'s (the small transformer, AdamW, `--threads 1`).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import backend_bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--modes", default="tpu-strict,tpu-fused")
    parser.add_argument("--profile", default=None, help="a mode to cProfile over --rounds steps (no A/B)")
    parser.add_argument("--phases", action="store_true", help="CPU ms per phase of the step, per mode")
    args = parser.parse_args()
    backend_bench.limit_threads(1)
    backend_bench._batch_size = args.batch
    if args.phases:
        return phases(args)
    modes = args.modes.split(",") if args.profile is None else [args.profile]
    steps = {m: backend_bench.make_step(args.model, m) for m in modes}
    for m in modes:
        for _ in range(args.warmup):
            steps[m]()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.rounds):
            steps[args.profile]()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(45)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(60)
        return
    times: dict[str, list[float]] = {m: [] for m in modes}
    losses = {}
    for r in range(args.rounds):
        for m in modes[r % len(modes) :] + modes[: r % len(modes)]:
            start = time.process_time()
            losses[m], _ = steps[m]()
            times[m].append(time.process_time() - start)
    med = {m: statistics.median(t) * 1e3 for m, t in times.items()}
    print(f"load average {os.getloadavg()}; model {args.model} batch {args.batch}, {args.rounds} rounds")
    for m in modes:
        ratio = f"  x strict {med[m] / med['tpu-strict']:.2f}" if "tpu-strict" in med else ""
        print(f"{m:12s} {med[m]:7.2f} ms CPU/step{ratio}  loss {losses[m]:.6f}")


PHASES = ("zero_grad", "forward+loss", "backward", "optimizer", "sync+read", "(program)")
_program_seconds = [0.0]  # CPU seconds inside fused programs (Program.__call__: XLA's run)


def _time_programs() -> None:
    from tpu_backend.compile.program import Program

    call = Program.__call__

    def timed(self, *args):
        start = time.process_time()
        try:
            return call(self, *args)
        finally:
            _program_seconds[0] += time.process_time() - start

    Program.__call__ = timed


def _phased_step(model_name: str, mode_name: str):
    """`backend_bench.make_step`'s step, timed per phase (process CPU seconds)."""
    import copy

    import torch

    from benchmarks.models import make_optimizer

    mode = backend_bench.MODES[mode_name]
    case = backend_bench.model_case(model_name)
    backend_bench.set_eager_mode(mode)
    torch.manual_seed(0)
    model = copy.deepcopy(case.build()).to(mode.device)
    optimizer = make_optimizer("adamw", model.parameters())
    inputs, target = (t.to(mode.device) for t in case.batch(torch.Generator().manual_seed(0)))

    def step() -> tuple[float, list[float]]:
        backend_bench.set_eager_mode(mode)
        marks = [time.process_time()]
        _program_seconds[0] = 0.0
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.process_time())
        loss = case.loss(model(inputs), target)
        marks.append(time.process_time())
        loss.backward()
        marks.append(time.process_time())
        optimizer.step()
        marks.append(time.process_time())
        if mode.eager_mode == "fused":
            import tpu_backend

            tpu_backend.mark_step()
        value = loss.item()
        marks.append(time.process_time())
        return value, [b - a for a, b in zip(marks, marks[1:])] + [_program_seconds[0]]

    return step


def phases(args) -> None:
    modes = args.modes.split(",")
    _time_programs()
    steps = {m: _phased_step(args.model, m) for m in modes}
    for m in modes:
        for _ in range(args.warmup):
            steps[m]()
    times: dict[str, list[list[float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % len(modes) :] + modes[: r % len(modes)]:
            times[m].append(steps[m]()[1])
    print(f"load average {os.getloadavg()}; model {args.model} batch {args.batch}, {args.rounds} rounds; CPU ms")
    print(f"{'mode':12s} " + " ".join(f"{p:>13s}" for p in PHASES) + f" {'sum':>8s}")
    for m in modes:
        medians = [statistics.median(t[i] for t in times[m]) * 1e3 for i in range(len(PHASES))]
        print(f"{m:12s} " + " ".join(f"{v:13.2f}" for v in medians) + f" {sum(medians[:-1]):8.2f}")
    print("(program): CPU ms inside the fused step's XLA program, part of sync+read")


if __name__ == "__main__":
    main()
