"""`benchmarks/backend_bench.py` and its JAX ceiling (`benchmarks/jax_mingpt.py`), at the
small transformer: the hand-written JAX step computes PyTorch's step, lowers for a TPU,
and the benchmark reports CPU time beside wall time."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks import backend_bench, jax_mingpt


def test_jax_step_matches_pytorch_and_lowers_for_tpu():
    # Three steps: the losses of steps 2 and 3 check the custom_vjp gradients and AdamW.
    for jax_loss, torch_loss in jax_mingpt.check_against_torch("transformer", 3):
        assert jax_loss == pytest.approx(torch_loss, rel=1e-5)
    trainer = jax_mingpt.JaxTrainer("transformer")
    exported = jax.export.export(trainer._step, platforms=["tpu"])(
        trainer.params, trainer.state, trainer.tokens, trainer.targets
    )
    assert "stablehlo.dot_general" in exported.mlir_module()


def test_bench_reports_cpu_time_beside_wall_time(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", "transformer", "--modes", "cpu-eager,jax", "--steps", "2", "--warmup", "1", "--skip-ops"]
    assert backend_bench.main([*argv, "--json", str(out)]) == 0
    steps = {s["mode"]: s for s in json.loads(out.read_text())["steps"]}
    for step in steps.values():
        assert step["cpu_median_s"] > 0 and step["host_cpu_median_s"] > 0 and len(step["cpu_steps"]) == 2
    assert steps["jax"]["final_loss"] == pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-5)
    results = [backend_bench.StepResult(**s) for s in steps.values()]
    assert backend_bench._ratio(results, "cpu-eager", "jax", "cpu") == pytest.approx(
        steps["cpu-eager"]["cpu_median_s"] / steps["jax"]["cpu_median_s"]
    )


def test_scan_layers_flag_trains_the_llama_case_like_cpu(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", "llama", "--remat", "--scan-layers", "--modes", "cpu-eager,tpu-compile"]
    assert backend_bench.main([*argv, "--steps", "1", "--warmup", "1", "--skip-ops", "--json", str(out)]) == 0
    steps = {s["mode"]: s for s in json.loads(out.read_text())["steps"]}
    assert steps["tpu-compile"]["final_loss"] == pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-5)
