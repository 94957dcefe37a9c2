"""Resource limits: models whose weights exceed the 2 GB flatbuffer limit.

Above `converter.writer.EXTERNAL_DATA_THRESHOLD` the writer stores each buffer after the
flatbuffer (`Buffer.offset/size`), and `convert` keeps those bytes as views of the
model's own arrays (`converter.writer.ModelParts`): `EdgeModel.export` streams them to
the file, so the weights are never copied a second time. The default suite checks the
layout and the zero-copy property on a small model with the threshold lowered; the slow
test converts 2.2 GiB of weights and measures peak memory (benchmarks/converter/memory_bench.py):

    .venv/bin/python -m pytest -q -s -m slow tests/reliability/test_resource_limits.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ai_edge_litert import schema_py_generated as schema

import converter.writer as writer
import litert_torch
from benchmarks.converter import memory_bench
from runtimes.verify import InvalidModelError


@pytest.fixture
def small_big_model(monkeypatch):
    """A 2 MiB two-table model converted with the large-model layout."""
    monkeypatch.setattr(writer, "EXTERNAL_DATA_THRESHOLD", 0)
    torch.manual_seed(0)
    model, args = memory_bench.big_model(2 << 20)
    return model, args, litert_torch.convert(model, args, progress=False)


def test_weights_after_the_flatbuffer_are_views_of_the_model(small_big_model, tmp_path):
    model, args, edge = small_big_model
    pieces = edge._pieces
    assert len(pieces) > 2  # flatbuffer, then padding and buffers
    table = model.a.weight.detach().numpy()
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), table) for p in pieces[1:] if len(p) >= 1024)

    path = edge.export(tmp_path / "big.tflite")
    content = open(path, "rb").read()
    assert len(content) == len(edge) and content == edge.model_content()
    m = schema.Model.GetRootAsModel(content, 0)
    offsets = [m.Buffers(i).Offset() for i in range(m.BuffersLength()) if m.Buffers(i).Size()]
    assert offsets and all(o % 16 == 0 and o >= len(pieces[0]) for o in offsets)
    with torch.no_grad():
        expected = model(*args).numpy()
    np.testing.assert_allclose(litert_torch.load(path)(*args), expected, rtol=1e-5, atol=1e-6)


def test_a_truncated_large_model_file_is_refused(small_big_model, tmp_path):
    _, _, edge = small_big_model
    content = edge.model_content()
    path = tmp_path / "cut.tflite"
    path.write_bytes(content[: len(content) - (1 << 20)])  # lost the end of the weights
    with pytest.raises(InvalidModelError, match="past the end of the file"):
        litert_torch.load(path)


@pytest.mark.slow
def test_converting_2_2_gib_of_weights_peaks_below_1_5x(tmp_path):
    """Needs ~6 GB free memory and ~2.5 GB of disk."""
    path = str(tmp_path / "big.tflite")
    result = memory_bench.measure(2.2, export=path, check=True)
    print(f"\n{result}")
    assert result["file_bytes"] > 2**31 and result["external_data"]
    assert result["convert_peak/weights"] <= 1.5
    assert result["export_peak/weights"] <= 1.5
    assert result["max_relative_error"] <= 1e-4  # the project metric (float sums of 1,024 terms)
