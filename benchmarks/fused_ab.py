"""Fused vs strict eager training step, A/B in one process, by process CPU time.

    python benchmarks/fused_ab.py --batch 1 --rounds 30            # median CPU ms per step, ratio
    python benchmarks/fused_ab.py --batch 8 --modes cpu-eager,tpu-strict,tpu-fused
    python benchmarks/fused_ab.py --batch 1 --profile fused        # cProfile of fused steps (top functions)

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
    args = parser.parse_args()
    backend_bench.limit_threads(1)
    backend_bench._batch_size = args.batch
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


if __name__ == "__main__":
    main()
