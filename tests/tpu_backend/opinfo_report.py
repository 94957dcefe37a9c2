"""Print the OpInfo parity table of the "tpu" device: pass / fail / skip per op, and counts.

    python -m tests.tpu_backend.opinfo_report                      # float32, forward + grad, all ops
    python -m tests.tpu_backend.opinfo_report --dtype bfloat16 --max-samples 2 --no-grad
    python -m tests.tpu_backend.opinfo_report --ops 'nn.functional.*' --show pass,fail,mismatch
    python -m tests.tpu_backend.opinfo_report --json opinfo.json   # machine-readable results

Run from the repository root. `PARITY_DEVICE=cpu` checks the harness against itself.
The comparison rules and the skip list live in `tests/tpu_backend/opinfo_harness.py`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
import warnings
from collections import Counter

import torch

from tests.tpu_backend import opinfo_harness as harness

STATUSES = ("pass", "shape-only", "mismatch", "fail", "skip", "n/a")
STYLE = {"pass": "green", "shape-only": "cyan", "mismatch": "yellow", "fail": "red", "skip": "dim", "n/a": "dim"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", help="torch dtype name (float32, bfloat16, int64, bool...)")
    parser.add_argument("--ops", default="*", help="comma-separated glob patterns over op ids (default: all)")
    parser.add_argument(
        "--slice",
        default=":",
        metavar="START:STOP",
        help="only op_db entries START..STOP-1 of the selection (split a long sweep over processes)",
    )
    parser.add_argument("--max-samples", type=int, default=None, help="samples per op (default: all)")
    parser.add_argument("--no-grad", action="store_true", help="forward only")
    parser.add_argument(
        "--show", default="mismatch,fail", help=f"statuses to list op by op ({','.join(STATUSES)}, or all)"
    )
    parser.add_argument("--json", metavar="FILE", help="write every result to FILE as JSON")
    parser.add_argument(
        "--emit-known-failures",
        action="store_true",
        help="print the failing ops as a KNOWN_FAILURES dict body for opinfo_harness.py",
    )
    parser.add_argument("--progress", action="store_true", help="print each op as it finishes (to stderr)")
    return parser.parse_args(argv)


def selected_ops(patterns: str):
    globs = [p.strip() for p in patterns.split(",") if p.strip()]
    return [op for op in harness.all_ops() if any(fnmatch.fnmatchcase(harness.op_id(op), g) for g in globs)]


def print_table(results, show: set[str], dtype: torch.dtype, seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    table = Table(title=f"OpInfo parity on '{harness.DEVICE}' vs cpu, {dtype}")
    for column in ("op", "status", "samples", "grads", "s", "detail"):
        table.add_column(column, overflow="fold", no_wrap=column != "detail")
    for r in results:
        if r.status in show:
            detail = r.detail + (f" ({r.where})" if r.where else "")
            style = STYLE[r.status]
            table.add_row(
                r.op, f"[{style}]{r.status}[/]", str(r.samples), str(r.grad_checked), f"{r.seconds:.2f}", detail
            )
    if table.row_count:
        console.print(table)
    for r in results:
        if r.notes:  # passed against float64 where CPU's own rounding was the difference
            console.print(f"[dim]{r.op}: {len(r.notes)} sample(s) judged against float64; {r.notes[0]}[/]")
    counts = Counter(r.status for r in results)
    summary = ", ".join(f"[{STYLE[s]}]{s}: {counts.get(s, 0)}[/]" for s in STATUSES)
    console.print(f"{len(results)} OpInfo entries, {dtype}: {summary}  ({seconds:.0f} s)")
    console.print(
        f"passing (values compared): {counts['pass']}; passing incl. shape-only: "
        f"{counts['pass'] + counts['shape-only']}"
    )


def print_known_failures(results, dtype: torch.dtype) -> None:
    """The failing ops as KNOWN_FAILURES entries: the exact error signature, and the reason
    already written for the op (empty for a new failure: write one before committing)."""
    table = harness.KNOWN_FAILURES if dtype == torch.float32 else harness.KNOWN_FAILURES_BY_DTYPE.get(dtype, {})
    for r in results:
        if not r.ok:
            reason = table[r.op].reason if r.op in table else ""
            print(f"    {r.op!r}: KnownFailure(\n        {r.signature!r},\n        {reason!r},\n    ),")


def main(argv=None) -> int:
    args = parse_args(argv)
    # OpInfo samples trigger many deprecation warnings of the ops themselves; they are noise here.
    warnings.filterwarnings("ignore")
    dtype = getattr(torch, args.dtype)
    if harness.DEVICE != "cpu":
        import tpu_backend  # noqa: F401 - registers the device

    start_index, _, stop_index = args.slice.partition(":")
    ops = selected_ops(args.ops)[slice(int(start_index or 0), int(stop_index) if stop_index else None)]
    show = set(STATUSES) if args.show == "all" else set(args.show.split(","))
    start = time.perf_counter()
    results = []
    for op in ops:
        result = harness.check_op(op, dtype, max_samples=args.max_samples, check_grad=not args.no_grad)
        results.append(result)
        if harness.DEVICE != "cpu":
            torch.tpu.empty_cache()  # one op's programs are rarely reused by the next: keep mappings bounded
        if args.progress:
            print(
                f"{result.op:50s} {result.status:10s} {result.seconds:6.2f}s {result.detail[:120]}",
                file=sys.stderr,
                flush=True,
            )
    print_table(results, show, dtype, time.perf_counter() - start)
    if args.emit_known_failures:
        print_known_failures(results, dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        "op": r.op,
                        "dtype": str(r.dtype),
                        "status": r.status,
                        "detail": r.detail,
                        "where": r.where,
                        "signature": r.signature,
                        "notes": r.notes,
                        "samples": r.samples,
                        "grad_checked": r.grad_checked,
                        "seconds": round(r.seconds, 3),
                    }
                    for r in results
                ],
                f,
                indent=1,
            )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
