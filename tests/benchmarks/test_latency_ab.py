"""`benchmarks/converter/latency_ab.py`: ours/anchor latency with interpreter pairs created in both
orders, and anchor files that do not belong to the zoo model are refused, not timed."""

from __future__ import annotations

import json

import litert_torch
from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter import latency_ab


def _write_anchor(directory, name, seed):
    """Stand-in for the anchor's file: our conversion of the zoo model built with `seed`."""
    model, args = load_zoo().build(name, seed=seed)
    (directory / f"{name}.anchor.tflite").write_bytes(litert_torch.convert(model, args).model_content())


def test_rows_ratio_and_refusals(tmp_path, monkeypatch, capsys):
    _write_anchor(tmp_path, "mlp", seed=0)  # the same weights: a valid anchor file
    _write_anchor(tmp_path, "lenet5", seed=1)  # other weights: stale
    created = []
    monkeypatch.setattr(
        latency_ab,
        "LoadedModel",
        lambda content, _real=latency_ab.LoadedModel: created.append(content) or _real(content),
    )
    out = tmp_path / "rows.jsonl"
    latency_ab.main(["--anchor-dir", str(tmp_path), "--models", "mlp,lenet5,resnet18", "--blocks", "4",
                     "--runs", "3", "--jsonl", str(out)])  # fmt: skip
    rows = {r["model"]: r for r in map(json.loads, out.read_text().splitlines())}
    mlp = rows["mlp"]
    assert mlp["ours_err"] <= 1e-4 and mlp["anchor_err"] <= 1e-4
    assert len(mlp["block_ratios"]) == 4 and mlp["ratio"] > 0 and mlp["method"] == "min/4x3"
    assert "stale" in rows["lenet5"]["error"] and "ratio" not in rows["lenet5"]
    assert rows["resnet18"]["error"] == "no anchor file"
    # The four timed pairs of mlp alternate which file's interpreter is created first.
    ours, anchor, pairs = created[0], created[1], created[2:10]  # the two error checks come first
    assert all(content is ours or content is anchor for content in pairs)
    firsts = ["anchor" if pairs[i] is anchor else "ours" for i in range(0, 8, 2)]
    assert firsts == ["ours", "anchor", "ours", "anchor"]
    # Rerunning with the same file skips the models already there.
    latency_ab.main(["--anchor-dir", str(tmp_path), "--models", "mlp", "--jsonl", str(out)])
    assert len(out.read_text().splitlines()) == 3
    latency_ab.main(["--jsonl", str(out), "--summary"])
    assert "1 measured of 3" in capsys.readouterr().out
