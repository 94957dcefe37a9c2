"""Run many hostile files through `load_worker` in subprocesses, surviving crashes.

`run_files(paths)` starts one worker for the whole list; when it dies (a segfault in the
interpreter, an abort), the file it was on is recorded as `crash` and a new worker goes
on from the next file. One process per file would cost a torch import (~2 s) per case.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_files(paths: list[str], timeout: float = 600) -> list[tuple[str, str]]:
    """(outcome, detail) per path, in order."""
    results: list[tuple[str, str] | None] = [None] * len(paths)
    start = 0
    env = dict(os.environ, PYTHONPATH=ROOT, LITERT_TORCH_PROGRESS="0")
    while start < len(paths):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.reliability.load_worker", *paths[start:]],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=timeout,
        )
        current = None
        for line in proc.stdout.splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "BEGIN":
                current = start + int(parts[1])
            elif parts[0] == "END":
                results[start + int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
                current = None
        if current is None:  # finished (or died between files: should not happen)
            if proc.returncode != 0 and None in results[start:]:
                raise RuntimeError(f"load worker failed outside a file: {proc.stderr[-2000:]}")
            break
        results[current] = ("crash", f"exit status {proc.returncode}: {proc.stderr.strip()[-300:]}")
        start = current + 1
    return [r if r is not None else ("crash", "not reached") for r in results]


def summarize(kinds: list[str], results: list[tuple[str, str]]) -> dict[str, collections.Counter]:
    """mutation kind -> Counter of outcomes."""
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for kind, (outcome, _) in zip(kinds, results):
        table[kind][outcome] += 1
    return dict(table)
