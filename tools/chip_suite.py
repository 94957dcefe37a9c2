"""The device suite on a TPU chip, in slices that each fit one 10-minute run.

On the TPU host, from the project root (docs/tpu.md, "The device suite on the chip"):

    source .tpu-wheels/s/env.sh
    python3 -m tools.chip_suite --slice 1/5 --out "$OUT"      # then 2/5 ... 5/5, one run each
    python3 -m tools.chip_suite --merge DIR [DIR ...]         # one markdown table of every slice

The suite is the chip-relevant tests (`SUITE` less `EXCLUDED`: the distributed tests and the
OpInfo sweep), with the default suite's options (no `slow` tests). `--slice K/N` collects it
all and runs the K-th of N contiguous parts of equal expected time: the seconds each test took
in an earlier run (`--timings DIR`, where that run's JSON files are), else a prior measured on
the chip (`PRIOR_SECONDS`). `... --slice K/N -- --collect-only` lists a slice's tests; other
pytest arguments go after `--` too. Each slice writes `slice-K-of-N.json` (passed,
failed, skipped and errors per file, seconds, the failures' first lines, each test's outcome
and seconds) after every test, so a slice stopped by the run's time limit still reports what
it ran; past `--budget` seconds it stops by itself and lists the tests it did not reach.
`--merge` adds slices up (from any folders) into one table, and names the slices missing.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import glob
import itertools
import json
import os
import sys
import time

import pytest

SUITE = ["tests/test_chip.py", "tests/kernels", "tests/tpu_backend", "tests/examples"]
EXCLUDED = ["tests/tpu_backend/distributed", "tests/tpu_backend/test_opinfo.py"]
OUTCOMES = ("passed", "failed", "skipped", "errors")
# Seconds a test takes on a v5e before a run has timed them (`--timings`), from docs/tpu.md:
# a 120-test slice of tests/tpu_backend took 190 s there, the 8 example tests 263 s.
PRIOR_SECONDS = {"tests/examples/": 33.0}
DEFAULT_SECONDS = 1.6


def prior_seconds(test: str) -> float:
    return next((s for prefix, s in PRIOR_SECONDS.items() if test.startswith(prefix)), DEFAULT_SECONDS)


def parse_slice(text: str) -> tuple[int, int]:
    """ "K/N" -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slice wants K/N (e.g. 2/6), got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--slice {text}: K must be between 1 and N")
    return k, n


def split(weights: list[float], parts: int) -> list[range]:
    """`parts` contiguous index ranges of `weights` (tests of one file stay together as far as
    the balance allows: module fixtures are set up once), each cut where the running total
    comes closest to its share of the whole."""
    prefix = list(itertools.accumulate(weights, initial=0.0))
    cuts = [0]
    for part in range(1, parts):
        share = prefix[-1] * part / parts
        at = bisect.bisect_left(prefix, share, lo=cuts[-1])
        if at > cuts[-1] and (at == len(prefix) or share - prefix[at - 1] <= prefix[at] - share):
            at -= 1  # stopping short of the share is closer than passing it
        cuts.append(min(at, len(weights)))
    cuts.append(len(weights))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def load_timings(folders: list[str]) -> dict[str, float]:
    """Seconds per test id recorded by earlier slices in `folders`."""
    found: dict[str, float] = {}
    for result in _slice_files(folders):
        found.update({test: seconds for test, (_, seconds) in result["tests"].items()})
    return found


def _slice_files(folders: list[str]) -> list[dict]:
    results = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "**", "slice-*-of-*.json"), recursive=True)):
            with open(path) as f:
                results.append(json.load(f))
    return results


class SliceRecorder:
    """A pytest plugin: keeps the slice's tests only, and records each one's outcome."""

    def __init__(self, k: int, n: int, out: str, timings: dict[str, float], budget: float):
        self.k, self.n, self.budget = k, n, budget
        self.path = os.path.join(out, f"slice-{k}-of-{n}.json")
        self.timings = timings
        self.started = time.monotonic()
        self.tests: dict[str, list] = {}  # test id -> [outcome, seconds]
        self.failures: dict[str, str] = {}
        self.selected: list[str] = []
        self.stopped_at: str | None = None

    @pytest.hookimpl(trylast=True)  # after `-m 'not slow'` and `-k` have deselected theirs
    def pytest_collection_modifyitems(self, session, config, items):
        weights = [self.timings.get(item.nodeid) or prior_seconds(item.nodeid) for item in items]
        part = split(weights, self.n)[self.k - 1]
        kept = items[part.start : part.stop]
        config.hook.pytest_deselected(items=items[: part.start] + items[part.stop :])
        items[:] = kept
        self.selected = [item.nodeid for item in kept]
        self.write()

    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid, ["passed", 0.0])
        entry[1] = round(entry[1] + report.duration, 3)
        if report.skipped and report.when != "teardown":
            entry[0] = "skipped"
        elif report.failed:
            entry[0] = "failed" if report.when == "call" else "errors"
            crash = getattr(report.longrepr, "reprcrash", None)  # "AssertionError: ..." and where
            lines = (crash.message if crash else report.longreprtext).strip().splitlines() or ["?"]
            self.failures.setdefault(report.nodeid, f"{report.when}: {lines[0]}"[:500])
        if report.when == "teardown":
            self.write()

    def pytest_runtest_protocol(self, item, nextitem):
        # stop after this test when the next one would end past the budget (pytest checks
        # `shouldstop` between tests)
        expected = self.timings.get(nextitem.nodeid) or prior_seconds(nextitem.nodeid) if nextitem else 0.0
        if self.stopped_at is None and time.monotonic() - self.started + expected > self.budget:
            self.stopped_at = item.nodeid
            item.session.shouldstop = f"chip_suite: the next test would end past the {self.budget:.0f} s budget"

    def summary(self) -> dict:
        files: dict[str, dict] = collections.defaultdict(lambda: dict.fromkeys(OUTCOMES, 0) | {"seconds": 0.0})
        for test, (outcome, seconds) in self.tests.items():
            row = files[test.split("::")[0]]
            row[outcome] += 1
            row["seconds"] = round(row["seconds"] + seconds, 3)
        return dict(
            slice=f"{self.k}/{self.n}",
            platform=_platform(),
            seconds=round(time.monotonic() - self.started, 1),
            selected=len(self.selected),
            not_run=[test for test in self.selected if test not in self.tests],
            files=dict(sorted(files.items())),
            failures=self.failures,
            tests=self.tests,
        )

    def write(self) -> None:
        partial = f"{self.path}.tmp"
        with open(partial, "w") as f:
            json.dump(self.summary(), f, indent=1)
        os.replace(partial, self.path)  # a run killed mid-write keeps the last whole file


def _platform() -> str:
    jax = sys.modules.get("jax")
    try:
        return f"{jax.default_backend()} ({jax.devices()[0].device_kind})" if jax else "not started"
    except Exception:  # noqa: BLE001 - JAX failed to start: the tests say why
        return "unknown"


def run_slice(
    k: int, n: int, out: str, timings: list[str], budget: float, pytest_args: list[str], paths: list[str] = SUITE
) -> int:
    os.makedirs(out, exist_ok=True)
    recorder = SliceRecorder(k, n, out, load_timings(timings), budget)
    ignores = [f"--ignore={path}" for path in EXCLUDED]
    junit = f"--junitxml={os.path.join(out, f'slice-{k}-of-{n}.xml')}"
    code = pytest.main(["-q", "-p", "no:randomly", junit, *ignores, *pytest_args, *paths], plugins=[recorder])
    recorder.write()
    summary = recorder.summary()
    print(f"chip_suite: slice {k}/{n}: {_totals(summary['files'])} in {summary['seconds']} s -> {recorder.path}")
    return int(code)


def _totals(files: dict) -> str:
    return ", ".join(f"{sum(row[o] for row in files.values())} {o}" for o in OUTCOMES)


def merge(folders: list[str]) -> str:
    """One markdown table (per file: passed, failed, skipped, errors, seconds) of every slice
    found in `folders`, then the failures, the tests not run and the slices missing."""
    results = _slice_files(folders)
    if not results:
        raise SystemExit(f"chip_suite: no slice-K-of-N.json under {', '.join(folders)}")
    files: dict[str, dict] = collections.defaultdict(lambda: dict.fromkeys(OUTCOMES, 0) | {"seconds": 0.0})
    failures, not_run, seen, parts, platforms = {}, [], set(), set(), set()
    for result in results:
        k, n = (int(x) for x in result["slice"].split("/"))
        seen.add(k)
        parts.add(n)
        platforms.add(result["platform"])
        for name, row in result["files"].items():
            for key in (*OUTCOMES, "seconds"):
                files[name][key] += row[key]
        failures.update(result["failures"])
        not_run += result["not_run"]
    lines = [
        f"Device suite (`python -m tools.chip_suite`), platform {', '.join(sorted(platforms))}:",
        "",
        "| file | passed | failed | skipped | errors | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in sorted(files.items()):
        lines.append(f"| {name} | " + " | ".join(str(row[o]) for o in OUTCOMES) + f" | {row['seconds']:.0f} |")
    total = {key: sum(row[key] for row in files.values()) for key in (*OUTCOMES, "seconds")}
    lines.append(
        "| **total** | " + " | ".join(f"**{total[o]}**" for o in OUTCOMES) + f" | **{total['seconds']:.0f}** |"
    )
    if len(parts) > 1:
        lines += ["", f"Slices of different splits were merged ({sorted(parts)} parts): counts may overlap."]
    missing = sorted(set(range(1, max(parts) + 1)) - seen)
    if missing:
        lines += ["", f"Slices missing: {', '.join(f'{k}/{max(parts)}' for k in missing)}."]
    if failures:
        lines += ["", "Failures:", ""] + [f"- `{test}`: {message}" for test, message in sorted(failures.items())]
    if not_run:
        lines += ["", f"Not run (past the slice's budget): {len(not_run)} tests, from `{not_run[0]}`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chip_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--slice", type=parse_slice, help="K/N: run the K-th of N parts of the suite")
    parser.add_argument("--out", default=os.environ.get("OUT", "chip-suite"), help="folder for the slice's files")
    parser.add_argument("--timings", nargs="*", default=[], help="folders of an earlier run: balance by its seconds")
    parser.add_argument(
        "--budget", type=float, default=540.0, help="start no test expected to end past this many seconds"
    )
    parser.add_argument("--merge", nargs="+", metavar="DIR", help="print one markdown table of the slices in DIRs")
    parser.add_argument("--paths", nargs="+", default=SUITE, help="the tests to slice (default: the device suite)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -x or -k")
    args = parser.parse_args(argv)
    if args.merge:
        sys.stdout.write(merge(args.merge))
        return 0
    if args.slice is None:
        parser.error("give --slice K/N (run one part) or --merge DIR... (sum the parts)")
    return run_slice(*args.slice, args.out, args.timings, args.budget, args.pytest_args, args.paths)


if __name__ == "__main__":
    sys.exit(main())
