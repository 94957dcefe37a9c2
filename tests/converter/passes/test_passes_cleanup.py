"""Dead code, no-ops, shared constants, common subexpressions and PAD+conv folding."""

import numpy as np

from converter.passes import deduplicate_constants, fold_pad_into_conv, remove_dead_code, simplify_reshapes
from tests.converter.passes.passes_helpers import GraphBuilder, check_pass, histogram


def test_unused_ops_and_noops_are_removed():
    def build(b):
        x = b.input((2, 3))
        b.op("EXP", [x])  # unused
        same = b.reshape(b.op("CAST", [x], dtype=np.float32), (2, 3))  # no-op CAST and RESHAPE
        return b.output(b.op("NEG", [same]), b.reshape(x, (2, 3)))  # graph output: input itself

    g = check_pass(build, remove_dead_code)
    assert histogram(g) == {"NEG": 1, "RESHAPE": 1}
    assert g.ops[0].inputs[0] is g.inputs[0]


def test_equal_constants_share_one_tensor():
    b = GraphBuilder()
    x = b.input((3,))
    y = b.op("ADD", [x, b.const([1.0, 2.0, 3.0])])
    z = b.op("MUL", [y, b.const([1.0, 2.0, 3.0])])
    ints = b.const([1, 2, 3], np.int32)
    same_bytes_as_ints = b.const(ints.data.view(np.float32))  # other dtype: must stay apart
    g = b.output(b.op("SUB", [z, same_bytes_as_ints]), b.op("ADD", [b.op("CAST", [x], dtype=np.int32), ints]))
    deduplicate_constants(g)
    assert g.ops[0].inputs[1] is g.ops[1].inputs[1]
    assert g.ops[2].inputs[1] is not g.ops[4].inputs[1]


def test_identical_ops_on_identical_inputs_merge():
    def build(b):
        x = b.input((2, 4))
        q = b.op("FULLY_CONNECTED", [x, b.const(np.eye(4)), None], {"keepNumDims": False})
        k = b.op("FULLY_CONNECTED", [x, b.const(np.eye(4)), None], {"keepNumDims": False})
        other = b.op("FULLY_CONNECTED", [x, b.const(np.eye(4)), None], {"keepNumDims": True})
        return b.output(b.op("ADD", [b.op("RELU", [q]), b.op("RELU", [k])]), other)

    g = check_pass(build, deduplicate_constants)
    assert histogram(g) == {"FULLY_CONNECTED": 2, "RELU": 1, "ADD": 1}


def _pad_conv(b, pads, stride=1, value=None):
    x = b.input((1, 7, 7, 2))
    ph, pw = pads
    shape = (1, 7 + sum(ph), 7 + sum(pw), 2)
    inputs = [x, b.const([[0, 0], list(ph), list(pw), [0, 0]], np.int32)]
    if value is not None:
        inputs.append(b.const(value))
    padded = b.op("PADV2" if value is not None else "PAD", inputs, shape=shape)
    out = ((shape[1] - 3) // stride + 1, (shape[2] - 3) // stride + 1)
    return b.output(
        b.op(
            "CONV_2D",
            [padded, b.random((3, 3, 3, 2)), b.random((3,))],
            {"padding": "VALID", "strideH": stride, "strideW": stride},
            shape=(1, *out, 3),
        )
    )


def test_pad_equal_to_same_folds_into_the_conv():
    g = check_pass(lambda b: _pad_conv(b, ((1, 1), (1, 1))), fold_pad_into_conv)
    assert histogram(g) == {"CONV_2D": 1} and g.ops[0].options["padding"] == "SAME"
    # stride 2 on 7: SAME pads (1, 1) too
    g = check_pass(lambda b: _pad_conv(b, ((1, 1), (1, 1)), stride=2), fold_pad_into_conv)
    assert histogram(g) == {"CONV_2D": 1}


def test_pads_that_differ_from_same_stay():
    for build in (lambda b: _pad_conv(b, ((2, 0), (1, 1))), lambda b: _pad_conv(b, ((1, 1), (1, 1)), value=1.0)):
        g = check_pass(build, fold_pad_into_conv)
        assert len(g.ops) == 2


def test_reshape_chains_merge_and_identity_reshapes_vanish():
    def build(b):
        x = b.input((2, 3, 4))
        y = b.reshape(b.reshape(b.reshape(x, (6, 4)), (24,)), (2, 12))
        return b.output(b.op("NEG", [b.reshape(b.op("ABS", [y]), (2, 12))]))

    g = check_pass(build, simplify_reshapes)
    assert histogram(g) == {"RESHAPE": 1, "ABS": 1, "NEG": 1}
    assert g.ops[0].inputs[0] is g.inputs[0]


def test_keepdims_reduction_then_flatten_becomes_one_reduction():
    def build(b):
        x = b.input((2, 5, 5, 3))
        m = b.op("REDUCE_MAX", [x, b.const([1, 2], np.int32)], {"keepDims": True}, shape=(2, 1, 1, 3))
        shared = b.op("SUM", [x, b.const([1], np.int32)], {"keepDims": True}, shape=(2, 1, 5, 3))
        return b.output(b.reshape(m, (2, 3)), b.reshape(shared, (2, 15)))  # second drops no axis alone

    g = check_pass(build, simplify_reshapes)
    assert histogram(g) == {"REDUCE_MAX": 1, "SUM": 1, "RESHAPE": 1}
    assert g.ops[0].options["keepDims"] is False
