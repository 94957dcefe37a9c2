"""`benchmarks/converter/quant_bench.py`'s options for measuring on a loaded machine and sweeping:
`--cpu-time` (per-invoke CPU time of the invoking thread), `--methods percentile=P`,
`--models cnns`, `--json-dir` (one JSON per model, resumable) and `--isolate` (one process
per model), run as a user would."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import litert_torch
from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter import quant_bench
from benchmarks.converter.litert_measure import LoadedModel


def _model(width: int) -> LoadedModel:
    layer = torch.nn.Linear(width, width).eval()
    return LoadedModel(litert_torch.convert(layer, (torch.randn(1, width),), progress=False).model_content())


def test_latencies_time_each_invoke_with_the_given_clock():
    ticks = itertools.count()
    small, large = _model(8), _model(512)
    sample = (torch.randn(1, 8),)
    [seconds] = quant_bench._latencies([small], sample, runs=10, clock=lambda: next(ticks))
    assert seconds == 1  # one tick between the start and the end of each timed invoke
    # with the thread's CPU time, a 4096x larger matmul measures larger, however loaded the machine
    small_s, large_s = (
        quant_bench._latencies([m], (torch.randn(1, w),), runs=20, clock=time.thread_time)[0]
        for m, w in ((small, 8), (large, 512))
    )
    assert 0 < small_s < large_s


def test_methods_entry_sets_the_percentile():
    assert quant_bench._calibration("mse") == {"calibration": "mse"}
    assert quant_bench._calibration("percentile=99.0") == {"calibration": "percentile", "percentile": 99.0}


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks.converter.quant_bench"
TINY = ["--schemes", "full_int8", "--methods", "mse", "--samples", "3", "--calibration", "2", "--runs", "1"]


def test_cnn_classifiers_are_the_cnn_family_and_the_audio_video_classifiers():
    zoo = load_zoo()
    names = quant_bench.cnn_classifiers(zoo)
    assert [n for n in names if zoo.ZOO[n].family == "cnn"] == [e.name for e in zoo.ZOO.values() if e.family == "cnn"]
    # 2-D logits: kept; unet3d_small returns a volume, not logits
    assert [n for n in names if zoo.ZOO[n].family != "cnn"] == ["audio_m5", "tcn", "c3d_small", "r2plus1d_small"]


def _bench(tmp_path, *flags):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", SCRIPT, "--json-dir", str(tmp_path), *TINY, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.slow  # three processes, ~90 s on the shared 2 cores
def test_json_dir_resumes_and_isolate_runs_each_model_alone(tmp_path):
    done = _bench(tmp_path, "--models", "lenet5", "--isolate")
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads((tmp_path / "lenet5.json").read_text())
    assert first["complete"] and [r["scheme"] for r in first["rows"]] == ["full_int8:mse"]
    assert 0 <= first["rows"][0]["top1"] <= 1 and first["rows"][0]["samples"] == 3
    assert "lenet5" in done.stdout  # the parent's table holds the child's row
    mtime = (tmp_path / "lenet5.json").stat().st_mtime_ns

    # a second run skips the complete model and runs the other
    done = _bench(tmp_path, "--models", "lenet5,tcn", "--keep-float", "head")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped: lenet5" in done.stderr
    assert (tmp_path / "lenet5.json").stat().st_mtime_ns == mtime
    second = json.loads((tmp_path / "tcn.json").read_text())
    (row,) = second["rows"]
    assert second["complete"] and row["model"] == "tcn" and row["scheme"] == "full_int8:mse+float(head)"
    # the head kept float: the output is no longer dequantized from an int8 grid
    assert "top1" in row and "grid_ceiling" not in row


def test_output_grid_ceiling_counts_the_ties_the_int8_output_grid_makes():
    import litert_torch
    from benchmarks.converter.litert_measure import LoadedModel
    from litert_torch import quantize

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    samples = [(torch.randn(1, 4),) for _ in range(8)]
    edge = litert_torch.convert(model, samples[0], quant_config=quantize.full_int8(), calibration_data=samples)
    loaded = LoadedModel(edge.model_content())
    step = loaded.interpreter._get_tensor_details(
        [op for op in loaded.interpreter._get_ops_details() if op["op_name"] == "DEQUANTIZE"][-1]["inputs"][0], 0
    )["quantization"][0]
    # 3 inputs: a margin of 3 steps survives; 0.1 step with the winner second rounds to a
    # tie that argmax gives to the lower index; 0.1 step with the winner first survives
    references = [np.array([[0.0, 3 * step, 0.0]]), np.array([[0.0, 0.1 * step, 0.0]]), np.array([[0.1 * step, 0, 0]])]
    ceiling = quant_bench.output_grid_ceiling(loaded, references)
    assert ceiling["grid_step"] == pytest.approx(step)
    assert ceiling["grid_ceiling"] == pytest.approx(2 / 3)
    assert ceiling["margin_below_step"] == pytest.approx(2 / 3)
