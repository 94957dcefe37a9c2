"""`benchmarks/generative/prefill_bound.py` end to end on a tiny Llama, without the anchor (our "none"
prefill stands in for it): the table's rows and figures, and "last" logits equal PyTorch's."""

from __future__ import annotations

import json

import pytest

from benchmarks.generative import prefill_bound

TINY = dict(vocab=256, dim=64, layers=2, heads=4, kv_heads=2, hidden=128)


@pytest.mark.slow  # the default suite's time budget: a benchmark's table
def test_table_without_anchor(tmp_path, monkeypatch, capsys):
    model = "hf_llama"  # (Qwen3 runs the same code; one model keeps the default suite fast)
    for key, value in TINY.items():
        monkeypatch.setitem(prefill_bound.SIZE, key, value)
    out = tmp_path / "bound.json"
    prefill_bound.main(["--models", model, "--prefill-len", "8", "--cache-len", "32", "--blocks", "2",
                        "--rounds", "3", "--repeats", "2", "--json", str(out)])  # fmt: skip
    (row,) = json.loads(out.read_text())["results"]
    assert row["model"] == model and row["last_rel_err"] <= 1e-5
    figures = ["anchor ms", *prefill_bound.PROGRAMS[1:], *prefill_bound.DERIVED]
    assert set(figures) <= set(row) and set(row["range"]) == set(figures)
    assert all(row[k] > 0 for k in figures if k != "last - none")
    for rep in row["repeats"]:
        assert rep["anchor"] == 1.0
        assert rep["bound"] == pytest.approx(rep["none"] + rep["head row"] + rep["layer row"])
        assert rep["last - none"] == pytest.approx(rep["last"] - rep["none"])
    printed = capsys.readouterr().out
    assert 'our "none" prefill' in printed and "bound" in printed and model in printed
