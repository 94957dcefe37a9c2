"""benchmarks/device/trainer_bench.py runs its three rows at the toy size and reports the ratio."""

import json
import subprocess
import sys

import pytest

from tests.tpu_backend.distributed.test_process_group import ROOT, torchrun_env


@pytest.mark.slow  # three trainings, each compiling its programs: minutes on 2 cores
def test_small_run_reports_each_row_against_the_compiled_step(tmp_path):
    out = tmp_path / "trainer.json"
    argv = [sys.executable, "-m", "benchmarks.device.trainer_bench", "--small", "--steps", "6", "--warmup", "2"]
    done = subprocess.run([*argv, "--json", str(out)], cwd=ROOT, env=torchrun_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"compiled-step", "trainer", "trainer-compile"}
    assert rows["compiled-step"]["vs_compiled_step"] == 1.0
    for figures in rows.values():
        assert figures["tokens_per_s"] > 0 and figures["first_step_s"] > 0 and figures["vs_compiled_step"] > 0
