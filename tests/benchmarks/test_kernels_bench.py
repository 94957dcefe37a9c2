"""`benchmarks/kernels/kernels_bench.py` before it goes to a chip: it runs on CPU (the kernels in
Pallas's interpreter, agreeing with XLA), and `--compile-only v5e` compiles its attention
programs for the chip, where the kernel's forward + backward program holds far less
memory than XLA's (no (seq, seq) score matrix)."""

from __future__ import annotations

import json

import pytest

from benchmarks.kernels import kernels_bench
from kernels import tpu


def test_runs_on_cpu_and_agrees_with_xla(tmp_path, capsys):
    path = tmp_path / "k.json"
    assert kernels_bench.main(["--kernels", "norm", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert [r["kernel"] for r in report["rows"]] == ["rms_norm", "rms_norm + residual", "layer_norm"]
    for row in report["rows"]:
        assert row["max_rel_diff"] < 1e-5 and row["fwd_bwd_ms"]["interpret"] > 0 and not row["error"]
    out = capsys.readouterr().out
    assert "INTERPRET mode on CPU: correctness only" in out and "fwd+bwd ms k/xla" in out


@pytest.mark.slow  # the default suite's time budget: compiles attention at several lengths for a TPU
def test_compile_only_attention_memory_is_linear(tmp_path):
    if tpu.libtpu_version() is None:
        import pytest

        pytest.skip("compiling for a TPU needs libtpu (tools/setup.sh installs it)")
    path = tmp_path / "k.json"
    argv = ["--compile-only", "v5e", "--kernels", "attention", "--seq", "1024", "--tokens", "2048", "--json", str(path)]
    assert kernels_bench.main(argv) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert not row["error"] and row["shape"] == "B2 H16/16 D128"
    kernel, xla = row["temp_bytes"]["pallas"], row["temp_bytes"]["reference"]
    mib = 2**20
    io = 8 * 8 * mib  # q, k, v, dout in; output, dq, dk, dv out: B2 x H16 x 1024 x D128 bf16 = 8 MiB each
    assert kernel <= io + 8 * mib, kernel / mib  # + per-row statistics and padding, nothing (seq, seq)
    assert xla >= io + 128 * mib, xla / mib  # + float32 scores: 2 x 16 x 1024 x 1024 x 4 bytes
