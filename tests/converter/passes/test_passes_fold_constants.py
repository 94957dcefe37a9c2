"""Constant folding: results equal numpy's/LiteRT's, and big broadcasts stay ops."""

import numpy as np
import pytest

from converter.passes import fold_constants
from converter.passes.fold_constants import SIZE_ALLOWANCE_BYTES
from tests.converter.passes.passes_helpers import GraphBuilder, check_pass, histogram


def test_weight_rearrangement_folds_into_one_constant():
    def build(b):
        x = b.input((1, 5, 5, 3))
        w = b.reshape(b.random((3, 3, 3 * 2)), (3, 3, 3, 2))
        w = b.transpose(w, [3, 0, 1, 2])  # HWIO -> OHWI, as lowering may emit
        y = b.op(
            "CONV_2D", [x, w, b.random((2,))], {"padding": "VALID", "strideH": 1, "strideW": 1}, shape=(1, 3, 3, 2)
        )
        return b.output(y)

    g = check_pass(build, fold_constants)
    assert histogram(g) == {"CONV_2D": 1}
    assert g.ops[0].inputs[1].is_const and g.ops[0].inputs[1].shape == (2, 3, 3, 3)


CASES = {
    "add_mul_neg": lambda b: b.op(
        "NEG", [b.op("MUL", [b.op("ADD", [b.const([1.0, 2.0]), b.const(3.0)]), b.const([2.0, 0.5])])]
    ),
    "div_rsqrt_sqrt_pow": lambda b: b.op(
        "POW", [b.op("DIV", [b.op("RSQRT", [b.const([4.0, 16.0])]), b.op("SQRT", [b.const([9.0, 1.0])])]), b.const(2.0)]
    ),
    "concat_pack": lambda b: b.op(
        "PACK",
        [
            b.op("CONCATENATION", [b.const([1, 2], np.int32), b.const([3], np.int32)], {"axis": 0}, shape=(3,)),
            b.const([4, 5, 6], np.int32),
        ],
        {"axis": 1, "valuesCount": 2},
        shape=(3, 2),
    ),
    "gather_slice": lambda b: b.op(
        "SLICE",
        [
            b.op(
                "GATHER", [b.const(np.arange(12.0).reshape(3, 4)), b.const([2, 0], np.int32)], {"axis": 0}, shape=(2, 4)
            ),
            b.const([0, 1], np.int32),
            b.const([-1, 2], np.int32),
        ],
        shape=(2, 2),
    ),
    "strided_slice_shrink": lambda b: b.op(
        "STRIDED_SLICE",
        [
            b.const(np.arange(24.0).reshape(2, 3, 4)),
            b.const([1, 0, 3], np.int32),
            b.const([2, 3, 0], np.int32),
            b.const([1, 2, -1], np.int32),
        ],
        {"shrinkAxisMask": 1, "endMask": 4},
        shape=(2, 4),
    ),
    "expand_squeeze_tile": lambda b: b.op(
        "TILE",
        [
            b.op(
                "SQUEEZE",
                [b.op("EXPAND_DIMS", [b.const([1.0, 2.0]), b.const(0, np.int32)], shape=(1, 2))],
                {"squeezeDims": [0]},
                shape=(2,),
            ),
            b.const([3], np.int32),
        ],
        shape=(6,),
    ),
    "fill_range_cast": lambda b: b.op(
        "ADD",
        [
            b.op(
                "CAST",
                [b.op("RANGE", [b.const(0, np.int32), b.const(6, np.int32), b.const(2, np.int32)], shape=(3,))],
                dtype=np.float32,
            ),
            b.op("FILL", [b.const([3], np.int32), b.const(0.5)], shape=(3,), dtype=np.float32),
        ],
    ),
    "broadcast_to_small": lambda b: b.op(
        "BROADCAST_TO", [b.const([1.0, 2.0]), b.const([3, 2], np.int32)], shape=(3, 2)
    ),
    "dequantize_fp16": lambda b: b.op("DEQUANTIZE", [b.const([1.5, -2.25], np.float16)], dtype=np.float32),
    "mean_keepdims": lambda b: b.op(
        "MEAN", [b.const(np.arange(6.0).reshape(2, 3)), b.const([1], np.int32)], {"keepDims": True}, shape=(2, 1)
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_values_match_litert(name):
    def build(b):
        x = b.input((1,))
        value = CASES[name](b)
        dtype_fix = value if value.dtype == np.float32 else b.op("CAST", [value], dtype=np.float32)
        return b.output(
            b.op(
                "ADD",
                [x, b.op("RESHAPE", [dtype_fix, b.const([-1], np.int32)], shape=(int(np.prod(value.shape)),))],
                shape=(int(np.prod(value.shape)),),
            )
        )

    g = check_pass(build, lambda g: fold_constants(g, fold_dequantize=True), rtol=1e-6, atol=1e-6)
    assert histogram(g) == {"ADD": 1}, str(g)


def test_dequantize_is_kept_by_default():
    b = GraphBuilder()
    x = b.input((2,))
    g = b.output(b.op("ADD", [x, b.op("DEQUANTIZE", [b.const([1.0, 2.0], np.float16)], dtype=np.float32)]))
    fold_constants(g)
    assert histogram(g) == {"DEQUANTIZE": 1, "ADD": 1}


def test_huge_broadcast_is_not_folded():
    n = SIZE_ALLOWANCE_BYTES  # n float32 elements: 4x the allowance
    b = GraphBuilder()
    x = b.input((n,))
    big = b.op("BROADCAST_TO", [b.const([1.0]), b.const([n], np.int32)], shape=(n,), dtype=np.float32)
    g = b.output(b.op("ADD", [x, big]))
    fold_constants(g)
    assert histogram(g) == {"BROADCAST_TO": 1, "ADD": 1}


def test_shape_of_a_static_activation_folds():
    def build(b):
        x = b.input((2, 3))
        shape = b.op("SHAPE", [b.op("RELU", [x])], {"outType": "INT32"}, shape=(2,), dtype=np.int32)
        return b.output(b.op("RESHAPE", [x, shape], shape=(2, 3)))

    g = check_pass(build, fold_constants)
    assert histogram(g) == {"RESHAPE": 1, "RELU": 1}


def test_graph_outputs_and_division_by_zero_are_left_alone():
    b = GraphBuilder()
    x = b.input((1,))
    out_const = b.op("ADD", [b.const([1.0]), b.const([2.0])])
    inf = b.op("RSQRT", [b.const([0.0])])
    g = b.output(out_const, b.op("ADD", [x, inf]))
    fold_constants(g)
    assert histogram(g) == {"ADD": 2, "RSQRT": 1}
