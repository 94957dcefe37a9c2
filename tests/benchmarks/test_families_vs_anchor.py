"""`benchmarks/anchors/families_vs_anchor.py` without the anchor's environment (not in CI): our
side of a family runs, reports its error against the framework and writes JSON."""

from __future__ import annotations

import json

from benchmarks.anchors import families_vs_anchor


def test_our_side_of_a_family(tmp_path):
    out = tmp_path / "families.json"
    assert families_vs_anchor.main(["--families", "sd_text_encoder", "--runs", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["family"] == "sd_text_encoder" and row["anchor"] is None
    assert row["ours"]["rel_err"] <= 1e-4 and row["ours"]["bytes"] > 0 and row["ours"]["latency_ms"] > 0


def test_our_side_of_qwen_vl_decodes_after_an_image(tmp_path):
    out = tmp_path / "qwen_vl.json"
    assert families_vs_anchor.main(["--families", "qwen_vl", "--runs", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["family"] == "qwen_vl" and row["ours"]["rel_err"] <= 1e-4
