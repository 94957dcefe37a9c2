"""Fused activations: clamps move into their producers, same numbers in LiteRT."""

import numpy as np
import pytest

from converter.passes import fuse_activations
from tests.converter.passes.passes_helpers import check_pass, histogram

CONV_OPTS = {"padding": "SAME", "strideH": 1, "strideW": 1, "fusedActivationFunction": "NONE"}
POOL_OPTS = {
    "padding": "VALID",
    "strideH": 2,
    "strideW": 2,
    "filterHeight": 2,
    "filterWidth": 2,
    "fusedActivationFunction": "NONE",
}

PRODUCERS = {
    "CONV_2D": lambda b, x: b.op("CONV_2D", [x, b.random((4, 3, 3, 3)), b.random((4,))], CONV_OPTS, shape=(1, 4, 4, 4)),
    "DEPTHWISE_CONV_2D": lambda b, x: b.op(
        "DEPTHWISE_CONV_2D", [x, b.random((1, 3, 3, 3)), b.random((3,))], {**CONV_OPTS, "depthMultiplier": 1}
    ),
    "FULLY_CONNECTED": lambda b, x: b.op(
        "FULLY_CONNECTED", [x, b.random((5, 3)), b.random((5,))], {"keepNumDims": True}, shape=(1, 4, 4, 5)
    ),
    "TRANSPOSE_CONV": lambda b, x: b.op(
        "TRANSPOSE_CONV",
        [b.const([1, 8, 8, 2], np.int32), b.random((2, 2, 2, 3)), x],
        {"padding": "VALID", "strideH": 2, "strideW": 2},
        shape=(1, 8, 8, 2),
        dtype=np.float32,
    ),
    "ADD": lambda b, x: b.op("ADD", [x, b.random((3,))]),
    "SUB": lambda b, x: b.op("SUB", [x, b.input((1, 4, 4, 3))]),
    "MUL": lambda b, x: b.op("MUL", [x, b.random((1, 4, 4, 3))]),
    "DIV": lambda b, x: b.op("DIV", [x, b.const(np.full((3,), 0.5))]),
    "MAX_POOL_2D": lambda b, x: b.op("MAX_POOL_2D", [x], POOL_OPTS, shape=(1, 2, 2, 3)),
    "AVERAGE_POOL_2D": lambda b, x: b.op("AVERAGE_POOL_2D", [x], POOL_OPTS, shape=(1, 2, 2, 3)),
}


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_activation_fuses_into_producer(producer, activation):
    def build(b):
        y = PRODUCERS[producer](b, b.input((1, 4, 4, 3)))
        return b.output(b.op(activation, [y]))

    g = check_pass(build, fuse_activations)
    assert histogram(g) == {producer: 1}
    assert g.ops[0].options["fusedActivationFunction"] == activation


def test_tanh_and_concatenation_are_not_fused():
    # LiteRT kernels ignore a fused TANH and reject (or ignore) any fused CONCATENATION activation
    def build(b):
        x = b.input((1, 4, 4, 3))
        t = b.op("TANH", [b.op("ADD", [x, b.random((3,))])])
        c = b.op("RELU", [b.op("CONCATENATION", [x, x], {"axis": 3}, shape=(1, 4, 4, 6))])
        return b.output(t, c)

    g = check_pass(build, fuse_activations)
    assert histogram(g) == {"ADD": 1, "TANH": 1, "CONCATENATION": 1, "RELU": 1}


def test_not_fused_when_pre_activation_value_is_needed():
    def build(b):
        x = b.input((1, 4, 4, 3))
        y = b.op("ADD", [x, b.random((3,))])  # read twice
        z = b.op("ADD", [x, b.random((3,))])  # a graph output
        w = b.op("ADD", [x, b.random((3,))], {"fusedActivationFunction": "RELU6"})  # already fused
        return b.output(b.op("RELU", [y]), b.op("NEG", [y]), z, b.op("RELU", [z]), b.op("RELU", [w]))

    g = check_pass(build, fuse_activations)
    assert histogram(g)["RELU"] == 3
