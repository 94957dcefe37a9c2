"""benchmarks/device/trainer_bench.py runs its rows at the toy size, each in its own process,
and reports them against the hand-written compiled loop."""

import json
import subprocess
import sys

import pytest

from tests.tpu_backend.distributed.test_process_group import ROOT, torchrun_env


@pytest.mark.slow  # a training per row, each compiling its programs in a fresh process: minutes on 2 cores
def test_small_run_reports_each_row_against_the_compiled_loop(tmp_path):
    out = tmp_path / "trainer.json"
    argv = [sys.executable, "-m", "benchmarks.device.trainer_bench", "--small", "--steps", "8", "--warmup", "4"]
    argv += ["--rows", "compiled-loop,trainer,trainer-eager"]
    done = subprocess.run([*argv, "--json", str(out)], cwd=ROOT, env=torchrun_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"compiled-loop", "trainer", "trainer-eager"}
    assert rows["compiled-loop"]["vs_compiled-loop"] == 1.0
    for figures in rows.values():
        assert figures["tokens_per_s"] > 0 and figures["first_step_s"] > 0 and figures["compiles_after_step_2"] == 0
    # what the rows are: the default Trainer step compiled (4 programs, a few per-op ones), eager not
    assert rows["trainer"]["compiled_programs_per_step"] == 4 and rows["trainer"]["per_op_programs_per_step"] <= 8
    assert rows["trainer-eager"]["compiled_programs_per_step"] == 0
