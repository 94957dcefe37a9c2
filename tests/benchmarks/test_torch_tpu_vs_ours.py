"""`benchmarks.anchors.torch_tpu_vs_ours`: our side runs its rows here (small models); the
TorchTPU side says why it cannot run without its staged site, in the same table."""

from __future__ import annotations

from benchmarks.anchors import torch_tpu_vs_ours as bench


def test_a_training_row_on_our_side():
    """In this process (the parent runs it in a child of its own, as below for the errors)."""
    result = bench.train_row("ours", bench.ROWS["mingpt-strict"], steps=1, warmup=1, tiny=True)
    assert result["first_step_s"] > 0 and result["step_ms"] > 0 and len(result["losses"]) == 2
    line = bench.train_table({"mingpt-strict": {"ours": result, "torch_tpu": "not staged: ..."}})[-1]
    assert line.startswith("| mingpt-strict | ") and "| - | - |" in line


def test_the_errors_row_runs_in_a_child_and_names_the_missing_side(monkeypatch, capsys):
    monkeypatch.delenv("TORCH_TPU_SITE", raising=False)
    results = bench.main(["--rows", "errors"])
    errors = results["errors"]["ours"]
    # our device raises where CPU raises, for every bad input (no "no error")
    assert errors and all(not message.startswith("no error") for message in errors.values()), errors
    assert results["errors"]["torch_tpu"].startswith("not staged: set TORCH_TPU_SITE")
    assert "| cross_entropy target 5 of 3 classes | IndexError" in capsys.readouterr().out


def test_a_side_that_cannot_see_torch_tpu_is_kept_from_it(monkeypatch, tmp_path):
    (tmp_path / "torch_tpu").mkdir()
    monkeypatch.setenv("TORCH_TPU_SITE", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:/elsewhere")
    assert bench.side_env("ours")["PYTHONPATH"] == "/elsewhere"  # TorchTPU would load itself into our torch
    assert bench.side_env("torch_tpu")["PYTHONPATH"].split(":")[0] == str(tmp_path)
