"""The conversion pipeline: export -> decompose -> lower -> optimize, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch
from converter.errors import ConversionError, UnsupportedOpsError
from converter.pipeline import convert_module, cpu_view
from converter.progress import Progress, progress_enabled
from tests.helpers import assert_converts


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_mlp_matches_pytorch():
    torch.manual_seed(0)
    edge = assert_converts(TinyMLP(), (torch.randn(3, 8),))
    assert edge.signatures[0].input_names == ["x"]
    assert edge.signatures[0].output_names == ["output_0"]


class TwoInputsNestedOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.tensor([1.0, -2.0, 3.0]), persistent=False)

    def forward(self, image, mask):
        shifted = image + self.offset
        return shifted, {"scaled": shifted * mask, "const": image * torch.tensor(2.0)}


def test_inputs_named_after_forward_arguments_and_outputs_flattened():
    m = TwoInputsNestedOutputs()
    edge = assert_converts(m, (torch.randn(2, 3), torch.randn(2, 3)))
    sig = edge.signatures[0]
    assert sig.input_names == ["image", "mask"]
    assert sig.output_names == ["output_0", "output_1_scaled", "output_1_const"]


class Scaled(torch.nn.Module):
    def forward(self, x, *, scale):
        return x * scale


def test_keyword_inputs():
    edge = assert_converts(Scaled(), (torch.randn(4),), {"scale": torch.randn(4)})
    x, s = torch.randn(4), torch.randn(4)
    np.testing.assert_allclose(edge(x, scale=s), (x * s).numpy(), rtol=1e-6)


class Mode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)

    def forward(self, x):
        return x + 1.0 if self.training else x * 2.0


def test_exports_in_eval_mode_and_restores_training_flags():
    m = Mode().train()
    x = torch.randn(3)
    edge = litert_torch.convert(m, (x,))
    np.testing.assert_allclose(edge(x), (x * 2).numpy())
    assert m.training and m.inner.training  # the user's module is left as it was
    edge_train = litert_torch.convert(m, (x,), eval_mode=False)
    np.testing.assert_allclose(edge_train(x), (x + 1).numpy())


def test_cpu_module_is_not_copied():
    m = TinyMLP()
    assert cpu_view(m) is m


# ---- errors ---------------------------------------------------------------------------------

torch.library.define("litert_test::mystery", "(Tensor x) -> Tensor")


@torch.library.impl("litert_test::mystery", "CompositeExplicitAutograd")
def _mystery(x):
    return x.clone()


@torch.library.register_fake("litert_test::mystery")
def _mystery_fake(x):
    return torch.empty_like(x)


class ManyUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.ops.litert_test.mystery(x)
        b = torch.ops.litert_test.mystery(a + 1.0)
        c = torch.special.bessel_j0(x)
        return torch.relu(b) + c


def test_unsupported_ops_are_all_listed_with_counts_and_source_lines():
    with pytest.raises(UnsupportedOpsError) as info:
        litert_torch.convert(ManyUnsupported(), (torch.randn(4),))
    err = info.value
    names = {op.name: op for op in err.ops}
    assert set(names) == {"litert_test.mystery.default", "aten.special_bessel_j0.default"}
    assert names["litert_test.mystery.default"].count == 2
    assert names["aten.special_bessel_j0.default"].count == 1
    message = str(err)
    assert "litert_test.mystery.default  x2" in message
    assert "aten.special_bessel_j0.default  x1" in message
    assert "test_pipeline.py" in message and "torch.special.bessel_j0(x)" in message
    assert "in forward: a = torch.ops.litert_test.mystery(x)" in message
    assert "@lowers" in message  # and says what to do


@pytest.fixture
def exports(monkeypatch):
    """The `source_lines` flag of every export convert() makes."""
    from converter import pipeline

    flags, export = [], pipeline.export_module

    def spy(*args, source_lines=True, **kwargs):
        flags.append(source_lines)
        return export(*args, source_lines=source_lines, **kwargs)

    monkeypatch.setattr(pipeline, "export_module", spy)
    return flags


def test_convert_exports_without_stack_traces_and_again_with_them_for_an_error(exports):
    module, x = TinyMLP(), torch.randn(3, 8)
    litert_torch.convert(module, (x,))
    assert exports == [False]  # torch's per-node stack traces skipped: 15% of export
    with torch.no_grad():
        nodes = convert_module(module, (x,), source_lines=False)  # (the ops carry no source)
    assert all(op.source is None for op in nodes.graphs[0].ops)
    exports.clear()
    with pytest.raises(UnsupportedOpsError, match=r"test_pipeline\.py.*torch\.special\.bessel_j0\(x\)"):
        litert_torch.convert(ManyUnsupported(), (torch.randn(4),))
    assert exports == [False, True]  # the error is made again, naming the user's lines


def test_a_one_shot_calibration_iterator_is_read_once_with_stack_traces(exports):
    from litert_torch import quantize

    module, x = TinyMLP(), torch.randn(3, 8)
    litert_torch.convert(module, (x,), quant_config=quantize.full_int8(), calibration_data=iter([(x,)]))
    assert exports == [True]


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1.0
        return x * 2.0


def test_export_failure_is_wrapped_with_what_to_try():
    with pytest.raises(ConversionError) as info:
        litert_torch.convert(DataDependent(), (torch.randn(4),), strict_export=True)
    message = str(info.value)
    assert "torch.export could not capture DataDependent.forward" in message
    assert "strict_export=False" in message
    assert "test_pipeline.py" in message and "if x.sum() > 0:" in message  # the user's line
    assert info.value.__cause__ is not None


def test_an_export_failure_is_not_exported_twice(exports):
    with pytest.raises(ConversionError, match="torch.export could not capture"):
        litert_torch.convert(DataDependent(), (torch.randn(4),), strict_export=True)
    assert exports == [False]


def test_a_failing_lowering_names_the_op_and_the_user_line():
    from converter.lowering.registry import LOWERINGS

    aten = torch.ops.aten

    def broken(ctx, *args, **kwargs):
        raise ValueError("boom")

    saved = LOWERINGS.get(aten.mul.Tensor)
    LOWERINGS[aten.mul.Tensor] = broken
    try:
        with pytest.raises(ConversionError, match=r"lowering aten.mul.Tensor .*test_pipeline.py.*ValueError: boom"):
            litert_torch.convert(Scaled(), (torch.randn(2),), {"scale": torch.randn(2)})
    finally:
        if saved is None:
            LOWERINGS.pop(aten.mul.Tensor)
        else:
            LOWERINGS[aten.mul.Tensor] = saved


def test_dynamic_batch_dimension():
    batch = torch.export.Dim("batch", min=1, max=64)
    edge = assert_converts(
        TinyMLP(), (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}}, check_inputs=[(torch.randn(7, 8),)]
    )
    assert edge.signatures[0].inputs[0].shape_signature == (-1, 8)


# ---- progress ------------------------------------------------------------------------------


def test_progress_is_quiet_under_pytest_and_controllable(monkeypatch, capsys):
    assert not progress_enabled()
    monkeypatch.setenv("LITERT_TORCH_PROGRESS", "1")
    assert progress_enabled()
    assert not progress_enabled(False)
    monkeypatch.delenv("LITERT_TORCH_PROGRESS")
    stages = Progress(True)
    model = convert_module(TinyMLP(), (torch.randn(1, 8),), progress=stages)
    assert set(stages.timings) >= {"export", "lower", "optimize"}  # "decompose" only where a graph needs it
    assert "export" in capsys.readouterr().err
    assert model.graphs[0].ops


# ---- modules on another device ------------------------------------------------------------


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _on_tpu(module):
    import tpu_backend  # noqa: F401  (registers the device)

    return module.to("tpu")


def test_module_on_the_tpu_device_converts_and_stays_there():
    torch.manual_seed(0)
    reference = Tied()
    m = _on_tpu(Tied())
    m.load_state_dict(reference.state_dict())
    copy = cpu_view(m)
    assert copy is not m and copy.a.weight is copy.b.weight  # tied weights stay tied
    assert all(p.device.type == "cpu" for p in copy.parameters())
    edge = litert_torch.convert(m, (torch.randn(2, 4),))
    assert all(p.device.type == "tpu" for p in m.parameters())  # the user's module did not move
    x = torch.randn(2, 4)
    np.testing.assert_allclose(edge(x), reference(x).detach().numpy(), rtol=1e-5, atol=1e-6)
