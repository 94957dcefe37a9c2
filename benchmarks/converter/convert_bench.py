"""Convert every zoo model and measure the result: conversion time, size, LiteRT latency, error.

Per model (benchmarks/zoo/, seeded random weights): seconds for `litert_torch.convert(...)` up
to the flatbuffer bytes, .tflite bytes, LiteRT latency (Python interpreter, XNNPACK, 1
thread, median of --runs invokes after --warmup), max relative error against PyTorch
(max|litert - torch| / max|torch|), op count and the most frequent ops, and the ratio of
the conversion time to a bare `torch.export.export` of the same module ("vs export";
conversion starts with that export, minus torch's per-node stack traces; target <= 1.3), in wall
time and in process CPU time ("cpu vs export": both are single-threaded Python work, and
CPU time is what a loaded machine does not distort; decide by it). Each time is the
minimum of --repeats alternating runs. Printed as a rich table; `--json PATH` writes
every figure (with convert()'s per-stage wall and CPU seconds, and the op histograms).

    python -m benchmarks.converter.convert_bench                      # every model
    python -m benchmarks.converter.convert_bench --models resnet18,mobilenet_v2 --json out.json
    python -m benchmarks.converter.convert_bench --fast               # the default-suite subset
    python -m benchmarks.converter.convert_bench --family transformers  # the 12 transformers families

Against the anchor (PyPI `litert-torch` 0.10.0, the reference converter). Its import name
is `litert_torch`, like ours, so it lives in its own environment; build it once with the
CPU torch pinned (an unpinned torch pulls a multi-GB CUDA build):

    python3 -m venv /tmp/anchor-venv
    /tmp/anchor-venv/bin/python -m pip install litert-torch==0.10.0 torch==2.13.0 transformers==5.24.0

then pass `--anchor-python /tmp/anchor-venv/bin/python`. The anchor converts the same models
(same seeds, so the same weights) in a subprocess (`anchor_convert.py`, which loads the zoo
by path and never imports this repository's packages); both .tflite files are then measured
here with the same harness, their latency runs interleaved so machine noise hits both (the
anchor converts everything first, so its process never runs during our timings).
Extra columns: anchor conversion seconds, speed-up (anchor s / ours s), latency ratio
(ours / anchor), size ratio (ours / anchor), anchor ops. Targets: speed-up >= 5,
latency ratio <= 1.05, size ratio <= 1.01. Both converters convert one small model first,
untimed, so one-off start-up costs (imports, caches) are not charged to the first model.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks import anchors
from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter.litert_measure import (
    LoadedModel,
    histogram_summary,
    max_relative_error,
    median_latencies,
    op_histogram,
)
from benchmarks.harness import machine, write_json

TARGETS = {"speedup": 5.0, "latency_ratio": 1.05, "size_ratio": 1.01}
EXPORT_RATIO_TARGET = 1.3  # convert() time / bare torch.export.export time
WARMUP_MODEL = "lenet5"  # small, with conv, pooling and dense layers


# torch.export's pytree code warns on every export with torch 2.13; it says nothing about the model.
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default: all)")
    parser.add_argument("--fast", action="store_true", help="only the zoo's fast (default-suite) models")
    parser.add_argument("--family", default=None, help="only this family (cnn, mlp, segmentation, ...)")
    parser.add_argument("--json", type=Path, default=None, help="write all results to this JSON file")
    parser.add_argument("--anchor-python", default=None, help="python of an environment with litert-torch 0.10.0")
    parser.add_argument("--runs", type=int, default=20, help="timed invokes per model (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed invokes before timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="conversions (and bare exports, alternating) per model; the minimum is reported",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the .tflite files in this folder")
    parser.add_argument("--model-timeout", type=float, default=300, help="seconds allowed for one conversion of ours")
    parser.add_argument("--anchor-timeout", type=float, default=1800, help="seconds for all anchor conversions")
    return parser.parse_args(argv)


def select_models(zoo, options) -> list[str]:
    names = options.models.split(",") if options.models else None
    chosen = zoo.entries(names, fast=True if options.fast else None)
    return [e.name for e in chosen if options.family is None or e.family == options.family]


def short_error(error: BaseException) -> str:
    """One line: the error's type and first line, plus the missing ops' names when the
    converter says which ATen ops it cannot lower."""
    missing = getattr(error, "ops", None)
    if missing:
        return f"{type(error).__name__}: no lowering for " + ", ".join(op.name for op in missing)
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


class ConversionTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ConversionTimeout in this (main) thread after `seconds`, so one conversion that
    never ends (a pass that does not terminate) costs one row, not the whole benchmark."""

    def expire(signum, frame):
        raise ConversionTimeout(f"conversion did not finish in {seconds:g} s (--model-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def convert_ours(model, args, timeout: float, stages: dict | None = None) -> tuple[bytes, float, float]:
    """(file, wall seconds, process CPU seconds); `stages` (if given) receives the
    conversion's per-stage seconds ("wall" and "cpu": stage -> seconds)."""
    import litert_torch

    gc.collect()  # (untimed) see convert_and_export_times
    with time_limit(timeout):
        start, cpu_start = time.perf_counter(), time.process_time()
        edge = litert_torch.convert(model, args, progress=False)
        content = edge.model_content()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if stages is not None:
        stages.update(wall=dict(edge.timings), cpu=dict(edge.cpu_timings))
    return content, seconds, cpu_seconds


def bare_export_seconds(model, args) -> tuple[float, float]:
    """(wall, process CPU) seconds of `torch.export.export` alone (non-strict, eval mode,
    as convert() exports)."""
    gc.collect()  # (untimed) see convert_and_export_times
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.export.export(model.eval(), tuple(args), strict=False)
    return time.perf_counter() - start, time.process_time() - cpu_start


def convert_and_export_times(model, args, options) -> tuple[bytes, dict]:
    """(file, times): convert and bare export seconds, wall and CPU, each the minimum of
    --repeats runs, alternated ABBA (convert, export, export, convert, ...) so that
    machine noise, and whatever one leaves warm for the next, hits both alike; and the
    per-stage seconds of the conversion with the least CPU time. Each timed run starts
    from a collected heap (`gc.collect()`, untimed): otherwise a full collection that the
    runs before made due (200 ms on timm_crossvit) lands in whichever run allocates next.
    The garbage collector stays on during the runs, so each pays for its own collections."""
    converts, exports, stages = [], [], []
    for k in range(max(1, options.repeats)):
        if k % 2:
            exports.append(bare_export_seconds(model, args))
        stages.append({})
        content, seconds, cpu_seconds = convert_ours(model, args, options.model_timeout, stages[-1])
        converts.append((seconds, cpu_seconds))
        if not k % 2:
            exports.append(bare_export_seconds(model, args))
    cpu = [c for _, c in converts]
    times = {
        "convert_s": min(w for w, _ in converts),
        "export_s": min(w for w, _ in exports),
        "convert_cpu_s": min(cpu),
        "export_cpu_s": min(c for _, c in exports),
        "stages": stages[cpu.index(min(cpu))],
    }
    return content, times


def torch_reference(model, args) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*args)
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return [leaf.detach().numpy() for leaf in leaves]


def measure_file(content: bytes, arrays, expected) -> tuple[LoadedModel, dict]:
    """Load a .tflite, check its outputs against PyTorch; latency is measured later, paired."""
    loaded = LoadedModel(content)
    histogram = op_histogram(content)
    figures = {
        "bytes": len(content),
        "max_rel_error": max_relative_error(loaded.run(arrays), expected),
        "op_count": sum(histogram.values()),
        "op_histogram": dict(histogram.most_common()),
    }
    return loaded, figures


class AnchorRunner:
    """Runs anchor_convert.py once for all models and hands its per-model results over as
    they arrive (the subprocess streams one JSON line per model)."""

    def __init__(self, python: str, names: list[str], out_dir: Path, seed: int, timeout: float):
        command = [python, anchors.script("anchor_convert"), "--out-dir", str(out_dir), "--seed", str(seed),
                   "--warmup-model", WARMUP_MODEL, *names]  # fmt: skip
        self.deadline = time.monotonic() + timeout
        self.log = open(out_dir / "anchor_stderr.log", "w")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # else it imports this repo's litert_torch
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=anchors.DIR, env=env
        )
        self.results: dict[str, dict] = {}
        self.import_s = None

    def result(self, name: str) -> dict:
        """Block until the anchor has converted `name` (or died, or ran out of time)."""
        while name not in self.results:
            if time.monotonic() > self.deadline:
                self.process.kill()
                return {"ok": False, "error": "anchor conversion timed out (--anchor-timeout)"}
            line = self.process.stdout.readline()
            if not line:
                code = self.process.wait()
                return {"ok": False, "error": f"anchor process exited with code {code}; see {self.log.name}"}
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray print from the anchor
            if message.get("event") == "ready":
                self.import_s = message["import_s"]
            elif "model" in message:
                self.results[message["model"]] = message
        return self.results[name]

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if not self.log.closed:
            self.log.close()


def bench_model(zoo, name: str, options, anchor: AnchorRunner | None, out_dir: Path) -> dict:
    entry = zoo.ZOO[name]
    model, args = zoo.build(name, seed=options.seed)
    arrays = [a.numpy() for a in args]
    expected = torch_reference(model, args)
    row = {
        "model": name,
        "family": entry.family,
        "inputs": [list(s) for s in entry.inputs],
        "ours": None,
        "anchor": None,
    }
    loaded = []
    try:
        content, times = convert_and_export_times(model, args, options)
        (out_dir / f"{name}.tflite").write_bytes(content)
        ours_model, figures = measure_file(content, arrays, expected)
        # stages: convert()'s own timings (export, lower, optimize, write...) of its least-CPU run
        row["ours"] = {
            "ok": True,
            **times,
            "export_ratio": times["convert_s"] / times["export_s"],
            "export_cpu_ratio": times["convert_cpu_s"] / times["export_cpu_s"],
            **figures,
        }
        loaded.append(("ours", ours_model))
    except Exception as error:
        row["ours"] = {"ok": False, "error": short_error(error)}
        if os.environ.get("CONVERT_BENCH_TRACEBACK"):
            traceback.print_exc()
    if anchor is not None:
        result = anchor.result(name)
        if result.get("ok"):
            try:
                anchor_model, figures = measure_file(Path(result["tflite"]).read_bytes(), arrays, expected)
                row["anchor"] = {"ok": True, "convert_s": result["convert_s"], **figures}
                loaded.append(("anchor", anchor_model))
            except Exception as error:
                row["anchor"] = {"ok": False, "error": "measuring the anchor's file: " + short_error(error)}
        else:
            row["anchor"] = {"ok": False, "error": result.get("error", "unknown")}
    if loaded:
        latencies = median_latencies([m for _, m in loaded], arrays, options.runs, options.warmup)
        for (who, _), seconds in zip(loaded, latencies):
            row[who]["latency_ms"] = seconds * 1e3
    if row["ours"]["ok"] and row["anchor"] and row["anchor"]["ok"]:
        ours, theirs = row["ours"], row["anchor"]
        row["ratios"] = {
            "speedup": theirs["convert_s"] / ours["convert_s"],
            "latency_ratio": ours["latency_ms"] / theirs["latency_ms"],
            "size_ratio": ours["bytes"] / theirs["bytes"],
        }
    return row


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ours"]["ok"]]
    summary = {
        "models": len(rows),
        "converted": len(ok),
        "within_1e-4": sum(1 for r in ok if r["ours"]["max_rel_error"] <= 1e-4),
        "failed": {r["model"]: r["ours"]["error"] for r in rows if not r["ours"]["ok"]},
    }
    for key in ("export_ratio", "export_cpu_ratio"):  # wall, CPU
        ratios = sorted(r["ours"][key] for r in ok)
        if not ratios:
            continue
        worst = max(ok, key=lambda r: r["ours"][key])
        over = sorted((r for r in ok if r["ours"][key] > EXPORT_RATIO_TARGET), key=lambda r: -r["ours"][key])
        summary[key] = {
            "median": float(np.median(ratios)),
            "p90": float(np.percentile(ratios, 90)),
            "worst": ratios[-1],
            "worst_model": worst["model"],
            "target": EXPORT_RATIO_TARGET,
            "models_meeting_target": sum(v <= EXPORT_RATIO_TARGET for v in ratios),
            "models": len(ratios),
            "over_target": {r["model"]: round(r["ours"][key], 3) for r in over},
        }
    paired = [r["ratios"] for r in rows if "ratios" in r]
    if paired:
        for key, target in TARGETS.items():
            values = [p[key] for p in paired]
            meets = [v >= target if key == "speedup" else v <= target for v in values]
            summary[key] = {"geomean": geomean(values), "worst": min(values) if key == "speedup" else max(values),
                            "target": target, "models_meeting_target": sum(meets), "models_paired": len(values)}  # fmt: skip
    return summary


def fmt(value, pattern, missing="-"):
    return missing if value is None else format(value, pattern)


def render(rows: list[dict], summary: dict, with_anchor: bool, console: Console) -> None:
    table = Table(title="Zoo conversion benchmark (LiteRT: XNNPACK, 1 thread, median latency)")
    for column in ["model", "convert s", "vs export", "cpu vs export", "KiB", "latency ms", "max rel err", "ops"]:
        table.add_column(column, justify="left" if column == "model" else "right")
    if with_anchor:
        for column in ["anchor s", "speed-up", "anchor ms", "lat ratio", "anchor KiB", "size ratio", "anchor ops"]:
            table.add_column(column, justify="right", style="cyan")
    mix = Table(title="Op mix (most frequent ops)")
    mix.add_column("model")
    mix.add_column("ours")
    if with_anchor:
        mix.add_column("anchor", style="cyan")
    for row in rows:
        ours, theirs, ratios = row["ours"], row.get("anchor") or {}, row.get("ratios", {})
        if ours["ok"]:
            err = ours["max_rel_error"]
            ratio, cpu_ratio = ours["export_ratio"], ours["export_cpu_ratio"]
            cells = [fmt(ours["convert_s"], ".2f"),
                     f"[{'green' if ratio <= EXPORT_RATIO_TARGET else 'red'}]{ratio:.2f}x[/]",
                     f"[{'green' if cpu_ratio <= EXPORT_RATIO_TARGET else 'red'}]{cpu_ratio:.2f}x[/]",
                     fmt(ours["bytes"] / 1024, ",.0f"), fmt(ours.get("latency_ms"), ".2f"),
                     f"[{'green' if err <= 1e-4 else 'red'}]{err:.1e}[/]", str(ours["op_count"])]  # fmt: skip
            mix_cells = [histogram_summary(ours["op_histogram"])]
        else:
            cells = ["[red]fail[/]", "", "", "", "", "", ""]
            mix_cells = [f"[red]{ours['error'][:120]}[/]"]
        if with_anchor:
            if theirs.get("ok"):
                cells += [fmt(theirs["convert_s"], ".2f"), fmt(ratios.get("speedup"), ".1f") + ("x" if ratios else ""),
                          fmt(theirs.get("latency_ms"), ".2f"), fmt(ratios.get("latency_ratio"), ".2f"),
                          fmt(theirs["bytes"] / 1024, ",.0f"), fmt(ratios.get("size_ratio"), ".3f"), str(theirs["op_count"])]  # fmt: skip
                mix_cells.append(histogram_summary(theirs["op_histogram"]))
            else:
                cells += ["[red]fail[/]", "", "", "", "", "", ""]
                mix_cells.append(f"[red]{(theirs.get('error') or '')[:120]}[/]")
        table.add_row(row["model"], *cells)
        mix.add_row(row["model"], *mix_cells)
    console.print(table)
    console.print(mix)
    line = f"converted {summary['converted']}/{summary['models']}, within 1e-4: {summary['within_1e-4']}"
    for key, what in (("export_ratio", "wall"), ("export_cpu_ratio", "CPU")):
        if key not in summary:
            continue
        e = summary[key]
        over = ", ".join(f"{name} {ratio:.2f}" for name, ratio in e["over_target"].items())
        line += (
            f"; convert/torch.export ({what}) median {e['median']:.2f}, p90 {e['p90']:.2f}, worst {e['worst']:.2f} "
            f"({e['worst_model']}; target <= {e['target']}, met by {e['models_meeting_target']}/{e['models']}"
            + (f"; over: {over})" if over else ")")
        )
    for key in TARGETS:
        if key in summary:
            s = summary[key]
            line += (f"; {key} geomean {s['geomean']:.2f} (target {'>=' if key == 'speedup' else '<='} "
                     f"{s['target']}, met by {s['models_meeting_target']}/{s['models_paired']})")  # fmt: skip
    console.print(line)
    console.print(f"[dim]load average (1, 5, 15 min) at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())}[/]")


def main(argv=None) -> int:
    options = parse_args(argv)
    # Wide enough for the anchor columns when the output is a file or a pipe.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    zoo = load_zoo()
    names = select_models(zoo, options)
    if not names:
        console.print("[red]no zoo model matches the filters[/]")
        return 2
    out_dir = options.keep or Path(tempfile.mkdtemp(prefix="convert_bench_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    anchor = None
    if options.anchor_python:
        anchor = AnchorRunner(options.anchor_python, names, out_dir, options.seed, options.anchor_timeout)
    rows = []
    try:
        # Pay our own one-off costs (imports, lowering tables) before timing anything.
        warm_model, warm_args = zoo.build(WARMUP_MODEL, seed=options.seed)
        try:
            convert_ours(warm_model, warm_args, options.model_timeout)
        except Exception as error:
            console.print(f"[yellow]warm-up conversion of {WARMUP_MODEL} failed: {short_error(error)}[/]")
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        if anchor is not None:
            # All anchor conversions first, so they never compete for the CPU with our
            # conversions or with the latency runs.
            with Progress(*columns, console=console, transient=True) as progress:
                task = progress.add_task("anchor converting", total=len(names))
                for name in names:
                    progress.update(task, description=f"anchor: {name:22s}")
                    anchor.result(name)
                    progress.advance(task)
            anchor.close()
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("converting", total=len(names))
            for name in names:
                progress.update(task, description=f"{name:22s}")
                rows.append(bench_model(zoo, name, options, anchor, out_dir))
                progress.advance(task)
    finally:
        if anchor is not None:
            anchor.close()
    summary = summarize(rows)
    if options.json:
        report = {"environment": machine(), "settings": {"runs": options.runs, "warmup": options.warmup,
                  "repeats": options.repeats,
                  "threads": 1, "delegate": "XNNPACK (interpreter default)", "seed": options.seed,
                  "anchor_python": options.anchor_python, "anchor_import_s": anchor.import_s if anchor else None},
                  "summary": summary, "models": rows}  # fmt: skip
        options.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(options.json, report)
    render(rows, summary, anchor is not None, console)
    if options.json:
        console.print(f"wrote {options.json}")
    if options.keep is None:
        console.print(f"[dim].tflite files in {out_dir}[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
