"""`benchmarks.anchors.torch_tpu_vs_ours`: our side runs its rows here (small models); the
TorchTPU side says why it cannot run without its staged site, in the same table."""

from __future__ import annotations

from benchmarks.anchors import torch_tpu_vs_ours as bench


def test_our_side_runs_and_the_table_names_the_missing_side(monkeypatch, capsys):
    monkeypatch.delenv("TORCH_TPU_SITE", raising=False)
    results = bench.main(["--tiny", "--steps", "1", "--warmup", "1", "--rows", "mingpt-strict,errors"])
    ours = results["mingpt-strict"]["ours"]
    assert ours["first_step_s"] > 0 and ours["step_ms"] > 0 and len(ours["losses"]) == 2
    assert results["mingpt-strict"]["torch_tpu"].startswith("not staged: set TORCH_TPU_SITE")
    errors = results["errors"]["ours"]
    # our device raises where CPU raises, for every bad input (no "no error")
    assert all(not errors[key].startswith("no error") for key in errors), errors
    table = capsys.readouterr().out
    assert "| mingpt-strict | " in table and "| cross_entropy target 5 of 3 classes | IndexError" in table


def test_a_side_that_cannot_see_torch_tpu_is_kept_from_it(monkeypatch, tmp_path):
    (tmp_path / "torch_tpu").mkdir()
    monkeypatch.setenv("TORCH_TPU_SITE", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:/elsewhere")
    assert bench.side_env("ours")["PYTHONPATH"] == "/elsewhere"  # TorchTPU would load itself into our torch
    assert bench.side_env("torch_tpu")["PYTHONPATH"].split(":")[0] == str(tmp_path)
