"""Programs compiled by a variable-length training loop under `torch.compile(backend="tpu")`:
exact shapes (one program per length) against bucketed shapes (one per bucket).

    python -m benchmarks.device.dynamic_shapes_bench                      # 12 lengths, powers-of-two buckets
    python -m benchmarks.device.dynamic_shapes_bench --lengths 3,17,40 --buckets 16,32,64

The model is the one-layer attention LM of `tests/tpu_backend/compile/test_dynamic_shapes.py`
(batch 2, the sequence dim marked dynamic); each step is forward + backward on the device.
Both policies run in this process with the persistent compilation cache off, so every
program is an XLA compile; compare the figures within one run (the machine's load moves them).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("TPU_CACHE_DIR", "off")
import torch
import torch._dynamo
from torch.nn import functional as F

import tpu_backend  # noqa: F401
import tpu_backend.compile as tpu_compile
from benchmarks.models import TinyLM, token_batches
from tpu_backend.compile.dynamic import using_buckets

DEFAULT_LENGTHS = (5, 7, 3, 8, 6, 11, 2, 13, 16, 9, 12, 10)


def run(lengths, buckets) -> dict:
    torch._dynamo.reset()
    tpu_compile.compile_stats().reset()
    model = TinyLM().to("tpu")
    loss_of = torch.compile(lambda ids, t: F.cross_entropy(model(ids).flatten(0, 1), t.flatten()), backend="tpu")
    start = time.perf_counter()
    with using_buckets(buckets), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for ids, targets in token_batches(lengths):
            ids, targets = ids.to("tpu"), targets.to("tpu")
            torch._dynamo.mark_dynamic(ids, 1)  # on the tensors compiled code sees (`.to` drops the mark)
            torch._dynamo.mark_dynamic(targets, 1)
            loss = loss_of(ids, targets)
            loss.backward()
            loss.item()
    stats = tpu_compile.compile_stats().programs.values()
    return {
        "programs": sum(s.misses + s.disk_hits for s in stats),
        "compile_s": sum(s.compile_seconds for s in stats),
        "loop_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    parser.add_argument("--buckets", default="powers_of_two", help="comma-separated sizes or powers_of_two")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    buckets = args.buckets if args.buckets == "powers_of_two" else [int(b) for b in args.buckets.split(",")]
    print(f"{len(lengths)} lengths {lengths}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'policy':<24} {'programs':>8} {'compile s':>10} {'loop s':>8}")
    for name, policy in (("exact shapes", None), (f"buckets {args.buckets}", buckets)):
        figures = run(lengths, policy)
        print(f"{name:<24} {figures['programs']:>8} {figures['compile_s']:>10.1f} {figures['loop_s']:>8.1f}")


if __name__ == "__main__":
    main()
