"""`benchmarks/device/hf_bench.py` at smoke sizes: every row measured, greedy tokens equal across
caches, images close to CPU's."""

from __future__ import annotations

import json

import pytest

from benchmarks.device import hf_bench


def test_generate_section(tmp_path):
    out = tmp_path / "hf.json"
    trace = tmp_path / "trace"
    hf_bench.main(
        ["--smoke", "--sections", "generate", "--caches", "default,static", "--json", str(out), "--trace", str(trace)]
        + ["--parts"]
    )
    rows = json.loads(out.read_text())["generate"]
    assert [(r["batch"], r["cache"]) for r in rows] == [(1, "default"), (1, "static")]
    for row in rows:
        assert "error" not in row, row
        assert row["decode_ms"] > 0 and row["first_call_s"] > row["first_prefill_s"] > 0 and row["bound_ms"] > 0
        assert row["x_bound"] == pytest.approx(row["decode_ms"] / row["bound_ms"])
        assert row["tokens_agree"]
        assert set(row["first_call_compile_s"]) == {"dynamo", "aot", "xla", "per_op"}
        assert min(row["first_call_compile_s"].values()) >= 0
    first = rows[0]["first_call_compile_s"]  # the first row traces and compiles the decode step
    assert first["dynamo"] > 0 and first["aot"] > 0 and first["xla"] > 0 and first["per_op"] > 0
    assert sum(first.values()) < rows[0]["first_call_s"]
    parts = rows[0]["parts"]  # the first row only, like the trace
    assert "parts" not in rows[1] and set(hf_bench.PART_LABELS) < set(parts) and parts["wall"] > 0
    assert all(parts[label] >= 0 for label in hf_bench.PART_LABELS)
    assert parts["the compiled step's call"] >= parts["  of it reading its inputs"]
    traced = rows[0]["trace"]  # the first row only; CPU has no device plane: busy 0
    assert "trace" not in rows[1] and traced["wall_ms_per_token"] > 0 and traced["device_ms_per_token"] == 0
    assert any("generate" in name for name in traced["host_ms_per_token"]), traced
    assert not any("profiler.py" in name for name in traced["host_ms_per_token"])


@pytest.mark.slow  # strict eager compiles every UNet op's program: minutes on a loaded CPU
def test_diffusers_section(tmp_path):
    out = tmp_path / "hf.json"
    hf_bench.main(
        ["--smoke", "--sections", "diffusers", "--sd-modes", "cpu,tpu-eager,tpu-compiled", "--json", str(out)]
    )
    rows = json.loads(out.read_text())["diffusers"]
    assert [r["mode"] for r in rows] == ["cpu", "tpu-eager", "tpu-compiled"]
    for row in rows:
        assert "error" not in row, row
        assert row["s_per_image"] > 0
    assert all(r["max_abs_diff_vs_cpu"] < 1e-3 for r in rows[1:])  # images in [0, 1]
