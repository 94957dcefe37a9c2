"""LiteRT latency of our files against the anchor's, on a shared, loaded machine.

    python -m benchmarks.converter.latency_ab --anchor-dir DIR [--models a,b] [--jsonl out.jsonl]
    python -m benchmarks.converter.latency_ab --anchor-dir DIR --jsonl out.jsonl --summary  # the table

DIR holds the anchor's files, `<name>.anchor.tflite`, written by
`anchor_convert.py --out-dir DIR ...` (run with the anchor environment's python). Our file
is converted here, from the same zoo model and seed. Both run in the Python interpreter
(XNNPACK, 1 thread) on the zoo's sample inputs.

The method, and why:
- CPU time of the calling thread (`time.thread_time`) around each `invoke()`: with 1
  thread, LiteRT runs the whole model in the calling thread, so time spent descheduled
  while other processes run is not counted (wall time on 2 shared cores is not usable).
- Position bias: two interpreters holding the *same* file, timed alternately in one
  process, read up to 1.10 apart, and which one reads slower follows the order they were
  created in (where their arenas and packed weights land in memory), not the file. So each
  of --blocks blocks creates a fresh pair, ours first in even blocks and the anchor's
  first in odd ones; within a block the invokes alternate A B B A ...; a block's figure is
  the ratio of the two models' --estimator (default `min`: interference only ever adds
  time, and the minimum has the smallest block-to-block spread of the estimators tried).
  The reported ratio is the geometric mean over the blocks, so the two creation orders
  weigh equally and their bias cancels.
- `--control`: the anchor's file against a copy of itself, measured the same way; its
  ratio is the residual bias of the method on that model (ideally 1.00) and is reported
  beside the ratio, with `corrected` = ratio / control.

Each row (one JSON line with --jsonl; rerunning with the same file skips models already
there): ours_ms and anchor_ms (medians of the block figures), ratio (ours / anchor),
block_ratios, control and corrected when asked, our and the anchor's max relative error
against PyTorch (an anchor file of a different zoo definition shows up as a large error:
the row then says `anchor file stale` and is not timed), op counts and the 1-minute load
average at the end of the row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter.litert_measure import LoadedModel, invoke_times, max_relative_error, op_histogram

TARGET = 1.05
STALE_ERROR = 0.1  # the anchor's file is off by up to 3e-2 on some decoders; another model's weights give ~1
ESTIMATORS = {"min": min, "median": statistics.median}

warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def paired_ratio(content_a: bytes, content_b: bytes, arrays, blocks: int, runs: int, warmup: int,
                 estimator: str = "min") -> dict:  # fmt: skip
    """Latency of file A over file B: fresh interpreter pairs, created A-first and B-first in
    turn; the geometric mean of the per-block ratios of `estimator` over each model's times."""
    pick = ESTIMATORS[estimator]
    a_times, b_times, ratios = [], [], []
    for block in range(blocks):
        order = (0, 1) if block % 2 == 0 else (1, 0)  # which file's interpreter is created first
        contents = (content_a, content_b)
        models = {k: LoadedModel(contents[k]) for k in order}
        times = dict(zip(order, invoke_times([models[k] for k in order], arrays, runs, warmup, time.thread_time)))
        ta, tb = times[0], times[1]
        a_times.append(pick(ta))
        b_times.append(pick(tb))
        ratios.append(a_times[-1] / b_times[-1])
        del models
    return {
        "a_ms": 1e3 * statistics.median(a_times),
        "b_ms": 1e3 * statistics.median(b_times),
        "ratio": math.exp(sum(math.log(r) for r in ratios) / len(ratios)),
        "block_ratios": [round(r, 3) for r in ratios],
    }


def find_anchor(name: str, dirs: list[Path]) -> Path | None:
    """The newest `<name>.anchor.tflite` in the given directories."""
    found = [d / f"{name}.anchor.tflite" for d in dirs if (d / f"{name}.anchor.tflite").exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def torch_outputs(model, args) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*args)
    leaves = list(out.values()) if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
    return [leaf.detach().numpy() for leaf in leaves]


def measure(zoo, name: str, options) -> dict:
    import litert_torch

    row: dict = {"model": name}
    anchor_path = find_anchor(name, options.anchor_dir)
    if anchor_path is None:
        return {**row, "error": "no anchor file"}
    model, args = zoo.build(name, seed=options.seed)
    arrays = [t.numpy() for t in args]
    expected = torch_outputs(model, args)
    ours = litert_torch.convert(model, args, progress=False).model_content()
    if options.save_dir:
        (options.save_dir / f"{name}.ours.tflite").write_bytes(ours)
    anchor = anchor_path.read_bytes()
    row["ours_err"] = max_relative_error(LoadedModel(ours).run(arrays), expected)
    try:
        loaded = LoadedModel(anchor)
    except (RuntimeError, ValueError) as error:  # e.g. StableHLO ops this LiteRT has no kernel for
        loaded, row["anchor_err"] = None, None
        row["error"] = "the anchor's file does not load in LiteRT: " + " ".join(str(error).split())[:200]
    try:
        if loaded is not None:
            row["anchor_err"] = max_relative_error(loaded.run(arrays), expected)
    except ValueError as error:  # another input or output signature
        row["anchor_err"] = None
        row["error"] = f"anchor file stale ({error})"
    if row["anchor_err"] is not None and row["anchor_err"] > STALE_ERROR:
        row["error"] = f"anchor file stale (max relative error {row['anchor_err']:.2g} against PyTorch)"
    row["ours_ops"] = sum(op_histogram(ours).values())
    row["anchor_ops"] = sum(op_histogram(anchor).values())
    if "error" in row:
        return row
    paired = paired_ratio(ours, anchor, arrays, options.blocks, options.runs, options.warmup, options.estimator)
    row.update(ours_ms=paired["a_ms"], anchor_ms=paired["b_ms"], ratio=paired["ratio"],
               block_ratios=paired["block_ratios"], method=f"{options.estimator}/{options.blocks}x{options.runs}")  # fmt: skip
    if options.control:
        control = paired_ratio(anchor, bytes(anchor), arrays, options.blocks, options.runs, options.warmup,
                               options.estimator)  # fmt: skip
        row.update(control=control["ratio"], corrected=row["ratio"] / control["ratio"])
    row["load"] = os.getloadavg()[0]
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-dir", type=Path, action="append", default=[],
                        help="directory of <name>.anchor.tflite files (repeatable; the newest file wins)")  # fmt: skip
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default: all)")
    parser.add_argument("--blocks", type=int, default=6, help="fresh interpreter pairs per model (even)")
    parser.add_argument("--runs", type=int, default=15, help="timed invokes per model and block")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--estimator", choices=sorted(ESTIMATORS), default="min")
    parser.add_argument("--control", action="store_true", help="also time the anchor's file against a copy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jsonl", type=Path, default=None, help="append rows here; models already in it are skipped")
    parser.add_argument("--save-dir", type=Path, default=None, help="keep our files here as <name>.ours.tflite")
    parser.add_argument("--summary", action="store_true", help="print the --jsonl file's table and stop")
    options = parser.parse_args(argv)
    if options.summary:
        print(summary([json.loads(line) for line in options.jsonl.read_text().splitlines() if line.strip()]))
        return
    if not options.anchor_dir:
        parser.error("--anchor-dir is required (directory of <name>.anchor.tflite files)")
    if options.blocks % 2:
        parser.error("--blocks must be even (half the pairs are created ours-first, half anchor-first)")
    zoo = load_zoo()
    names = options.models.split(",") if options.models else [e.name for e in zoo.entries()]
    done = set()
    if options.jsonl and options.jsonl.exists():
        done = {json.loads(line)["model"] for line in options.jsonl.read_text().splitlines() if line.strip()}
    for name in names:
        if name in done:
            continue
        try:
            row = measure(zoo, name, options)
        except Exception as error:  # report and go on with the next model
            row = {"model": name, "error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
        if options.jsonl:
            with options.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")
        print(format_row(row), flush=True)


def summary(rows: list[dict]) -> str:
    """A markdown table of the rows, then the median and worst ratio and those over TARGET."""
    lines = ["| model | ratio | control | method | ours ms | anchor ms | ops ours/anchor | load |", "|---" * 8 + "|"]
    for r in rows:
        if "ratio" not in r:
            lines.append(f"| {r['model']} | - | | {r.get('error')} | | | | |")
            continue
        control = f"{r['control']:.3f}" if "control" in r else ""
        lines.append(f"| {r['model']} | {r['ratio']:.3f} | {control} | {r['method']} | {r['ours_ms']:.3f} | "
                     f"{r['anchor_ms']:.3f} | {r['ours_ops']}/{r['anchor_ops']} | {r['load']:.1f} |")  # fmt: skip
    ratios = sorted((r["ratio"], r["model"]) for r in rows if "ratio" in r)
    if ratios:
        over = [f"{m} {x:.3f}" for x, m in ratios if x > TARGET]
        lines.append(f"\n{len(ratios)} measured of {len(rows)}; median {statistics.median(x for x, _ in ratios):.3f}, "
                     f"worst {ratios[-1][0]:.3f} ({ratios[-1][1]}); over {TARGET}: {', '.join(over) or 'none'}")  # fmt: skip
    return "\n".join(lines)


def format_row(row: dict) -> str:
    if "ratio" not in row:
        return f"{row['model']:24s} {row.get('error')}"
    text = (f"{row['model']:24s} ratio {row['ratio']:.3f} {row['block_ratios']} ours {row['ours_ms']:.2f} ms "
            f"anchor {row['anchor_ms']:.2f} ms ops {row['ours_ops']}/{row['anchor_ops']} load {row['load']:.1f}")  # fmt: skip
    if "control" in row:
        text += f" control {row['control']:.3f} corrected {row['corrected']:.3f}"
    return text + (" OVER" if row["ratio"] > TARGET else "")


if __name__ == "__main__":
    main()
