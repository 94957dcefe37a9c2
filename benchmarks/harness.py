"""What every benchmark here shares: timed calls interleaved round by round, the clocks,
the machine's load, JSON output, the rich table, and how a benchmark starts a fresh
process of itself (`python -m benchmarks.<group>.<script>` with the repository importable).

On a machine shared with other processes absolute times drift with the load; figures
meant to be compared are taken in the same rounds (`interleaved`: every function called
once per round, the order reversed every other round, ABBA) and compared round by round
(`round_ratio`), and the load average goes into the report (`machine`)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent  # the repository

# wall: elapsed time; cpu: this thread's CPU time (LiteRT's kernels with 1 thread: robust to
# other processes' load); process: every thread of this process (XLA's workers included)
CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "cpu": time.thread_time,
    "process": time.process_time,
}


def interleaved(fns, rounds: int, clock=time.perf_counter, warmup: int = 3) -> list[list[float]]:
    """Milliseconds of each call of each function over `rounds` rounds, after `warmup`
    untimed calls of each; in a round every function is called once, the order reversed
    every other round (ABBA), so that load from other processes and the position in the
    round hit all alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    samples = [[] for _ in fns]
    for i in range(rounds):
        for k in range(len(fns)) if i % 2 == 0 else reversed(range(len(fns))):
            start = clock()
            fns[k]()
            samples[k].append(1e3 * (clock() - start))
    return samples


def median_ms(fns, rounds: int, clock=time.perf_counter, warmup: int = 3) -> list[float]:
    """Median milliseconds per call of each function, calls interleaved (`interleaved`)."""
    return [statistics.median(s) for s in interleaved(fns, rounds, clock, warmup)]


def round_ratio(ours: list[float], theirs: list[float]) -> float:
    """Median over rounds of ours / theirs within the round: load phases longer than a
    round cancel."""
    return statistics.median(a / b for a, b in zip(ours, theirs))


def machine() -> dict:
    """The machine and its load now (CPUs, the 1/5/15-minute load averages, UTC time) and
    the versions that ran (LiteRT's where this process loaded it)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    if "ai_edge_litert" in sys.modules:
        found["ai_edge_litert"] = getattr(sys.modules["ai_edge_litert"], "__version__", "?")
    return {
        **found,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path, payload, indent: int = 1) -> None:
    """`payload` as JSON to `path` ('-': stdout), written whole or not at all."""
    text = json.dumps(payload, indent=indent, default=str)
    if str(path) == "-":
        print(text)
        return
    from common.files import write_atomic

    write_atomic(path, [(text + "\n").encode()])


def console(width: int = 160):
    """A rich console; piped or redirected, `width` columns (rich would wrap at 80)."""
    from rich.console import Console

    found = Console()
    return found if found.is_terminal else Console(width=width)


def table(title: str, columns, rows=(), labels: int = 1):
    """A rich table: the first `labels` columns left-aligned and never wrapped (names), the
    others right-aligned (figures); `rows`: sequences of cells (more with `add_row`)."""
    from rich.table import Table

    out = Table(title=title)
    for i, column in enumerate(columns):
        out.add_column(column, justify="left" if i < labels else "right", no_wrap=i < labels)
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    return out


def module_command(module: str, *args: str) -> list[str]:
    """The command running benchmark `module` (a dotted name) with `args` in this Python."""
    return [sys.executable, "-m", module, *args]


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, plus `extra`."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}
