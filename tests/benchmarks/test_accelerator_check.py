"""`benchmarks/kernels/accelerator_check.py`: the one-command GPU check, run end to end with
`--smoke` (tiny shapes on CPU), as a user would before taking it to a GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.kernels import accelerator_check as check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks.kernels.accelerator_check"


def _run(tmp_path, *flags):
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", SCRIPT, "--json", str(out), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return done, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_smoke_runs_every_section(tmp_path):
    done, report = _run(tmp_path, "--smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sections = report["sections"]
    assert {n: s["status"] for n, s in sections.items()} == dict.fromkeys(
        ("environment", "kernel_tests", "attention", "training"), "ok"
    )

    tests = sections["kernel_tests"]
    assert tests["counts"].get("passed", 0) >= 1 and not tests["counts"].get("failed")
    assert tests["implementation"] == "interpret"  # no compiled kernels on CPU, and it says so
    assert (
        "Mosaic for TPU only" in tests["note"] and "flash_attention_triton compiles only on a CUDA GPU" in tests["note"]
    )

    rows = sections["attention"]["rows"]
    assert [r["seq"] for r in rows] == list(check.SMOKE_SETTINGS.attention_seqs)
    for row in rows:
        for impl in ("xla_reference", "torch_sdpa"):
            assert row["fwd_ms"][impl] > 0 and row["fwd_bwd_ms"][impl] > 0
        assert row["max_rel_diff_vs_xla"]["torch_sdpa"] < 1e-5  # float32: both compute the same attention

    training = sections["training"]
    modes = training["modes"]
    assert set(modes) == {"cpu-eager", "cpu-dynamo", "tpu-strict", "tpu-fused", "tpu-compile"}
    for name, mode in modes.items():
        assert mode["step_ms"] > 0 and mode["tokens_per_s"] > 0, (name, mode)
    assert training["first_losses_agree"], {n: m["losses"] for n, m in modes.items()}
    assert "(c) Llama training step" in done.stdout and "tpu-strict" in done.stdout


def test_budget_stops_the_run_and_keeps_the_json(tmp_path):
    done, report = _run(tmp_path, "--smoke", "--budget", "0")
    assert done.returncode == 3
    assert report["stopped_by_budget"] is True


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path):
    report = check.Report(str(tmp_path / "r.json"))
    budget = check.Budget(1e6)
    with report.section("broken", budget, 1.0):
        raise ValueError("boom")
    with report.section("fine", budget, 1.0) as entry:
        entry["value"] = 1
    written = json.loads((tmp_path / "r.json").read_text())["sections"]
    assert written["broken"]["status"] == "failed" and written["broken"]["error"] == "ValueError: boom"
    assert written["fine"]["status"] == "ok" and written["fine"]["value"] == 1


@pytest.mark.parametrize("config", [check.LlamaConfig(), check.SMOKE_SETTINGS.llama])
def test_parameter_count_behind_the_mfu_matches_the_model(config):
    with torch.device("meta"):
        model = check.Llama(config)
    assert check.parameter_count(config) == sum(p.numel() for p in model.parameters())
    if config == check.LlamaConfig():
        assert check.parameter_count(config) >= 100e6


@pytest.mark.slow
def test_profile_traces_one_step_per_mode(tmp_path):
    done, report = _run(tmp_path, "--smoke", "--sections", "training", "--profile", str(tmp_path / "traces"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modes = report["sections"]["training"]["modes"]
    for name, mode in modes.items():
        files = mode["profile"]
        assert "error" not in files and Path(files["host"]).exists(), (name, files)
        if name.startswith("tpu-"):
            assert files["combined"] and Path(files["combined"]).exists()
            host = Path(files["host"]).read_text()
            # eager modes show the ATen ops; the compiled mode its forward/backward programs
            expected = "tpu::torch_compile_" if name == "tpu-compile" else '"aten::mm"'
            assert expected in host, (name, expected)
