"""What the eager index checks cost (`tpu_backend/eager/bounds.py`): indexing ops with and without.

    python -m benchmarks.device.index_checks_bench              # this machine's backend
    python -m benchmarks.device.index_checks_bench --json out.json

Each indexing op of a training or decoding loop (an embedding lookup, `x[idx]`,
`index_select`, `gather`) runs `--calls` times in a process of its own with the checks on
(the default) and off (`TPU_INDEX_CHECKS=0`, the compiled dispatch path as before), the
processes alternating for `--rounds` rounds (ABBA): microseconds of host time per call
(issued back to back, one wait at the end, where the checks run), the median over rounds,
and the ratio. The checks make each call take the Python dispatch path and record its index
arrays; the wait reads them back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.harness import console, machine, module_command, repo_env, table, write_json

OPS = ("embedding", "index", "index_select", "gather")


def child(calls: int) -> dict:
    import torch

    import tpu_backend  # noqa: F401

    weight = torch.randn(32000, 64, device="tpu")
    ids = torch.randint(0, 32000, (8, 256), device="tpu")
    x = torch.randn(512, 128, device="tpu")
    rows = torch.randint(0, 512, (64,), device="tpu")
    gather_index = torch.randint(0, 128, (512, 8), device="tpu")
    fns = {
        "embedding": lambda: torch.nn.functional.embedding(ids, weight),
        "index": lambda: x[rows],
        "index_select": lambda: x.index_select(0, rows),
        "gather": lambda: x.gather(1, gather_index),
    }
    out = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        torch.tpu.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.tpu.synchronize()
        out[name] = (time.perf_counter() - start) / calls * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.calls)))
        return
    samples = {True: [], False: []}
    for i in range(args.rounds):
        for checked in (True, False) if i % 2 == 0 else (False, True):
            env = repo_env(TPU_INDEX_CHECKS="1" if checked else "0")
            command = module_command("benchmarks.device.index_checks_bench", "--child", "--calls", str(args.calls))
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"the child failed:\n{done.stderr[-3000:]}")
            samples[checked].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for name in OPS:
        on = statistics.median(s[name] for s in samples[True])
        off = statistics.median(s[name] for s in samples[False])
        rows.append(
            {"op": name, "checked_us": round(on, 1), "unchecked_us": round(off, 1), "ratio": round(on / off, 2)}
        )
    console().print(
        table(
            f"Index checks: host us per call ({args.calls} calls, {args.rounds} rounds, {os.cpu_count()} cores)",
            ["op", "checked", "unchecked", "ratio"],
            [[r["op"], r["checked_us"], r["unchecked_us"], r["ratio"]] for r in rows],
        )
    )
    if args.json:
        write_json(args.json, {"machine": machine(), "calls": args.calls, "rows": rows})


if __name__ == "__main__":
    main()
