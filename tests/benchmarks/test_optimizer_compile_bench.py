"""`benchmarks/device/optimizer_compile_bench.py` at two tensors: both arrangements compile for a v5e."""

from __future__ import annotations

import json

import pytest

from benchmarks.device import optimizer_compile_bench
from kernels.tpu import compile_unavailable

pytestmark = pytest.mark.skipif(compile_unavailable("v5e") is not None, reason=str(compile_unavailable("v5e")))


def test_both_arrangements_compile(tmp_path):
    out = tmp_path / "compile.json"
    optimizer_compile_bench.main(["--tensors", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["tensors"] == 2 and set(result["compile_s"]) == {"shared", "per-tensor"}
    assert all(seconds > 0 for seconds in result["compile_s"].values())
