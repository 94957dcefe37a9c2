"""TensorFlow Lite Micro: full-int8 models run in the tflite-micro interpreter and match
ai-edge-litert; the arena is measured there; the C export compiles and holds the model."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from converter.writer import write_flatbuffer
from runtimes.litert import LiteRTModel
from runtimes.micro import (
    MicroError,
    c_source,
    export_c_source,
    measure_arena,
    micro_unavailable,
    resolver_method,
    run_micro,
)
from runtimes.targets import check
from tests.runtimes.int8_models import int8_conv, int8_mlp

pytestmark = pytest.mark.skipif(micro_unavailable() is not None, reason=str(micro_unavailable()))


def _int8_inputs(content: bytes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in LiteRTModel(content).signature().inputs:
        if spec.dtype == np.float32:
            out.append(rng.standard_normal(spec.shape).astype(np.float32))
        else:
            out.append(rng.integers(-100, 100, spec.shape).astype(spec.dtype))
    return out


@pytest.mark.parametrize(
    "build", [int8_mlp, lambda: int8_mlp(float_io=True), int8_conv], ids=["mlp", "mlp_float_io", "conv"]
)
def test_int8_ir_models_match_litert_exactly(build):
    content = write_flatbuffer(build())
    inputs = _int8_inputs(content)
    expected = LiteRTModel(content).run(inputs)
    result = run_micro(content, inputs)
    for got, want in zip(result.outputs, expected):
        np.testing.assert_array_equal(got, want)
    assert 256 < result.arena_bytes < 64 << 10


@pytest.mark.parametrize(
    "name",
    [
        "tcn",
        "espcn_x3",
        pytest.param("audio_m5", marks=pytest.mark.slow),
        pytest.param("wide_resnet16_4", marks=pytest.mark.slow),
    ],
)
def test_full_int8_zoo_models_match_litert_within_one_step(zoo_tflite, name):
    content = zoo_tflite(name, "full_int8")
    assert check(content, "micro", quiet=True).ok
    inputs = _int8_inputs(content)
    [want] = LiteRTModel(content).run(inputs)
    [got] = run_micro(content, inputs).outputs
    assert got.dtype == want.dtype == np.int8
    # Same int8 graph, two kernel libraries: rounding may differ by one quantization step.
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1


def test_measured_arena_is_enough_and_a_smaller_one_is_not():
    content = write_flatbuffer(int8_conv())
    arena = measure_arena(content)
    assert arena % 16 == 0
    run_micro(content, _int8_inputs(content), arena_size=arena)
    with pytest.raises(MicroError, match="TFLM failed"):
        run_micro(content, _int8_inputs(content), arena_size=arena // 4)


def test_c_export_compiles_and_holds_the_model_bytes(tmp_path):
    content = write_flatbuffer(int8_conv())
    header, source = export_c_source(content, "kws-int8", str(tmp_path), arena_bytes=4096)
    text = open(source).read()
    assert "alignas(16) const unsigned char g_kws_int8_model[]" in text
    data = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-f]{2})", text))
    assert data == content
    h = open(header).read()
    assert "constexpr size_t kKwsInt8ArenaSize = 4096;" in h
    assert "resolver.AddConv2D()" in h and "resolver.AddMaxPool2D()" in h and "resolver.AddReshape()" in h
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the C source was checked as text only")
    obj = tmp_path / "model.o"
    subprocess.run([gxx, "-std=c++17", "-c", source, "-o", str(obj)], check=True)
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    address = int(re.search(r"([0-9a-f]+) R g_kws_int8_model\n", symbols).group(1), 16)
    assert address % 16 == 0


def test_export_measures_the_arena_when_not_given(tmp_path):
    content = write_flatbuffer(int8_mlp())
    header, _ = export_c_source(content, "mlp", str(tmp_path))
    arena = int(re.search(r"kMlpArenaSize = (\d+);", open(header).read()).group(1))
    assert arena >= run_micro(content, _int8_inputs(content)).arena_bytes


def test_resolver_method_names():
    assert [resolver_method(op) for op in ("CONV_2D", "DEPTHWISE_CONV_2D", "PADV2", "BATCH_MATMUL", "L2_POOL_2D")] == [
        "AddConv2D",
        "AddDepthwiseConv2D",
        "AddPadV2",
        "AddBatchMatMul",
        "AddL2Pool2D",
    ]
    header, _ = c_source(write_flatbuffer(int8_mlp()), "m", None)
    assert "ArenaSize" not in header and "AddFullyConnected" in header


def test_a_model_tflm_cannot_run_fails_with_its_log():
    from tests.runtimes.test_targets import _elementwise_model

    x_model = _elementwise_model((1, 4), opcode="GELU")
    x_model.graphs[0].ops[0].inputs = x_model.graphs[0].ops[0].inputs[:1]
    content = write_flatbuffer(x_model)
    assert any(v.rule == "unsupported-op" and "GELU" in v.where for v in check(content, "micro", quiet=True).errors)
    with pytest.raises(MicroError, match="TFLM failed"):
        run_micro(content, [np.zeros((1, 4), np.float32)])
