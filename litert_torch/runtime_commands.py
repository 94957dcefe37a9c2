"""The `litert-torch check` and `litert-torch bench` commands: the CLI's front end for
`runtimes` (registered by `litert_torch.cli`, which owns `main`; exit codes: `cli_report.py`).

    litert-torch check model.tflite --target android-gpu      # exit 1 when it breaks a rule
    litert-torch bench model.tflite --json out.json           # host timings (--op-profile: per op)
    litert-torch bench a.tflite --compare b.tflite            # alternating, with ratios
    litert-torch bench model.tflite --target android [--run]  # script for benchmark_model via adb
    litert-torch bench --parse device.log --target android    # its log -> the same JSON
    litert-torch bench a.tflite b.tflite --plot times.png     # several models, one chart
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from litert_torch.cli_report import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    model_file_error,
    output_path_error,
    print_violations,
)


def _console():
    from rich.console import Console

    return Console(width=max(150, Console().width))


def _model_files_error(paths) -> tuple[int, str] | None:
    """The first of `paths` that is not a readable, valid .tflite file (`model_file_error`):
    a one-line error with the shared exit code, never a traceback or an interpreter crash."""
    for path in paths:
        if path and (problem := model_file_error(path)) is not None:
            return problem
    return None


def cmd_check(ns) -> int:

    from runtimes.targets import PROFILES, check

    if (problem := _model_files_error([ns.model])) is not None:
        print(f"error: {problem[1]}", file=sys.stderr)
        return problem[0]
    targets = list(PROFILES) if ns.target == "all" else [ns.target]
    reports = []
    for target in targets:
        try:
            reports.append(check(ns.model, target, quiet=True))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
    if ns.json:
        print(json.dumps([r.to_dict() for r in reports] if len(reports) > 1 else reports[0].to_dict(), indent=2))
        return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED
    console = _console()
    for report in reports:
        style = "green" if report.ok else "red"
        console.print(f"[{style}]{report.summary()}[/{style}]", highlight=False)
        if report.violations:
            print_violations(console, report.violations, ns.limit)
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED


def _table(results: list[dict]):
    from rich.table import Table

    table = Table(title="Inference benchmark (microseconds)")
    for col in (
        "model",
        "target",
        "init",
        "first",
        "warm-up avg",
        "avg",
        "p50",
        "p90",
        "min",
        "max",
        "peak MB",
        "threads",
        "delegate",
    ):
        table.add_column(col, justify="left" if col in ("model", "target", "delegate") else "right")

    def us(v):
        return "-" if v is None else f"{v:,.0f}"

    for r in results:
        s, rt = r["inference_us"], r["runtime"]
        table.add_row(
            os.path.basename(str(r["model"])),
            r["target"],
            us(r.get("init_us")),
            us(r.get("first_us")),
            us(r.get("warmup_avg_us")),
            us(s.get("avg")),
            us(s.get("p50")),
            us(s.get("p90")),
            us(s.get("min")),
            us(s.get("max")),
            f"{r.get('memory', {}).get('peak_rss_mb', 0) or 0:,.1f}",
            str(rt.get("threads", "")),
            str(rt.get("delegate") or rt.get("accelerator") or ""),
        )
    return table


def _op_table(result: dict):
    """Per-op-type time: the host's one-op runs summed by type, or benchmark_model's table."""
    from rich.table import Table

    from runtimes.bench import op_profile_by_type

    rows = result["op_profile"]
    table = Table(title=f"Per-op profile: {os.path.basename(str(result['model']))} ({result['target']})")
    for col in ("op", "count", "time (us)", "%"):
        table.add_column(col, justify="left" if col == "op" else "right")
    if "median_us" in rows[0] or "error" in rows[0]:  # host rows: one per op
        for e in op_profile_by_type(rows):
            table.add_row(e["op"], str(e["count"]), f"{e['total_us']:,.1f}", f"{e['percent']:.1f}")
    else:
        for e in rows:
            table.add_row(e["op"], str(e["count"]), f"{e['avg_ms'] * 1e3:,.1f}", f"{e['percent']:.1f}")
    return table


def _write_script(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def cmd_bench(ns) -> int:
    from runtimes import bench

    console = _console()
    options = dict(runs=ns.runs, warmup=ns.warmup)
    if (problem := _model_files_error(list(ns.models or []) + [ns.compare])) is not None:
        print(f"error: {problem[1]}", file=sys.stderr)
        return problem[0]
    if ns.parse and not os.path.isfile(ns.parse):
        print(f"error: no such file: {ns.parse}", file=sys.stderr)
        return EXIT_USAGE
    for output in (ns.json, ns.plot, ns.script):  # checked before the runs, which take a while
        if output and (problem := output_path_error(output)) is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if ns.parse:
        with open(ns.parse) as f:
            results = [bench.parse_benchmark_model(f.read(), target=ns.target or "android")]
    elif not ns.models:
        print("error: give a model (or --parse LOG)", file=sys.stderr)
        return EXIT_USAGE
    elif ns.target in ("android", "ios"):
        device = dict(threads=ns.threads or 4, delegate=ns.delegate, op_profile=ns.op_profile, **options)
        model = ns.models[0]
        script = ns.script or f"bench_{ns.target}.sh"
        if ns.target == "android":
            _write_script(script, bench.android_script(model, benchmark_binary=ns.benchmark_binary, **device))
        else:
            _write_script(script, bench.ios_script(model, **device))
        console.print(f"wrote {script}")
        if not ns.run_on_device:
            return EXIT_OK
        if ns.target == "ios":
            print("error: --run is for Android (adb); on iOS run the script on a Mac", file=sys.stderr)
            return EXIT_USAGE
        proc = subprocess.run(["bash", script], capture_output=True, text=True)
        if proc.returncode:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return EXIT_FAILED
        results = [bench.parse_benchmark_model(proc.stdout + proc.stderr, target="android")]
    elif ns.compare:
        result = bench.compare(ns.models[0], ns.compare, threads=ns.threads, **options)
        results = [result["a"], result["b"]]
        console.print(_table(results))
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in result["ratio_b_over_a"].items() if v is not None)
        console.print(f"B / A ({os.path.basename(ns.compare)} / {os.path.basename(ns.models[0])}): {ratios}")
        if ns.json:
            bench.write_json(result, ns.json)
        if ns.plot:
            bench.plot(results, ns.plot)
        return EXIT_OK
    elif ns.target == "web":
        results = [bench.bench_web(m, accelerator=ns.accelerator, **options) for m in ns.models]
    elif ns.target in (None, "host"):
        results = [
            bench.bench_host(m, threads=ns.threads, use_xnnpack=not ns.no_xnnpack, per_op=ns.op_profile, **options)
            for m in ns.models
        ]
    else:
        print(f"error: --target must be host, web, android or ios, got {ns.target!r}", file=sys.stderr)
        return EXIT_USAGE
    console.print(_table(results))
    for r in results:
        if r.get("op_profile"):
            console.print(_op_table(r))
    if ns.json:
        bench.write_json(results[0] if len(results) == 1 else {"schema": bench.SCHEMA, "results": results}, ns.json)
    if ns.plot:
        bench.plot(results, ns.plot)
    return EXIT_OK


def add_commands(sub) -> None:
    from runtimes.targets import PROFILES

    chk = sub.add_parser("check", help="check a .tflite file against a deployment target")
    chk.add_argument("model", help="the .tflite file")
    chk.add_argument("--target", required=True, help=f"one of: {', '.join(PROFILES)}, or all")
    chk.add_argument("--json", action="store_true", help="print the report as JSON")
    chk.add_argument("--limit", type=int, default=40, help="most kinds of violation (rows) to list per target")
    chk.set_defaults(run=cmd_check)

    b = sub.add_parser("bench", help="benchmark .tflite files (host, web, or scripts for phones)")
    b.add_argument("models", nargs="*", help=".tflite file(s)")
    b.add_argument("--target", choices=["host", "web", "android", "ios"], default=None)
    b.add_argument("--compare", metavar="B.tflite", help="run MODEL and B alternately in one process")
    b.add_argument("--runs", type=int, default=50)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--no-xnnpack", action="store_true", help="host: builtin kernels only")
    b.add_argument("--delegate", choices=["cpu", "xnnpack", "gpu"], default="xnnpack", help="android/ios")
    b.add_argument("--accelerator", choices=["wasm", "webgpu"], default="wasm", help="web")
    b.add_argument(
        "--op-profile",
        action="store_true",
        help="per-op profile (host: each op timed alone; android/ios: benchmark_model's profiler)",
    )
    b.add_argument("--benchmark-binary", default="benchmark_model", help="android: local benchmark_model binary")
    b.add_argument("--script", help="android/ios: where to write the script")
    b.add_argument(
        "--run",
        dest="run_on_device",
        action="store_true",
        help="android: run the script through adb and parse its output",
    )
    b.add_argument("--parse", metavar="LOG", help="parse a benchmark_model log instead of running")
    b.add_argument("--json", metavar="PATH", help="write the results as JSON")
    b.add_argument("--plot", metavar="PNG", help="write a bar chart of the results")
    b.set_defaults(run=cmd_bench)
