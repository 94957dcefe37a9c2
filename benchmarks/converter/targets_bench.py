"""Zoo models across deployment targets: does the check pass, how fast on the host and in
the browser, how much arena on a microcontroller.

Per model (benchmarks/zoo/, seeded random weights): the float32 conversion checked against every
target profile (errors per target), host latency (ai-edge-litert, XNNPACK, 1 thread, p50)
and browser latency (LiteRT.js wasm in headless Chromium, p50) with the browser's max
relative error against LiteRT; then the full-int8 conversion (io=int8, 8 seeded calibration
samples) checked for `micro`, run in the tflite-micro interpreter (arena bytes, max
difference in int8 steps against LiteRT). Printed as a rich table; `--json PATH` writes it
all and `--plot PNG` a host-vs-browser chart.

    python -m benchmarks.converter.targets_bench                                  # the fast zoo subset
    python -m benchmarks.converter.targets_bench --models lenet5,tcn --json out.json --plot out.png
    python -m benchmarks.converter.targets_bench --no-web                         # without Chromium
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import litert_torch
from benchmarks.zoo import build, entries
from runtimes import bench
from runtimes.litert import LiteRTModel, max_relative_error
from runtimes.targets import PROFILES, check


def _int8(model, args) -> bytes:
    from litert_torch import quantize

    generator = torch.Generator().manual_seed(5)
    calibration = [tuple(torch.randn(a.shape, generator=generator) for a in args) for _ in range(8)]
    return litert_torch.convert(
        model, args, quant_config=quantize.full_int8(io="int8"), calibration_data=calibration, progress=False
    ).model_content()


def measure(name: str, runs: int, web: bool, tmp: str) -> dict:
    model, args = build(name)
    row: dict = {"model": name}
    content = litert_torch.convert(model, args, progress=False).model_content()
    path = os.path.join(tmp, f"{name}.tflite")
    with open(path, "wb") as f:
        f.write(content)
    row["errors"] = {t: len(check(content, t, quiet=True).errors) for t in PROFILES}
    row["host"] = bench.bench_host(path, runs=runs, warmup=3)
    if web:
        from runtimes.web import run_in_browser

        inputs = [a.numpy() for a in args]
        result = run_in_browser(content, inputs, warmup=2, runs=runs)
        row["web"] = {
            "p50_us": float(np.median(result.times_ms)) * 1e3,
            "init_us": result.init_ms * 1e3,
            "max_rel_error": max(
                max_relative_error(a, b) for a, b in zip(result.outputs, LiteRTModel(content).run(inputs))
            ),
        }
    try:
        q = _int8(model, args)
    except Exception as e:  # a model the quantizer cannot handle yet
        row["micro"] = {"error": f"quantize: {str(e).splitlines()[0][:80]}"}
        return row
    report = check(q, "micro", quiet=True)
    row["micro"] = {"check_errors": len(report.errors)}
    if report.ok:
        from runtimes.micro import run_micro

        lite = LiteRTModel(q)
        rng = np.random.default_rng(0)
        inputs = [rng.integers(-100, 100, s.shape).astype(s.dtype) for s in lite.signature().inputs]
        result = run_micro(q, inputs)
        want = lite.run(inputs)
        row["micro"].update(
            arena_bytes=result.arena_bytes,
            int8_bytes=len(q),
            max_step_diff=int(
                max(np.abs(a.astype(np.int32) - b.astype(np.int32)).max() for a, b in zip(result.outputs, want))
            ),
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo names (default: the fast subset)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-web", action="store_true", help="skip the browser")
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--plot", help="write a host-vs-browser PNG")
    ns = parser.parse_args()
    names = ns.models.split(",") if ns.models else [e.name for e in entries(fast=True) if not e.known_issue]
    web = not ns.no_web
    if web:
        from runtimes.web import web_unavailable

        if web_unavailable():
            print(f"browser skipped: {web_unavailable()}", file=sys.stderr)
            web = False
    console = Console(width=max(150, Console().width))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            console.print(f"[dim]{name} ...[/dim]")
            try:
                rows.append(measure(name, ns.runs, web, tmp))
            except Exception as e:  # one model's failure does not stop the sweep
                rows.append({"model": name, "error": str(e).splitlines()[0][:120]})
        table = Table(title="Zoo models across targets (float32 checks; micro = full int8)")
        for col in (
            "model",
            "errors per target (cpu/gpu/web/micro/edgetpu)",
            "host p50 us",
            "web p50 us",
            "web rel err",
            "micro check",
            "arena B",
            "int8 steps",
        ):
            table.add_column(col, justify="left" if col.startswith(("model", "errors")) else "right")
        for r in rows:
            if "error" in r:
                table.add_row(r["model"], f"[red]{r['error']}[/red]", "", "", "", "", "", "")
                continue
            e = r["errors"]
            errs = f"{e['android-cpu']}/{e['android-gpu']}/{e['web']}/{e['micro']}/{e['edgetpu']}"
            w, m = r.get("web", {}), r["micro"]
            table.add_row(
                r["model"],
                errs,
                f"{r['host']['inference_us']['p50']:,.0f}",
                f"{w['p50_us']:,.0f}" if w else "-",
                f"{w['max_rel_error']:.1e}" if w else "-",
                m.get("error") or ("ok" if m["check_errors"] == 0 else f"{m['check_errors']} errors"),
                f"{m['arena_bytes']:,}" if "arena_bytes" in m else "-",
                str(m.get("max_step_diff", "-")),
            )
        console.print(table)
        if ns.json:
            bench.write_json({"schema": "litert-torch-targets-bench/1", "rows": rows}, ns.json)
        if ns.plot and web:
            plotted = []
            for r in rows:
                if "error" not in r and "web" in r:
                    plotted.append(r["host"])
                    plotted.append(
                        {
                            **r["host"],
                            "target": "web",
                            "inference_us": {
                                "p50": r["web"]["p50_us"],
                                "min": r["web"]["p50_us"],
                                "p90": r["web"]["p50_us"],
                            },
                        }
                    )
            bench.plot(plotted, ns.plot, "Host (XNNPACK) vs browser (LiteRT.js wasm), p50")
    return 0


if __name__ == "__main__":
    sys.exit(main())
