"""`benchmarks/families_vs_anchor.py` without the anchor's environment (not in CI): our
side of a family runs, reports its error against the framework and writes JSON; timed
calls alternate ABBA."""

from __future__ import annotations

import json

from benchmarks import families_vs_anchor


def test_our_side_of_a_family(tmp_path):
    out = tmp_path / "families.json"
    assert families_vs_anchor.main(["--families", "sd_text_encoder", "--runs", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["family"] == "sd_text_encoder" and row["anchor"] is None
    assert row["ours"]["rel_err"] <= 1e-4 and row["ours"]["bytes"] > 0 and row["ours"]["latency_ms"] > 0


def test_calls_alternate_abba():
    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    samples = families_vs_anchor.timed(fns, runs=4, clock=lambda: 0.0, warmup=0)
    assert "".join(order) == "abbaabba" and [len(s) for s in samples] == [4, 4]
    assert families_vs_anchor.round_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0]) == 3.0
