"""Benchmarks: host JSON schema, alternating comparison, the benchmark_model log parser on
a recorded log, device scripts, the plot and the CLI."""

from __future__ import annotations

import json
import os

import pytest

from converter.writer import write_flatbuffer
from runtimes import bench
from tests.runtimes.int8_models import int8_conv, int8_mlp

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
STATS = {"count", "avg", "p50", "p90", "min", "max", "std"}


@pytest.fixture
def models(tmp_path):
    a, b = tmp_path / "mlp.tflite", tmp_path / "conv.tflite"
    a.write_bytes(write_flatbuffer(int8_mlp(float_io=True)))
    b.write_bytes(write_flatbuffer(int8_conv()))
    return str(a), str(b)


def test_host_bench_reports_every_field_in_microseconds(models):
    result = bench.bench_host(models[0], runs=12, warmup=2)
    assert result["schema"] == bench.SCHEMA and result["target"] == "host"
    assert result["model_bytes"] == os.path.getsize(models[0]) and result["signature"] == "serving_default"
    s = result["inference_us"]
    assert set(s) == STATS and s["count"] == 12
    assert 0 < s["min"] <= s["p50"] <= s["p90"] <= s["max"] and s["min"] <= s["avg"] <= s["max"]
    assert result["init_us"] > 0 and result["first_us"] > 0 and result["warmup_avg_us"] > 0
    assert result["runtime"] == {"engine": "ai-edge-litert", "threads": 1, "delegate": "xnnpack"}
    assert result["memory"]["peak_rss_mb"] >= result["memory"]["peak_rss_before_mb"] > 0
    json.dumps(result)


def test_host_op_profile_times_every_op_alone(models):
    result = bench.bench_host(models[1], runs=3, warmup=1, per_op=True)
    rows = result["op_profile"]
    assert [r["op"] for r in rows] == ["CONV_2D", "MAX_POOL_2D", "RESHAPE"]
    assert all(r["median_us"] > 0 for r in rows)
    assert sum(r["percent"] for r in rows) == pytest.approx(100.0)
    by_type = bench.op_profile_by_type(bench.op_profile(models[0], runs=3))
    assert {e["op"]: e["count"] for e in by_type} == {"QUANTIZE": 1, "FULLY_CONNECTED": 2, "DEQUANTIZE": 1}


def test_compare_alternates_and_reports_b_over_a(models):
    result = bench.compare(*models, runs=10, warmup=1)
    a, b = result["a"]["inference_us"], result["b"]["inference_us"]
    assert result["alternating"] and a["count"] == b["count"] == 10
    assert result["ratio_b_over_a"]["p50"] == pytest.approx(b["p50"] / a["p50"])


def test_parser_reads_a_recorded_android_gpu_log():
    with open(os.path.join(FIXTURES, "benchmark_model_android_gpu.log")) as f:
        result = bench.parse_benchmark_model(f.read())
    assert result["target"] == "android" and result["model"] == "/data/local/tmp/mobilenet_v2.tflite"
    assert result["runtime"] == {
        "engine": "benchmark_model",
        "threads": 4,
        "delegate": "gpu",
        "delegated_nodes": "65/66 (TfLiteGpuDelegateV2)",
    }
    assert (result["init_us"], result["first_us"], result["warmup_avg_us"]) == (1384520.0, 41230.0, 8771.35)
    s = result["inference_us"]
    assert (s["count"], s["avg"], s["p50"], s["p95"]) == (146, 6852.08, 6790.0, 7415.0)
    assert (s["min"], s["max"], s["std"]) == (6650.0, 9210.0, 301.0)
    assert result["memory"] == {"init_delta_mb": 88.4531, "overall_delta_mb": 91.2305, "peak_rss_mb": 97.0234}
    assert [r["op"] for r in result["op_profile"]] == ["TfLiteGpuDelegateV2", "MEAN", "FULLY_CONNECTED"]
    assert result["op_profile"][0]["percent"] == 95.731


def test_parser_refuses_a_log_without_timings():
    with pytest.raises(ValueError, match="not benchmark_model output"):
        bench.parse_benchmark_model("ERROR: Could not open '/data/local/tmp/x.tflite'.\n")


def test_android_and_ios_scripts_use_the_same_options():
    script = bench.android_script(
        "out/model.tflite", serial="emulator-5554", runs=30, warmup=3, threads=2, delegate="gpu", op_profile=True
    )
    assert "adb -s emulator-5554 push out/model.tflite /data/local/tmp/model.tflite" in script
    assert (
        "/data/local/tmp/benchmark_model --graph=/data/local/tmp/model.tflite --num_threads=2 --num_runs=30 "
        "--warmup_runs=3 --report_peak_memory_footprint=true --use_gpu=true --enable_op_profiling=true"
    ) in script
    params = bench.ios_params("out/model.tflite", runs=30, warmup=3, threads=2, delegate="xnnpack")
    assert params["args"][0] == "--graph=model.tflite" and "--use_xnnpack=true" in params["args"]
    ios = bench.ios_script("out/model.tflite", runs=30, warmup=3, threads=2, delegate="xnnpack")
    assert json.dumps(params, indent=2) in ios and "benchmark_data/benchmark_params.json" in ios
    with pytest.raises(ValueError, match="delegate must be"):
        bench.benchmark_args(delegate="npu")


def test_plot_writes_a_png(tmp_path, models):
    results = [bench.bench_host(m, runs=5, warmup=1) for m in models]
    with open(os.path.join(FIXTURES, "benchmark_model_android_gpu.log")) as f:
        results.append(bench.parse_benchmark_model(f.read()))
    path = bench.plot(results, str(tmp_path / "times.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_bench_json_compare_and_android_script(tmp_path, models, capsys):
    from litert_torch.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", models[0], "--runs", "5", "--warmup", "1", "--json", str(out), "--op-profile"]) == 0
    saved = json.loads(out.read_text())
    assert saved["inference_us"]["count"] == 5 and len(saved["op_profile"]) == 4
    assert "Per-op profile: mlp.tflite (host)" in capsys.readouterr().out
    compared = tmp_path / "compare.json"
    assert (
        main(["bench", *models[:1], "--compare", models[1], "--runs", "4", "--warmup", "0", "--json", str(compared)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "B / A (conv.tflite / mlp.tflite)" in printed
    peaks = [json.loads(compared.read_text())[side]["memory"]["peak_rss_mb"] for side in "ab"]
    assert all(peak > 10 for peak in peaks), peaks  # a Python process with the interpreter: tens of MB
    table_peaks = [float(line.split("│")[11]) for line in printed.splitlines() if line.startswith("│ ")]
    assert table_peaks == [round(peak, 1) for peak in peaks], (table_peaks, peaks)
    script = tmp_path / "run.sh"
    assert main(["bench", models[0], "--target", "android", "--script", str(script)]) == 0
    assert os.access(script, os.X_OK) and "benchmark_model --graph=/data/local/tmp/mlp.tflite" in script.read_text()
    parsed = tmp_path / "device.json"
    assert (
        main(["bench", "--parse", os.path.join(FIXTURES, "benchmark_model_android_gpu.log"), "--json", str(parsed)])
        == 0
    )
    assert json.loads(parsed.read_text())["runtime"]["delegate"] == "gpu"


def test_op_profile_of_an_int4_blockwise_model(tmp_path):
    """Blockwise (int4) weights name their scales tensor by index: the one-op models must
    carry it along (they once pointed past their own tensors and LiteRT segfaulted). Run
    in a child process, so a crash fails this test instead of the whole session."""
    import subprocess
    import sys

    import torch

    import litert_torch
    from litert_torch.quantize import weight_only_int4

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    path, out = tmp_path / "int4.tflite", tmp_path / "bench.json"
    litert_torch.convert(model, (torch.randn(2, 64),), quant_config=weight_only_int4()).export(str(path))
    command = ["from litert_torch.cli import main", f"main(['bench', {str(path)!r}, '--runs', '3', '--warmup', '1', "
               f"'--op-profile', '--json', {str(out)!r}])"]  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", "\n".join(command)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["op_profile"]
    assert [r["op"] for r in rows] == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert all(r["median_us"] > 0 for r in rows), rows


def test_compare_reads_each_models_peak_memory_alone(tmp_path):
    """One process has one peak: each side's is read in a child that runs only that model.
    B writes a 16 MB tensor (4M floats), A a few bytes: B's peak grows by that much more."""
    import torch

    import litert_torch

    class Tile(torch.nn.Module):
        def forward(self, x):
            return x.repeat(1000, 1000)  # (1000, 4000) floats

    small, large = tmp_path / "small.tflite", tmp_path / "large.tflite"
    litert_torch.convert(torch.nn.Linear(4, 4), (torch.ones(1, 4),), progress=False).export(small)
    litert_torch.convert(Tile(), (torch.ones(1, 4),), progress=False).export(large)
    result = bench.compare(str(small), str(large), runs=2, warmup=0)
    grown = {
        side: result[side]["memory"]["peak_rss_mb"] - result[side]["memory"]["peak_rss_before_mb"] for side in "ab"
    }
    assert result["a"]["memory"]["process"] == result["b"]["memory"]["process"] == "child"
    assert grown["b"] - grown["a"] >= 16, grown  # both load the interpreter (about 20 MB here)
