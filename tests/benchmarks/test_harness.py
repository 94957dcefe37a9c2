"""`benchmarks/harness.py`, what every benchmark times and reports with: calls interleaved
ABBA after their warm-up, ratios taken round by round, JSON to a file or stdout."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import harness


def test_calls_alternate_abba_after_the_warmup():
    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    samples = harness.interleaved(fns, rounds=4, clock=lambda: 0.0, warmup=1)
    assert "".join(order) == "ab" + "abbaabba" and [len(s) for s in samples] == [4, 4]


def test_milliseconds_by_the_given_clock_and_ratios_by_round():
    ticks = iter(range(100))
    clock = lambda: next(ticks)  # noqa: E731  (every reading one second later)
    assert harness.median_ms([lambda: None], rounds=3, clock=clock, warmup=0) == [1000.0]
    assert harness.round_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0]) == 3.0


def test_json_to_a_file_or_stdout(tmp_path, capsys):
    payload = {"path": Path("/x"), "load": harness.machine()["load_average"]}
    harness.write_json(tmp_path / "out.json", payload)
    assert json.loads((tmp_path / "out.json").read_text()) == {"path": "/x", "load": list(payload["load"])}
    harness.write_json("-", {"a": 1})
    assert json.loads(capsys.readouterr().out) == {"a": 1}
