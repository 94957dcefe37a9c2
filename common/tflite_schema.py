"""Names from the LiteRT flatbuffer schema, in one place.

The codes come from the schema module that ships in `ai-edge-litert`
(`schema_py_generated`); this module turns them into the name tables every layer needs
(writer, verifier, model view, bench, CLI) and defines the named op groups the passes and
target rewrites share. Nothing here knows about our IR.
"""

from __future__ import annotations

import functools

import numpy as np
from ai_edge_litert import schema_py_generated as schema


def _members(enum_class) -> dict[str, int]:
    return {k: v for k, v in vars(enum_class).items() if not k.startswith("_")}


# Builtin op name <-> code ("CONV_2D" <-> 3).
BUILTIN_CODES: dict[str, int] = _members(schema.BuiltinOperator)
BUILTIN_NAMES: dict[int, str] = {v: k for k, v in BUILTIN_CODES.items()}

# TensorType name <-> code ("FLOAT32" <-> 0).
TENSOR_TYPE_CODES: dict[str, int] = _members(schema.TensorType)
TENSOR_TYPE_NAMES: dict[int, str] = {v: k for k, v in TENSOR_TYPE_CODES.items()}

# numpy dtype -> TensorType name, for every dtype a tensor of ours can hold.
DTYPE_TYPE_NAMES: dict[np.dtype, str] = {
    np.dtype(np.float32): "FLOAT32",
    np.dtype(np.float16): "FLOAT16",
    np.dtype(np.float64): "FLOAT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.complex64): "COMPLEX64",
}
# numpy dtype -> TensorType code.
DTYPE_TYPE_CODES: dict[np.dtype, int] = {d: TENSOR_TYPE_CODES[n] for d, n in DTYPE_TYPE_NAMES.items()}


def builtin_name(code: int) -> str:
    """The builtin's schema name, or "#<code>" for a code this schema does not know."""
    return BUILTIN_NAMES.get(code, f"#{code}")


def opcode_name(builtin_code: int, deprecated_builtin_code: int) -> str:
    """The name of an OperatorCode from its two code fields (codes of 127 and above live
    only in `builtin_code`; old files only fill `deprecated_builtin_code`)."""
    return builtin_name(max(builtin_code, deprecated_builtin_code))


def tensor_type_name(dtype) -> str:
    """TensorType name of a numpy dtype ("FLOAT32"); KeyError for dtypes LiteRT lacks."""
    return DTYPE_TYPE_NAMES[np.dtype(dtype)]


@functools.cache
def enum_names(enum: str) -> dict[int, str]:
    """code -> member name of any schema enum, by the enum's name ("Padding")."""
    return {v: k for k, v in _members(getattr(schema, enum)).items()}


def enum_max(enum: str) -> int:
    """The largest code of a schema enum (codes above it are not in this schema)."""
    return max(_members(getattr(schema, enum)).values())


# The largest tensor (in bytes) a model may declare: beyond it, size arithmetic in the
# runtime overflows.
MAX_TENSOR_BYTES = 2**62


# ---- named op groups ---------------------------------------------------------------------

# Builtins whose kernels accept -1 ("no tensor") for some inputs after the first (a bias,
# LSTM peepholes, auxiliary inputs...). Anywhere else, -1 reaches kernels that dereference
# it: a SignatureRunner segfaults allocating a TANH whose input is -1 (ai-edge-litert 2.3.0).
OPTIONAL_INPUT_OPS = frozenset(
    {
        "FULLY_CONNECTED",
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "TRANSPOSE_CONV",
        "CONV_3D",
        "CONV_3D_TRANSPOSE",
        "LSTM",
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        "BIDIRECTIONAL_SEQUENCE_LSTM",
        "BIDIRECTIONAL_SEQUENCE_RNN",
        "UNIDIRECTIONAL_SEQUENCE_RNN",
        "RNN",
        "SVDF",
        "LSH_PROJECTION",
        "CUSTOM",
    }
)

# out = f(x) elementwise; the op's other inputs (if any) are not tensors in the layout.
UNARY = frozenset(
    {
        "ABS",
        "CEIL",
        "COS",
        "DEQUANTIZE",
        "ELU",
        "EXP",
        "FLOOR",
        "GELU",
        "HARD_SWISH",
        "LEAKY_RELU",
        "LOG",
        "LOGICAL_NOT",
        "LOGISTIC",
        "NEG",
        "QUANTIZE",
        "RELU",
        "RELU6",
        "RELU_0_TO_1",
        "RELU_N1_TO_1",
        "ROUND",
        "RSQRT",
        "SIGN",
        "SIN",
        "SQRT",
        "SQUARE",
        "TANH",
        "CAST",
        "ZEROS_LIKE",
    }
)

# out = f(a, b, ...) with numpy broadcasting over all inputs.
BROADCASTING = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "MAXIMUM",
        "MINIMUM",
        "POW",
        "SQUARED_DIFFERENCE",
        "FLOOR_DIV",
        "FLOOR_MOD",
        "LESS",
        "LESS_EQUAL",
        "GREATER",
        "GREATER_EQUAL",
        "EQUAL",
        "NOT_EQUAL",
        "LOGICAL_AND",
        "LOGICAL_OR",
        "PRELU",
        "SELECT_V2",
        "ADD_N",
        "ATAN2",
    }
)

# Ops reducing over a constant list of axes (input 1), with option keepDims.
REDUCTIONS = frozenset(
    {
        "MEAN",
        "SUM",
        "REDUCE_MAX",
        "REDUCE_MIN",
        "REDUCE_PROD",
        "REDUCE_ANY",
        "REDUCE_ALL",
    }
)

# Ops working along the last axis only.
LAST_AXIS = frozenset({"SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION"})

PADS = frozenset({"PAD", "PADV2", "MIRROR_PAD"})

# Ops that run other subgraphs.
CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL", "CALL_ONCE", "STABLEHLO_COMPOSITE"})

# Ops whose effect is not visible in their outputs: never removed, folded or merged.
SIDE_EFFECT_OPS = frozenset(
    {
        "ASSIGN_VARIABLE",
        "READ_VARIABLE",
        "VAR_HANDLE",
        "CALL_ONCE",
        "CUSTOM",
        "WHILE",
        "IF",
        "CALL",
        "STABLEHLO_COMPOSITE",
        "RANDOM_STANDARD_NORMAL",
        "RANDOM_UNIFORM",
        "MULTINOMIAL",
    }
)

# Ops computing element by element on same-shape operands: any reshape commutes with them.
ELEMENTWISE_SAME_SHAPE = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "MAXIMUM",
        "MINIMUM",
        "POW",
        "SQUARED_DIFFERENCE",
        "ABS",
        "NEG",
        "EXP",
        "LOG",
        "SQRT",
        "RSQRT",
        "SQUARE",
        "SIN",
        "COS",
        "TANH",
        "LOGISTIC",
        "RELU",
        "RELU6",
        "LEAKY_RELU",
        "ELU",
        "HARD_SWISH",
        "GELU",
        "FLOOR",
        "CEIL",
        "ROUND",
        "SIGN",
        "CAST",
    }
)

# Fused activation enum, code -> name (ops may carry either form in our IR).
ACTIVATION_NAMES: dict[int, str] = enum_names("ActivationFunctionType")
