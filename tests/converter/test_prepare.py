"""convert() never returns a file LiteRT cannot prepare: it allocates the written model
in the interpreter (default delegate) and turns a refusal into a ConversionError naming
the op and the user's line. Plus the regression behind it: the layout pass's undo
(snapshot/restore) forgot op kinds, leaving a RESHAPE that read a TRANSPOSE's perm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from converter import ir
from converter.errors import ConversionError
from converter.passes._graph import restore, snapshot
from converter.writer import write_flatbuffer
from litert_torch.api import check_prepares
from tests.converter.passes.passes_helpers import GraphBuilder


def test_restore_undoes_an_op_turned_into_another_kind():
    b = GraphBuilder()
    y = b.op("TRANSPOSE", [b.input((1, 1, 3, 4)), b.const([0, 2, 1, 3], np.int32)], shape=(1, 3, 1, 4))
    graph = b.output(y)
    op = graph.ops[0]
    state = snapshot(graph)
    op.opcode, op.inputs = "RESHAPE", [op.inputs[0], b.const([1, 3, 1, 4], np.int32)]  # what simplify_reshapes does
    restore(graph, state)
    assert op.opcode == "TRANSPOSE" and list(op.inputs[1].data) == [0, 2, 1, 3]


def broken_reshape_model() -> ir.Model:
    """x (1, 6) -> RESHAPE to a 0-element shape: a well-formed file the RESHAPE kernel refuses."""
    b = GraphBuilder()
    x = b.input((1, 6))
    y = b.op("RELU", [x])
    z = b.op("RESHAPE", [y, b.const([0, 2, 1, 3], np.int32)], shape=(1, 6))
    b.graph.ops[-1].source = "model.py:12 in forward: q.permute(0, 2, 1, 3)"
    return ir.Model([b.output(z)])


def test_check_prepares_names_the_refused_op_and_the_user_line():
    model = broken_reshape_model()
    with pytest.raises(ConversionError) as err:
        check_prepares(write_flatbuffer(model), model)
    text = str(err.value)
    assert "RESHAPE (op 1 of signature" in text
    assert "model.py:12 in forward: q.permute(0, 2, 1, 3)" in text
    assert "num_input_elements != num_output_elements" in text


def test_convert_raises_instead_of_returning_a_file_litert_cannot_prepare(monkeypatch):
    import converter.pipeline as pipeline
    from litert_torch import convert

    def break_the_reshape(model):
        for op in model.graphs[0].ops:
            if op.opcode == "RESHAPE":
                op.inputs[1] = ir.Tensor("bad_shape", (4,), np.int32, data=np.array([0, 2, 1, 3], np.int32))
                op.options = {}
        return model

    monkeypatch.setattr(pipeline, "optimize", break_the_reshape)
    with pytest.raises(ConversionError, match=r"LiteRT cannot prepare the converted model at RESHAPE"):
        convert(torch.nn.Flatten(), (torch.randn(1, 2, 3),))


def test_convert_reports_the_prepare_stage_timing():
    from litert_torch import convert

    edge = convert(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    assert "prepare" in edge.timings


def _count_prepares(monkeypatch) -> list[bool]:
    """Record each preparation's `use_xnnpack` flag."""
    import runtimes.litert as litert

    calls, real = [], litert._prepare_all

    def recording(content, use_xnnpack):
        calls.append(use_xnnpack)
        return real(content, use_xnnpack)

    monkeypatch.setattr(litert, "_prepare_all", recording)
    return calls


def test_a_file_whose_stored_shapes_the_kernels_confirm_skips_the_delegates_preparation(monkeypatch):
    calls = _count_prepares(monkeypatch)
    edge = convert_small_cnn()
    assert calls == [False]
    assert "prepare" in edge.timings


def test_a_stored_shape_the_kernels_recompute_differently_also_prepares_with_xnnpack(monkeypatch):
    from runtimes.litert import prepare_model

    b = GraphBuilder()
    y = b.op("RESHAPE", [b.op("RELU", [b.input((1, 6))]), b.const([2, 3], np.int32)], shape=(3, 2))  # file says (3, 2)
    calls = _count_prepares(monkeypatch)
    prepare_model(write_flatbuffer(ir.Model([b.output(y)])))  # XNNPACK accepts it: the check passes
    assert calls == [False, True]


def convert_small_cnn():
    from litert_torch import convert

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    return convert(model, (torch.randn(1, 3, 8, 8),))
