"""Our training steps beside JAX's on one chip, back to back, as one table (issue 45).

    python3 -m benchmarks.device.versus_jax                           # every row (on a TPU VM)
    python3 -m benchmarks.device.versus_jax --rows 374m,374m-late     # some rows
    python3 -m benchmarks.device.versus_jax --print-commands          # what each row runs

Each command runs in its own process (one process holds a chip), JAX's Llama step
(`jax_llama_late_reads.py`: the shared reference's step function) just before ours of the
same size and checkpoint policy, so both run on the same chip in the same warm stretch. A
Llama row's ratio is JAX's step time over ours (our share of JAX's MFU: the same model
FLOPs), the first step's ours over JAX's compile; the minGPT row's command times JAX's
step itself (`backend_bench`'s mode `jax`), ours over JAX's. Logs of every command go to
`--logs` (default: a temporary folder). Each command takes one to two minutes on a v5e
(most of it compiling): a device call of at most 10 minutes fits two Llama rows with their
JAX runs (about 370 s on 2026-12-07).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

from benchmarks.harness import write_json

STEP = ("--remat", "--scan-layers", "--compile-optimizer", "--modes", "tpu-compile", "--steps", "4", "--warmup", "2")
STEP_ONE_PROGRAM = ("--modes", "tpu-compile-step", "--steps", "4", "--warmup", "2", "--skip-ops")
# with the host's time per part of the step in its log (`--phases`): fused mode is host-bound there
MINGPT = ("--modes", "tpu-fused,jax", "--pipeline", "4", "--steps", "20", "--warmup", "5", "--skip-ops", "--phases")
FIRST_STEP = (
    "--remat",
    "--scan-layers",
    "--fused-optimizer",
    "--dynamo-cache",
    "--modes",
    "tpu-compile",
    "--steps",
    "3",
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: our command (a module and its arguments), the JAX run it is
    set beside (`jax_llama_late_reads` with `jax_args`; none where our command runs JAX's
    step itself), and which figures compare."""

    name: str
    ours: tuple[str, ...]
    jax_args: tuple[str, ...]
    kind: str  # one of KINDS
    target: float  # the ratio to reach: at least this, or at most for the kinds in AT_MOST


KINDS = {
    "waited": "each step waited for: JAX's step time over ours",
    "late": "each loss read 2 steps late: JAX's time between reads over ours",
    "first-step": "our first step in a fresh process over JAX's compile",
    "in-process": "our step over JAX's, both timed by our command (its mode `jax`, equal matmul precision)",
}
AT_MOST = ("first-step", "in-process")  # ours over JAX's: lower is better
ROWS = (
    Row(
        "374m",
        ("benchmarks.device.backend_bench", "--model", "llama-374m", *STEP, "--skip-ops"),
        ("--model", "374m"),
        "waited",
        0.97,
    ),
    Row(
        "374m-late",
        ("benchmarks.device.backend_bench", "--model", "llama-374m", *STEP, "--skip-ops", "--pipeline", "2"),
        ("--model", "374m"),
        "late",
        0.97,
    ),
    Row(
        "first-step",
        ("benchmarks.device.compile_time_bench", "--model", "llama-374m", *FIRST_STEP),
        ("--model", "374m"),
        "first-step",
        3.0,
    ),
    Row(
        "950m",
        ("benchmarks.device.backend_bench", "--model", "llama-950m", *STEP, "--skip-ops"),
        ("--model", "950m"),
        "waited",
        0.97,
    ),
    Row(  # keeping the matrix products: JAX's `dots_with_no_batch_dims_saveable` policy
        "374m-matmuls",
        ("benchmarks.device.backend_bench", "--model", "llama-374m", "--remat", "matmuls", *STEP[1:], "--skip-ops"),
        ("--model", "374m", "--remat", "dots"),
        "waited",
        0.97,
    ),
    *(  # the one-program step (tpu_backend.TrainStep) at each checkpoint policy, beside JAX's same policy
        Row(
            f"374m-step-{ours}",
            ("benchmarks.device.backend_bench", "--model", "llama-374m", *remat, *STEP_ONE_PROGRAM),
            ("--model", "374m", "--remat", theirs),
            "waited",
            0.97,
        )
        for ours, remat, theirs in (
            ("full", ("--remat", "full"), "full"),
            ("matmuls", ("--remat", "matmuls"), "dots"),
            ("none", (), "none"),
        )
    ),
    Row(
        "mingpt-fused",
        ("benchmarks.device.backend_bench", "--model", "mingpt", "--batch", "32", *MINGPT),
        (),
        "in-process",
        1.2,
    ),
)
JAX = "benchmarks.device.jax_llama_late_reads"
LAG = 2  # --pipeline 2 beside --lag 2
SECOND_PROCESS_TARGET = 0.10  # compile_time_bench's: the second process's first step over the first's


def run_module(module_and_args: tuple[str, ...], log: str, timeout_s: float) -> dict | str:
    """`python -m module args --json FILE` in its own process: the JSON it wrote, or why not."""
    out = log + ".json"
    command = [sys.executable, "-m", *module_and_args, "--json", out]
    try:
        with open(log, "w") as f:
            done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"ran past {timeout_s:.0f} s (log: {log})"
    if done.returncode != 0 or not os.path.exists(out):
        return f"exit {done.returncode} (log: {log})"
    with open(out) as f:
        return json.load(f)


def _step(ours: dict, mode: str) -> dict:
    """The mode's step from `backend_bench`'s JSON; a step that failed fails the row."""
    (step,) = [s for s in ours["steps"] if s["mode"] == mode]
    if step.get("error"):
        raise ValueError(f"{'JAX' if mode == 'jax' else 'ours'}: {step['error']}")
    return step


def figures(row: Row, ours: dict, jax: dict | None) -> dict:
    """The row's figures from the commands' JSON: ours, JAX's, their ratio and the target."""
    if row.kind == "first-step":
        (mode,) = ours["modes"]
        first, second = mode["first"]["first_step_s"], mode["second"]["first_step_s"]
        ratio = first / jax["compile_s"]
        return {
            "ours": f"{first:.1f} s (second process {second:.2f} s, {second / first:.3f})",
            "jax": f"compile {jax['compile_s']:.1f} s",
            "ratio": ratio,
            "meets": ratio <= row.target and second / first <= SECOND_PROCESS_TARGET,
        }
    if row.kind == "in-process":
        fused, theirs = _step(ours, "tpu-fused"), _step(ours, "jax")
        ratio = fused["median_s"] / theirs["median_s"]
        return {
            "ours": f"{fused['median_s'] * 1e3:.1f} ms (host {fused['host_median_s'] * 1e3:.1f} ms)",
            "jax": f"{theirs['median_s'] * 1e3:.1f} ms",
            "ratio": ratio,
            "meets": ratio <= row.target,
        }
    step = _step(ours, row.ours[row.ours.index("--modes") + 1])
    ours_ms = step["median_s"] * 1e3
    jax_ms = jax["late_ms" if row.kind == "late" else "waited_ms"]
    return {
        "ours": f"{ours_ms:.1f} ms (first step {step['first_step_s']:.1f} s)",
        "jax": f"{jax_ms:.2f} ms (its program {jax['program_gib']:.2f} GiB)",
        "ratio": jax_ms / ours_ms,
        "meets": jax_ms / ours_ms >= row.target,
    }


def jax_command(row: Row) -> tuple[str, ...] | None:
    return (JAX, *row.jax_args, "--lag", str(LAG)) if row.jax_args else None


def measure(rows: list[Row], run: Callable[[tuple, str], dict | str], logs: str) -> list[dict]:
    """Every row: JAX's run (once per distinct command, just before the first row that
    needs it), then ours. A failed command leaves its row with the reason."""
    jax_runs: dict[tuple, dict | str] = {}
    results = []
    for row in rows:
        command = jax_command(row)
        if command is not None and command not in jax_runs:
            name = "-".join(a.lstrip("-") for a in row.jax_args)  # model-374m-remat-dots
            jax_runs[command] = run(command, os.path.join(logs, f"jax-{name}.log"))
        jax = jax_runs.get(command)
        ours = run(row.ours, os.path.join(logs, f"ours-{row.name}.log"))
        result = {
            "row": row.name,
            "kind": row.kind,
            "command": "python3 -m " + " ".join(row.ours),
            "target": row.target,
        }
        failed = next((f"{who}: {r}" for who, r in (("JAX", jax), ("ours", ours)) if isinstance(r, str)), None)
        if failed is None:
            try:
                result.update(figures(row, ours, jax))
            except ValueError as error:  # the command ran, a step did not
                failed = str(error)
            except (KeyError, TypeError) as error:
                failed = f"unexpected output: {type(error).__name__}: {error}"
        if failed is not None:
            result["failed"] = failed
        results.append(result)
    return results


def print_table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Ours beside JAX's on one chip")
    for column in ("row", "ours", "JAX", "ratio (target)"):
        table.add_column(column)
    for r in results:
        if "failed" in r:
            table.add_row(r["row"], f"failed: {r['failed']}", "", "")
            continue
        sign = "<=" if r["kind"] in AT_MOST else ">="
        verdict = "met" if r["meets"] else "not met"
        table.add_row(r["row"], r["ours"], r["jax"], f"{r['ratio']:.3f} ({sign} {r['target']}: {verdict})")
    Console(width=160).print(table)
    for kind in dict.fromkeys(r["kind"] for r in results):
        print(f"  {kind} rows: {KINDS[kind]}")
    for r in results:
        print(f"  {r['row']}: {r['command']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [r.name for r in ROWS]
    parser.add_argument("--rows", default=",".join(names), help=f"comma-separated, of {', '.join(names)}")
    parser.add_argument("--timeout", type=float, default=400, help="seconds each command may run")
    parser.add_argument("--logs", help="folder for each command's log and JSON (default: temporary)")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE ('-': stdout)")
    parser.add_argument("--print-commands", action="store_true", help="print each row's commands and exit")
    args = parser.parse_args(argv)
    unknown = set(args.rows.split(",")) - set(names)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; choose from {names}")
    rows = [r for r in ROWS if r.name in args.rows.split(",")]
    if args.print_commands:
        for row in rows:
            before = f"python3 -m {' '.join(jax_command(row))}; " if row.jax_args else ""
            print(f"{row.name}: {before}python3 -m {' '.join(row.ours)}")
        return 0
    logs = args.logs or tempfile.mkdtemp(prefix="versus-jax-")
    os.makedirs(logs, exist_ok=True)
    results = measure(rows, lambda command, log: run_module(command, log, args.timeout), logs)
    print_table(results)
    if args.json:
        write_json(args.json, {"rows": results})
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
