"""The layout pass: NCHW graphs as lowering writes them end with transposes only at
the boundary, and compute the same numbers in LiteRT before and after."""

import numpy as np
import pytest

from converter.passes import to_nhwc
from tests.converter.passes.passes_helpers import NCHW_TO_NHWC, NHWC_TO_NCHW, GraphBuilder, check_pass, histogram


def transposes(graph):
    return [op for op in graph.ops if op.opcode == "TRANSPOSE"]


def perm_of(op):
    return list(op.inputs[1].data)


def test_conv_bn_relu_stack_keeps_one_transpose_per_boundary():
    def build(b):
        y = b.input((1, 3, 10, 10))
        for channels in (8, 8, 16):
            y = b.op("RELU", [b.batch_norm_nchw(b.conv_nchw(y, channels))])
        return b.output(y)

    g = check_pass(build, to_nhwc)
    ts = transposes(g)
    assert len(ts) == 2
    assert ts[0].inputs[0] is g.inputs[0] and perm_of(ts[0]) == NCHW_TO_NHWC
    assert ts[1].outputs[0] is g.outputs[0] and perm_of(ts[1]) == NHWC_TO_NCHW
    # batch norm constants now broadcast along the last (channel) axis
    muls = [op for op in g.ops if op.opcode == "MUL"]
    assert all(op.inputs[1].shape == (1, 1, 1, op.outputs[0].shape[-1]) for op in muls)


def test_residual_block_and_global_mean_leave_only_the_input_transpose():
    def build(b):
        x = b.op("RELU", [b.conv_nchw(b.input((2, 3, 8, 8)), 8)])
        y = b.op("RELU", [b.batch_norm_nchw(b.conv_nchw(x, 8))])
        y = b.batch_norm_nchw(b.conv_nchw(y, 8))
        y = b.op("RELU", [b.op("ADD", [y, x])])
        pooled = b.op("MEAN", [y, b.const([2, 3], np.int32)], {"keepDims": False}, shape=(2, 8))
        return b.output(pooled)

    g = check_pass(build, to_nhwc)
    ts = transposes(g)
    assert len(ts) == 1 and ts[0].inputs[0] is g.inputs[0]
    mean = next(op for op in g.ops if op.opcode == "MEAN")
    assert list(mean.inputs[1].data) == [1, 2]


def test_mean_keepdims_then_flatten_needs_no_transpose():
    def build(b):
        y = b.conv_nchw(b.input((1, 3, 6, 6)), 5)
        y = b.op("MEAN", [y, b.const([2, 3], np.int32)], {"keepDims": True}, shape=(1, 5, 1, 1))
        return b.output(b.reshape(y, (1, 5)))

    g = check_pass(build, to_nhwc)
    assert histogram(g) == {"TRANSPOSE": 1, "CONV_2D": 1, "MEAN": 1}
    assert g.ops[-1].options["keepDims"] is False and g.ops[-1].outputs[0] is g.outputs[0]


def test_unet_style_concat_and_upsample():
    def build(b):
        x = b.input((1, 3, 8, 8))
        skip = b.op("RELU", [b.conv_nchw(x, 4)])
        down = b.transpose(skip, NCHW_TO_NHWC)
        down = b.op(
            "MAX_POOL_2D",
            [down],
            {"padding": "VALID", "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2},
            shape=(1, 4, 4, 4),
        )
        down = b.transpose(down, NHWC_TO_NCHW)
        mid = b.op("RELU", [b.conv_nchw(down, 6)])
        up = b.transpose(mid, NCHW_TO_NHWC)
        up = b.op("RESIZE_NEAREST_NEIGHBOR", [up, b.const([8, 8], np.int32)], {}, shape=(1, 8, 8, 6))
        up = b.transpose(up, NHWC_TO_NCHW)
        cat = b.op("CONCATENATION", [up, skip], {"axis": 1}, shape=(1, 10, 8, 8))
        return b.output(b.conv_nchw(cat, 2, k=1))

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) == 2
    concat = next(op for op in g.ops if op.opcode == "CONCATENATION")
    assert concat.options["axis"] == 3


SINKABLE = {
    "pad": lambda b, y: b.op("PAD", [y, b.const([[0, 0], [0, 0], [1, 2], [0, 1]], np.int32)], shape=(1, 4, 9, 7)),
    "mirror_pad": lambda b, y: b.op(
        "MIRROR_PAD", [y, b.const([[0, 0], [0, 0], [1, 1], [2, 0]], np.int32)], {"mode": "REFLECT"}, shape=(1, 4, 8, 8)
    ),
    "slice": lambda b, y: b.op(
        "SLICE", [y, b.const([0, 1, 2, 0], np.int32), b.const([1, 2, -1, 4], np.int32)], shape=(1, 2, 4, 4)
    ),
    "strided_slice": lambda b, y: b.op(
        "STRIDED_SLICE",
        [y, b.const([0, 1, 0, 1], np.int32), b.const([1, 4, 6, 6], np.int32), b.const([1, 2, 2, 1], np.int32)],
        {"beginMask": 0b0100, "endMask": 0b0001},
        shape=(1, 2, 3, 5),
    ),
    "gather_channels": lambda b, y: b.op("GATHER", [y, b.const([3, 0, 0], np.int32)], {"axis": 1}, shape=(1, 3, 6, 6)),
    "mul_per_channel": lambda b, y: b.op("MUL", [y, b.const(np.arange(4.0).reshape(4, 1, 1), np.float32)]),
    "maximum_scalar": lambda b, y: b.op("MAXIMUM", [y, b.const(0.25, np.float32)]),
    "sub_const_first": lambda b, y: b.op("SUB", [b.const(np.arange(6.0), np.float32), y], shape=y.shape),
    "cast_round_trip": lambda b, y: b.op("CAST", [b.op("CAST", [y], dtype=np.int32)], dtype=np.float32),
    "logistic": lambda b, y: b.op("LOGISTIC", [y]),
    "sum_keepdims": lambda b, y: b.op("SUM", [y, b.const([1], np.int32)], {"keepDims": True}, shape=(1, 1, 6, 6)),
    "reduce_max_over_w": lambda b, y: b.op(
        "REDUCE_MAX", [y, b.const([-1], np.int32)], {"keepDims": False}, shape=(1, 4, 6)
    ),
}


@pytest.mark.parametrize("name", sorted(SINKABLE))
def test_transpose_sinks_through_layout_agnostic_op(name):
    """conv -> OP -> (rank-4 ? conv) : the pair of transposes around OP cancels."""

    def build(b):
        y = SINKABLE[name](b, b.conv_nchw(b.input((1, 3, 6, 6)), 4))
        if y.rank == 4:
            y = b.conv_nchw(y, 3)
        return b.output(y)

    g = check_pass(build, to_nhwc)
    n_expected = 2 if g.outputs[0].rank == 4 else 1
    if name == "reduce_max_over_w":
        n_expected = 2  # (N, C, H) output: C moves back in front of H
    assert len(transposes(g)) == n_expected, str(g)


def test_split_remaps_its_axis_and_each_output_gets_its_own_transpose():
    def build(b):
        y = b.conv_nchw(b.input((1, 3, 5, 5)), 6)
        parts = b.op(
            "SPLIT", [b.const(1, np.int32), y], {"numSplits": 2}, shape=(1, 3, 5, 5), dtype=np.float32, n_out=2
        )
        return b.output(b.conv_nchw(parts[0], 2), b.op("ADD", [parts[1], parts[1]]))

    g = check_pass(build, to_nhwc)
    split = next(op for op in g.ops if op.opcode == "SPLIT")
    assert int(split.inputs[0].data) == 3
    assert len(transposes(g)) == 3  # the input one, and one before each NCHW output


def test_softmax_over_a_moved_axis_blocks_sinking_but_stays_correct():
    def build(b):
        y = b.op("SOFTMAX", [b.conv_nchw(b.input((1, 3, 4, 5)), 4)], {"beta": 1.0})
        return b.output(b.conv_nchw(y, 2))

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) == 4  # nothing to cancel: softmax's axis is W in NCHW


def test_tensor_read_in_both_layouts_and_as_graph_output():
    def build(b):
        y = b.op("RELU", [b.conv_nchw(b.input((1, 2, 4, 4)), 3)])
        flat = b.reshape(y, (1, 48))
        return b.output(y, flat, b.conv_nchw(y, 2))

    g = check_pass(build, to_nhwc)
    assert g.outputs[0].shape == (1, 3, 4, 4) and g.outputs[1].shape == (1, 48)


def test_binary_with_a_non_transposed_operand_is_left_alone():
    def build(b):
        x = b.input((1, 3, 4, 4))
        other = b.input((1, 4, 4, 4))
        y = b.op("ADD", [b.conv_nchw(x, 4), other])
        return b.output(b.conv_nchw(y, 2))

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) == 4


def test_fan_out_that_would_add_transposes_is_undone_but_chains_still_cancel():
    def build(b):
        y = b.conv_nchw(b.input((1, 3, 4, 4)), 4)
        chain = b.conv_nchw(b.op("RELU", [b.conv_nchw(y, 4)]), 2)
        return b.output(b.op("RELU", [y]), b.op("TANH", [y]), chain)

    g = check_pass(build, to_nhwc)
    # input, y back to NCHW for RELU and TANH, chain output; relu->conv pair cancelled
    assert len(transposes(g)) == 3


def test_consecutive_transposes_compose_and_identities_vanish():
    def build(b):
        x = b.input((2, 3, 4, 5))
        y = b.transpose(b.transpose(x, [0, 2, 1, 3]), [3, 1, 2, 0])
        z = b.transpose(b.transpose(b.op("NEG", [x]), [1, 0, 2, 3]), [1, 0, 2, 3])
        return b.output(y, b.op("ABS", [z]))

    g = check_pass(build, to_nhwc)
    ts = transposes(g)
    assert len(ts) == 1 and ts[0].inputs[0] is g.inputs[0]
    assert perm_of(ts[0]) == [3, 2, 1, 0]


def test_transpose_moving_only_unit_dims_becomes_reshape():
    def build(b):
        x = b.input((4, 1, 6, 1))
        return b.output(b.op("NEG", [b.transpose(x, [0, 2, 3, 1])]))

    g = check_pass(build, to_nhwc)
    assert histogram(g) == {"RESHAPE": 1, "NEG": 1}


def test_dynamic_batch_signature_is_permuted():
    b = GraphBuilder()
    x = b.input((1, 3, 4, 4), signature=(-1, 3, 4, 4))
    y = b.conv_nchw(x, 4)
    y.shape_signature = (-1, 4, 4, 4)
    g = b.output(b.op("RELU", [y]))
    g.outputs[0].shape_signature = (-1, 4, 4, 4)
    to_nhwc(g)
    relu = next(op for op in g.ops if op.opcode == "RELU")
    assert relu.outputs[0].shape_signature == (-1, 4, 4, 4)
    assert relu.outputs[0].shape == (1, 4, 4, 4)
    assert g.outputs[0].shape_signature == (-1, 4, 4, 4)


def conv1d_nchw(b, x, out_channels, k=3):
    """conv1d as lowering emits it: (N, C, L) -> (N, C, 1, L), the 2-D wrapper, and back."""
    n, c, length = x.shape
    y = b.conv_nchw(b.reshape(x, (n, c, 1, length)), out_channels, k=k)
    return b.reshape(y, (n, out_channels, length))


@pytest.mark.parametrize("batch", [1, 2])
def test_one_d_convolutions_lifted_to_two_d_cancel_through_reshapes(batch):
    def build(b):
        x = b.input((batch, 4, 12))
        y = b.op("RELU", [conv1d_nchw(b, x, 6)])
        y = b.op("MUL", [y, b.const(np.linspace(0.5, 1.5, 6).reshape(6, 1))])
        return b.output(conv1d_nchw(b, y, 3))

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) == 2


def test_channel_shuffle_stays_correct():
    def build(b):
        y = b.conv_nchw(b.input((1, 4, 5, 5)), 6)
        y = b.reshape(b.transpose(b.reshape(y, (1, 2, 3, 5, 5)), [0, 2, 1, 3, 4]), (1, 6, 5, 5))
        return b.output(b.conv_nchw(y, 2))

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) <= 4


def test_attention_head_split_keeps_its_transposes_and_values():
    def build(b):
        x = b.input((2, 5, 8))
        heads = b.transpose(b.reshape(x, (2, 5, 2, 4)), [0, 2, 1, 3])
        scores = b.op("SOFTMAX", [b.op("MUL", [heads, b.const(0.5)])], {"beta": 1.0})
        merged = b.reshape(b.transpose(scores, [0, 2, 1, 3]), (2, 5, 8))
        return b.output(merged)

    g = check_pass(build, to_nhwc)
    assert len(transposes(g)) <= 2
