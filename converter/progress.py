"""Conversion progress: one line per stage (export, decompose, lower, optimize, write).

Quiet by default when stderr is not a terminal or under pytest. `progress=True/False`
on `litert_torch.convert` decides explicitly; otherwise the environment variable
`LITERT_TORCH_PROGRESS=1` (or `0`) does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time


def progress_enabled(requested: bool | None = None) -> bool:
    if requested is not None:
        return bool(requested)
    env = os.environ.get("LITERT_TORCH_PROGRESS")
    if env is not None:
        return env.strip().lower() not in ("", "0", "false", "no", "off")
    if "PYTEST_CURRENT_TEST" in os.environ:
        return False
    return sys.stderr.isatty()


class Progress:
    """Reports each stage's name and duration; a no-op when disabled.

    `timings` keeps the wall seconds of every stage either way, `cpu_timings` the
    process CPU seconds (benchmarks read them; CPU time is what a loaded machine does
    not distort).
    """

    def __init__(self, enabled: bool | None = None):
        self.enabled = progress_enabled(enabled)
        self.timings: dict[str, float] = {}
        self.cpu_timings: dict[str, float] = {}
        self._console = None
        self._status = None  # the running stage's status line (rich), updated by track()
        if self.enabled:
            from rich.console import Console

            self._console = Console(stderr=True)

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = ""):
        start, cpu_start = time.perf_counter(), time.process_time()
        status = self._console.status(f"{name} {detail}".strip()) if self.enabled else contextlib.nullcontext()
        ok = False
        try:
            with status:
                self._status = status if self.enabled else None
                yield
            ok = True
        finally:
            self._status = None
            seconds = time.perf_counter() - start
            self.timings[name] = self.timings.get(name, 0.0) + seconds
            self.cpu_timings[name] = self.cpu_timings.get(name, 0.0) + time.process_time() - cpu_start
            if self.enabled:
                mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
                self._console.print(f"{mark} {name:<10} {seconds:7.2f} s  {detail}".rstrip())

    def track(self, iterable, description: str):
        """Iterate `iterable`, showing `description` and the items done (of len() when
        known) on the running stage's status line."""
        try:
            total = len(iterable)
        except TypeError:  # a generator
            total = None
        status = self._status
        for done, item in enumerate(iterable, 1):
            yield item
            if status is not None:
                status.update(f"{description}: {done}" + (f"/{total}" if total else ""))

    def note(self, message: str) -> None:
        if self.enabled:
            self._console.print(f"  {message}")
