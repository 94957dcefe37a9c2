"""Target profiles and checks: purpose-built violating models are caught (and the check
says why and what to do), clean zoo models pass, convert(target=...) rewrites then checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import litert_torch
import runtimes
from converter import ir
from converter.writer import write_flatbuffer
from litert_torch.targets import prepare_for_target
from runtimes.litert import LiteRTModel
from runtimes.targets import PROFILES, TargetError, check, get_profile, read_model
from tests.runtimes.int8_models import int8_conv, int8_mlp


def _elementwise_model(shape, opcode="ADD", dtype=np.float32, extra_op=None) -> ir.Model:
    """x -> opcode(x, x) [-> extra_op] -> y, all of `shape`."""
    x = ir.Tensor("x", shape, dtype)
    y = ir.Tensor("y", shape, dtype)
    ops = [ir.Op(opcode, [x, x], [y], {"fusedActivationFunction": "NONE"} if opcode == "ADD" else {})]
    return ir.Model([ir.Graph("serving_default", [x], [y], ops, ["x"], ["y"])])


def _expand_dims_model() -> ir.Model:
    """x [2, 3] -> EXPAND_DIMS(axis 0) [1, 2, 3] -> ADD (+1) -> y."""
    x = ir.Tensor("x", (2, 3), np.float32)
    axis = ir.Tensor("axis", (), np.int32, data=np.asarray(0, np.int32))
    e = ir.Tensor("e", (1, 2, 3), np.float32)
    one = ir.Tensor("one", (), np.float32, data=np.asarray(1.0, np.float32))
    y = ir.Tensor("y", (1, 2, 3), np.float32)
    ops = [ir.Op("EXPAND_DIMS", [x, axis], [e]), ir.Op("ADD", [e, one], [y], {"fusedActivationFunction": "NONE"})]
    return ir.Model([ir.Graph("serving_default", [x], [y], ops, ["x"], ["y"])])


def _rules(report, rule):
    return [v for v in report.violations if v.rule == rule]


def test_rank5_tensor_is_caught_on_gpu_but_fine_on_cpu():
    content = write_flatbuffer(_elementwise_model((1, 2, 3, 4, 5)))
    gpu = check(content, "android-gpu", quiet=True)
    assert not gpu.ok
    [rank] = _rules(gpu, "rank")[:1]
    assert "rank 5" in rank.why and "limit of 4" in rank.why and "#0 ADD" in rank.why
    assert "reshape" in rank.fix
    assert check(content, "ios-gpu", quiet=True).errors
    assert check(content, "android-cpu", quiet=True).ok


def test_rank5_from_a_pytorch_model_is_caught():
    class Rank5(torch.nn.Module):
        def forward(self, x):
            return (x.reshape(1, 2, 3, 4, 5) * 2.0).sum(dim=1)

    edge = litert_torch.convert(Rank5(), (torch.randn(2, 60),), progress=False)
    report = check(edge, "android-gpu", quiet=True)
    assert any(v.rule == "rank" and "rank 5" in v.why for v in report.errors), report


def test_unsupported_op_is_named_with_a_fix_and_the_gpu_rewrite_removes_it():
    model = _expand_dims_model()
    before = check(write_flatbuffer(model), "android-gpu", quiet=True)
    [v] = _rules(before, "unsupported-op")
    assert "EXPAND_DIMS" in v.where and "RESHAPE" in v.fix
    model, report = prepare_for_target(model, get_profile("android-gpu"))
    assert report.ok and report.rewrites == ["serving_default: op #0 EXPAND_DIMS -> RESHAPE [1, 2, 3]"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    [y] = LiteRTModel(write_flatbuffer(model)).run([x])
    np.testing.assert_array_equal(y, x[None] + 1)


def test_custom_op_is_an_error_everywhere():
    model = _elementwise_model((1, 4))
    content = bytearray(write_flatbuffer(model))
    view = read_model(bytes(content))
    assert view.subgraphs[0].ops[0].opcode == "ADD"
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(bytes(content), 0)
    m.operatorCodes[0].builtinCode = m.operatorCodes[0].deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    m.operatorCodes[0].customCode = "MyFancyOp"
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    for target in ("android-cpu", "web", "micro"):
        [v] = _rules(check(bytes(builder.Output()), target, quiet=True), "custom-op")
        assert "MyFancyOp" in v.why and "register" in v.fix


def test_int64_io_is_an_error_on_web_and_convert_target_web_casts_it():
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)

        def forward(self, ids):
            return self.table(ids) * 2.0

    torch.manual_seed(0)
    model, ids = Embed().eval(), torch.tensor([[1, 5, 9]])
    plain = litert_torch.convert(model, (ids,), progress=False)
    report = check(plain, "web", quiet=True)
    [v] = _rules(report, "io-dtype")
    assert "input" in v.where and "int64" in v.why and "int32" in v.fix
    assert check(plain, "android-cpu", quiet=True).ok

    edge = litert_torch.convert(model, (ids,), target="web", progress=False)
    assert edge.target_report.ok and any("int64 -> int32" in r for r in edge.target_report.rewrites)
    runner = LiteRTModel(edge.model_content())
    assert runner.signature().inputs[0].dtype == np.int32
    [out] = runner.run([ids.numpy().astype(np.int32)])
    np.testing.assert_allclose(out, model(ids).detach().numpy(), rtol=1e-6)


def test_float_ops_are_errors_on_micro_and_edgetpu_int8_models_pass():
    float_model = write_flatbuffer(_elementwise_model((1, 8)))
    for target in ("micro", "edgetpu"):
        [v] = _rules(check(float_model, target, quiet=True), "float-op")
        assert "#0 ADD" in v.where and "float32" in v.why and "full_int8" in v.fix
    for build in (int8_mlp, int8_conv):
        content = write_flatbuffer(build())
        assert check(content, "micro", quiet=True).ok, check(content, "micro", quiet=True)
        assert check(content, "edgetpu", quiet=True).ok, check(content, "edgetpu", quiet=True)
    # int8 inside, float I/O: the QUANTIZE/DEQUANTIZE boundary is fine on micro; on the
    # Edge TPU the trailing DEQUANTIZE runs on the CPU (a warning, not an error).
    content = write_flatbuffer(int8_mlp(float_io=True))
    assert check(content, "micro", quiet=True).ok
    tpu = check(content, "edgetpu", quiet=True)
    assert tpu.ok and [v.where for v in tpu.warnings] == ["serving_default: op #3 DEQUANTIZE"]


def test_micro_per_channel_dequantize_and_multiple_signatures_are_caught():
    model = int8_conv()
    graph = model.graphs[0]
    w = graph.ops[0].inputs[1]
    wf = ir.Tensor("w_float", w.shape, np.float32)
    graph.ops.insert(0, ir.Op("DEQUANTIZE", [w], [wf]))  # per-channel weights dequantized
    graph.outputs.append(wf)
    graph.output_names.append("w_float")
    second = int8_mlp().graphs[0]
    second.name = "other"
    model.graphs.append(second)
    report = check(write_flatbuffer(model), "micro", quiet=True)
    assert [v.rule for v in report.errors if v.rule in ("dequantize", "subgraphs")] == ["subgraphs", "dequantize"]


def test_dynamic_shapes_are_caught_for_micro_and_the_micro_rewrite_fixes_them():
    model = int8_mlp()
    model.graphs[0].inputs[0].shape_signature = (-1, 16)
    model.graphs[0].outputs[0].shape_signature = (-1, 8)
    report = check(write_flatbuffer(model), "micro", quiet=True)
    assert {v.rule for v in report.errors} == {"dynamic-shape"}
    _, fixed = prepare_for_target(model, "micro")
    assert fixed.ok and "fixed to the sample shapes" in fixed.rewrites[0]


def test_int16_activations_are_a_warning_for_xnnpack_targets():
    content = write_flatbuffer(_elementwise_model((1, 8), dtype=np.int16))
    report = check(content, "android-cpu", quiet=True)
    assert report.ok and [v.rule for v in report.warnings] == ["int16"]
    assert "int16x8" in report.warnings[0].why


def test_edgetpu_outer_dims_and_op_options():
    model = int8_conv()
    model.graphs[0].ops[0].options["dilationHFactor"] = 2
    report = check(write_flatbuffer(model), "edgetpu", quiet=True)
    [v] = _rules(report, "op-options")
    assert "dilation 2x1" in v.why
    wide = _elementwise_model((2, 3, 4, 5), dtype=np.int8)
    assert _rules(check(write_flatbuffer(wide), "edgetpu", quiet=True), "rank")


def test_convert_raises_target_error_with_the_report_unless_warn():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    with pytest.raises(TargetError) as info:
        litert_torch.convert(model, (torch.randn(1, 4),), target="micro", progress=False)
    assert "float-op" not in str(info.value) and "FULLY_CONNECTED" in str(info.value)
    assert "target_check='warn'" in str(info.value) and not info.value.report.ok
    edge = litert_torch.convert(model, (torch.randn(1, 4),), target="micro", target_check="warn", progress=False)
    assert not edge.target_report.ok and len(edge.model_content()) > 0


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_target_error_names_each_ops_layer_and_source_line():
    with pytest.raises(TargetError) as info:
        litert_torch.convert(_TwoLayers().eval(), (torch.randn(1, 4),), target="micro", progress=False)
    here = "tests/runtimes/test_targets.py"
    assert f"op #0 FULLY_CONNECTED (first, {here}:" in str(info.value)
    assert f"op #1 FULLY_CONNECTED (second, {here}:" in str(info.value)
    assert [v.source.split(",")[0] for v in info.value.report.violations] == ["first", "second"]


def test_unknown_target_and_bad_mode_fail_before_any_work():
    with pytest.raises(ValueError, match="unknown target 'android-npu'; known targets: android-cpu"):
        litert_torch.convert(torch.nn.Identity(), (torch.randn(1),), target="android-npu")
    with pytest.raises(ValueError, match="target_check must be one of"):
        litert_torch.convert(torch.nn.Identity(), (torch.randn(1),), target="web", target_check="ignore")
    with pytest.raises(ValueError, match="not a valid LiteRT model.*TFL3"):
        check(b"not a model at all", "web", quiet=True)
    with pytest.raises(ValueError, match="not a valid LiteRT model.*18-byte file"):
        check(b"\x1c\x00\x00\x00TFL3" + bytes(10), "web", quiet=True)  # truncated: never read past the end


def test_an_int8_model_passes_every_profile_but_the_web_which_has_no_int8_io():
    content = write_flatbuffer(int8_conv())
    for name in PROFILES:
        report = check(content, name, quiet=True)
        assert report.to_dict()["target"] == name and json.loads(json.dumps(report.to_dict()))["ok"] == report.ok
        if name.startswith("web"):  # LiteRT.js tensors: float32, int32, uint8
            assert sorted(v.where for v in report.errors) == [
                "serving_default: input tensor 'x' int8[1, 8, 8, 3]",
                "serving_default: output tensor 'y' int8[1, 64]",
            ]
        else:  # CPU and GPU delegates take int8 models (the GPU dequantizes them)
            assert report.ok, report


@pytest.mark.parametrize("name", ["lenet5", "wide_resnet16_4", "unet_small"])
def test_clean_zoo_models_pass_cpu_gpu_and_web(zoo_tflite, name):
    content = zoo_tflite(name)
    for target in ("android-cpu", "ios-cpu", "android-gpu", "ios-gpu", "web", "web-gpu"):
        report = check(content, target, quiet=True)
        assert report.ok and not report.violations, report
    assert not check(content, "micro", quiet=True).ok  # float32: not for microcontrollers


def test_runtimes_check_prints_the_report(capsys):
    report = runtimes.check(write_flatbuffer(_elementwise_model((1, 2, 3, 4, 5))), "web-gpu")
    printed = capsys.readouterr().out
    assert printed.startswith("web-gpu (LiteRT.js in the browser (WebGPU)): NOT compatible")
    assert "rank 5" in printed and str(report) in printed


def test_cli_check_lists_violations_and_sets_the_exit_code(tmp_path, capsys):
    from litert_torch.cli import main

    bad = tmp_path / "rank5.tflite"
    bad.write_bytes(write_flatbuffer(_elementwise_model((1, 2, 3, 4, 5))))
    assert main(["check", str(bad), "--target", "android-gpu"]) == 1
    out = capsys.readouterr().out
    assert "NOT compatible" in out and "rank 5" in out
    good = tmp_path / "int8.tflite"
    good.write_bytes(write_flatbuffer(int8_conv()))
    assert main(["check", str(good), "--target", "micro", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["check", str(good), "--target", "nope"]) == 2


def test_gpu_target_runs_rank5_elementwise_ops_on_rank4_views():
    class Rank5Elementwise(torch.nn.Module):
        def forward(self, x):
            y = x.reshape(1, 2, 3, 4, 5)
            return (torch.sigmoid(y * 2.0) + y).reshape(2, 60)

    model, x = Rank5Elementwise(), torch.randn(2, 60)
    plain = litert_torch.convert(model, (x,), progress=False)
    assert _rules(check(plain, "android-gpu", quiet=True), "rank")
    edge = litert_torch.convert(model, (x,), target="android-gpu", progress=False)
    assert edge.target_report.ok and "run on rank-4 views" in edge.target_report.rewrites[0]
    assert max(t.rank for t in edge.ir_model.graphs[0].tensors()) == 4
    np.testing.assert_allclose(edge(x), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_unaligned_weights_are_caught_for_micro():
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    aligned = write_flatbuffer(int8_conv())
    assert check(aligned, "micro", quiet=True).ok
    # The plain flatbuffers builder ignores the schema's 16-byte alignment of Buffer.data.
    builder = flatbuffers.Builder(1024)
    builder.Finish(schema.ModelT.InitFromPackedBuf(aligned, 0).Pack(builder), file_identifier=b"TFL3")
    report = check(bytes(builder.Output()), "micro", quiet=True)
    assert report.errors and {v.rule for v in report.errors} == {"alignment"}
    assert "not a multiple of 16" in report.errors[0].why and "tflite_flatbuffer_align" in report.errors[0].fix
    assert check(bytes(builder.Output()), "android-cpu", quiet=True).ok


def test_convert_with_a_target_writes_the_model_once(monkeypatch):
    """The target check reads the bytes that ship: no second write (which would also join
    a >2 GB model's pieces in memory)."""
    import converter.writer
    import litert_torch.api
    import litert_torch.targets

    writes = []
    real = converter.writer.write_flatbuffer_parts

    def counting(model, **kwargs):
        writes.append(model)
        return real(model, **kwargs)

    for module in (converter.writer, litert_torch.api, litert_torch.targets):
        monkeypatch.setattr(module, "write_flatbuffer_parts", counting)
    x = torch.randn(1, 4)
    edge = litert_torch.convert(torch.nn.Linear(4, 3), (x,), target="android-gpu", progress=False)
    assert len(writes) == 1 and edge.target_report.ok
    assert edge.target_report.file_size == len(edge.model_content())
