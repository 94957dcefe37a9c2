"""Affine folding: per-channel MUL/ADD after conv/FC go into weights and bias, with the
same numbers in LiteRT; anything not per-channel is left alone."""

import numpy as np
import pytest

from converter.passes import fold_batch_norm, to_nhwc
from tests.converter.passes.passes_helpers import check_pass, histogram

CONV_OPTS = {"padding": "SAME", "strideH": 1, "strideW": 1, "fusedActivationFunction": "NONE"}


def conv(b, x, out_channels=6):
    return b.op(
        "CONV_2D",
        [x, b.random((out_channels, 3, 3, x.shape[-1])), b.random((out_channels,))],
        CONV_OPTS,
        shape=x.shape[:3] + (out_channels,),
    )


def depthwise(b, x, multiplier=2):
    c = x.shape[-1] * multiplier
    return b.op(
        "DEPTHWISE_CONV_2D",
        [x, b.random((1, 3, 3, c)), b.random((c,))],
        {**CONV_OPTS, "depthMultiplier": multiplier},
        shape=x.shape[:3] + (c,),
    )


def fully_connected(b, x, out_features=7):
    return b.op(
        "FULLY_CONNECTED",
        [x, b.random((out_features, x.shape[-1])), None],
        {"fusedActivationFunction": "NONE", "keepNumDims": True},
        shape=x.shape[:-1] + (out_features,),
    )


def transpose_conv(b, x, out_channels=5):
    n, h, w, _ = x.shape
    shape = (n, 2 * h, 2 * w, out_channels)
    return b.op(
        "TRANSPOSE_CONV",
        [b.const(shape, np.int32), b.random((out_channels, 2, 2, x.shape[-1])), x],
        {"padding": "VALID", "strideH": 2, "strideW": 2, "fusedActivationFunction": "NONE"},
        shape=shape,
        dtype=np.float32,
    )


def scale_and_shift(b, y):
    c = y.shape[-1]
    y = b.op("MUL", [y, b.const(b.rng.uniform(0.5, 2.0, (c,)))])
    shift = b.rng.standard_normal((1, 1, 1, c) if y.rank == 4 else (c,))
    return b.op("ADD", [b.const(shift), y], shape=y.shape)  # constant first: also folds


@pytest.mark.parametrize("producer", [conv, depthwise, fully_connected, transpose_conv])
def test_scale_and_shift_fold_into_the_producer(producer):
    def build(b):
        return b.output(scale_and_shift(b, producer(b, b.input((1, 4, 4, 3)))))

    g = check_pass(build, fold_batch_norm, rtol=1e-5, atol=1e-5)
    assert len(g.ops) == 1 and g.ops[0].outputs[0] is g.outputs[0]


def test_sub_and_div_fold_like_add_and_mul():
    def build(b):
        y = conv(b, b.input((1, 4, 4, 3)), 4)
        y = b.op("DIV", [y, b.const([2.0, 4.0, 0.5, 1.0])])
        return b.output(b.op("SUB", [y, b.const([[[[1.0, -1.0, 0.0, 3.0]]]])]))

    g = check_pass(build, fold_batch_norm)
    assert histogram(g) == {"CONV_2D": 1}


def test_nchw_batch_norm_folds_after_the_layout_pass():
    def build(b):
        y = b.batch_norm_nchw(b.conv_nchw(b.input((1, 3, 6, 6)), 8))
        return b.output(b.op("RELU", [y]))

    g = check_pass(build, lambda g: fold_batch_norm(to_nhwc(g)))
    assert histogram(g) == {"TRANSPOSE": 2, "CONV_2D": 1, "RELU": 1}


def test_not_per_channel_or_shared_outputs_are_left_alone():
    def build(b):
        x = b.input((1, 4, 4, 3))
        along_h = b.op("MUL", [conv(b, x, 4), b.const(np.arange(1.0, 5.0).reshape(1, 4, 1, 1))])
        shared = conv(b, x, 4)
        twice = b.op("ADD", [shared, b.const([1.0, 2.0, 3.0, 4.0])])
        activated = b.op("ADD", [conv(b, x, 4), b.const([1.0, 2.0, 3.0, 4.0])], {"fusedActivationFunction": "RELU"})
        by_tensor = b.op("MUL", [conv(b, x, 4), b.input((1, 4, 4, 4))])
        return b.output(along_h, twice, shared, activated, by_tensor)

    g = check_pass(build, fold_batch_norm)
    assert histogram(g) == {"CONV_2D": 4, "MUL": 2, "ADD": 2}


def test_shared_weights_are_not_modified():
    def build(b):
        x = b.input((1, 4, 4, 3))
        w, bias = b.random((4, 3, 3, 3)), b.random((4,))
        first = b.op("CONV_2D", [x, w, bias], CONV_OPTS, shape=(1, 4, 4, 4))
        second = b.op("CONV_2D", [x, w, bias], CONV_OPTS, shape=(1, 4, 4, 4))
        return b.output(b.op("MUL", [first, b.const([1.0, 2.0, 3.0, 4.0])]), second)

    g = check_pass(build, fold_batch_norm)
    assert histogram(g) == {"CONV_2D": 2}
    assert g.ops[0].inputs[1] is not g.ops[1].inputs[1]


def test_folds_through_a_reshape_that_keeps_the_channels():
    def build(b):
        y = b.reshape(fully_connected(b, b.input((2, 5, 3)), 6), (10, 6))  # flatten(0, 1)
        y = scale_and_shift(b, y)
        changes_channels = b.reshape(fully_connected(b, b.input((2, 5, 3)), 6), (2, 30))
        not_folded = b.op("MUL", [changes_channels, b.const(b.rng.uniform(0.5, 2.0, (30,)))])
        return b.output(b.reshape(y, (2, 5, 6)), not_folded)

    g = check_pass(build, fold_batch_norm)
    assert histogram(g) == {"FULLY_CONNECTED": 2, "RESHAPE": 3, "MUL": 1}


def test_levit_linear_batch_norm_folds_into_the_linear():
    """timm LeViT's LinearNorm: `bn(linear(x).flatten(0, 1)).reshape_as(x)`."""
    import torch
    from torch import nn

    from tests.helpers import assert_converts

    class LinearNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 12, bias=False)
            self.bn = nn.BatchNorm1d(12)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.data.uniform_(0.5, 2)
            self.bn.bias.data.uniform_(-1, 1)

        def forward(self, x):
            y = self.linear(x)
            return self.bn(y.flatten(0, 1)).reshape_as(y)

    edge = assert_converts(LinearNorm().eval(), (torch.randn(2, 7, 8),))
    assert [op.opcode for op in edge.ir_model.graphs[0].ops] == ["FULLY_CONNECTED"]
