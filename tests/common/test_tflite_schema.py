"""One home for LiteRT schema names: codes and names agree with the schema module."""

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from common import tflite_schema
from common.tflite_schema import (
    BUILTIN_CODES,
    DTYPE_TYPE_CODES,
    builtin_name,
    enum_names,
    opcode_name,
    tensor_type_name,
)


def test_builtin_names_and_codes_round_trip():
    assert BUILTIN_CODES["GELU"] == schema.BuiltinOperator.GELU == 150
    assert builtin_name(150) == "GELU" and builtin_name(10_000) == "#10000"
    assert opcode_name(150, 127) == "GELU"  # codes above 127 live in builtin_code only
    assert opcode_name(0, 3) == "CONV_2D"  # old files fill deprecated_builtin_code only


def test_dtype_names_follow_the_schema():
    assert tensor_type_name(np.float32) == "FLOAT32" and tensor_type_name(np.bool_) == "BOOL"
    assert DTYPE_TYPE_CODES[np.dtype(np.int64)] == schema.TensorType.INT64
    assert enum_names("Padding")[schema.Padding.SAME] == "SAME"


def test_op_groups_name_real_builtins():
    groups = (
        "UNARY",
        "BROADCASTING",
        "REDUCTIONS",
        "LAST_AXIS",
        "PADS",
        "CONTROL_FLOW",
        "SIDE_EFFECT_OPS",
        "ELEMENTWISE_SAME_SHAPE",
    )
    for group in groups:
        unknown = getattr(tflite_schema, group) - set(BUILTIN_CODES)
        assert not unknown, f"{group} names no builtin {sorted(unknown)}"
