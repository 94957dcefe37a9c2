"""`run_pass`: each pass reports whether it changed the graph, and (in tests and debug
runs) the IR is validated after it, naming the pass that broke it."""

from __future__ import annotations

import numpy as np
import pytest

from converter.errors import ConversionError
from converter.passes import fuse_activations, remove_dead_code, run_pass
from tests.converter.passes.passes_helpers import GraphBuilder


def _add_relu_graph():
    b = GraphBuilder()
    x = b.input((1, 4))
    y = b.op("ADD", [x, b.const(np.ones((1, 4)))], {"fusedActivationFunction": "NONE"})
    b.op("EXP", [x])  # nobody reads it
    return b.output(b.op("RELU", [y]))


def test_a_pass_reports_a_change_then_nothing_on_the_second_run():
    graph = _add_relu_graph()
    assert run_pass(remove_dead_code, graph)  # the unread EXP goes
    assert run_pass(fuse_activations, graph)  # RELU joins the ADD
    assert [op.opcode for op in graph.ops] == ["ADD"]
    assert not run_pass(remove_dead_code, graph)
    assert not run_pass(fuse_activations, graph)


def test_a_pass_that_breaks_the_graph_is_named(monkeypatch):
    monkeypatch.setenv("LITERT_TORCH_VALIDATE_PASSES", "1")

    def reverse_ops(graph):  # a broken pass: readers before their producers
        graph.ops.reverse()
        return graph

    graph = _add_relu_graph()
    with pytest.raises(ConversionError, match="after pass reverse_ops.*topological order"):
        run_pass(reverse_ops, graph)
