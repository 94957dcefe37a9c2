"""Minimum TFLite op versions and the runtime version each one needs.

The writer stamps every OperatorCode with the LOWEST version whose kernel supports the
features the op actually uses. A version that is too high fails to load on runtimes
that do not register it (ai-edge-litert 2.3.0 rejects FULLY_CONNECTED v20), and a
needlessly high one locks out older runtimes. The rules follow the facts of LiteRT's
`tools/versioning/op_version.cc` for the features this converter can emit (input types,
fused activations, dilation, per-channel quantization, rank > 4, omitted bias ...);
an op without a rule here is version 1.

`MIN_RUNTIME` lists, per op, the first LiteRT/TFLite release that runs each version
(from LiteRT's `runtime_version.cc`); the model's `min_runtime_version` metadata is the
highest of them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from converter.ir import Op, Tensor

_RULES: dict[str, Callable[[Op], int]] = {}


def _rule(*opcodes: str):
    def register(fn):
        for opcode in opcodes:
            _RULES[opcode] = fn
        return fn

    return register


def op_version(op: Op) -> int:
    """The minimum version of `op` (1 when no rule applies)."""
    rule = _RULES.get(op.opcode)
    return rule(op) if rule is not None else 1


# ---- helpers: the facts a rule looks at ------------------------------------------------------


def _dtype(op: Op, i: int, outputs: bool = False) -> np.dtype | None:
    tensors = op.outputs if outputs else op.inputs
    if i >= len(tensors) or tensors[i] is None:
        return None
    return tensors[i].dtype


def _is(op: Op, i: int, *types, outputs: bool = False) -> bool:
    """Whether tensor `i` has one of `types`, numpy scalar types (np.int8 ...)."""
    dt = _dtype(op, i, outputs)
    return dt is not None and dt.type in types  # (an np.dtype per comparison cost 0.25 ms a model)


def _in(op, i, *types):
    return _is(op, i, *types)


def _out(op, i, *types):
    return _is(op, i, *types, outputs=True)


def _rank(t: Tensor | None) -> int:
    return 0 if t is None else t.rank


def _per_channel(t: Tensor | None) -> bool:
    return t is not None and t.quant is not None and np.size(t.quant.scale) > 1


def _broadcast_over_4d(op: Op) -> bool:
    """Binary op that needs broadcasting with an input of rank > 4."""
    a, b = (op.inputs + [None, None])[:2]
    if a is None or b is None:
        return False
    return a.shape != b.shape and max(a.rank, b.rank) > 4


def _opt(op: Op, key: str, default=None):
    return op.options.get(key, default)


_F32, _I8, _U8, _I16, _I32, _I64, _BOOL, _F16 = (
    np.float32,
    np.int8,
    np.uint8,
    np.int16,
    np.int32,
    np.int64,
    np.bool_,
    np.float16,
)


# ---- rules ----------------------------------------------------------------------------------


@_rule("CONV_2D")
def _conv_2d(op: Op) -> int:
    x, w = op.inputs[0], op.inputs[1]
    if x is not None and w is not None and x.rank == 4 and w.rank == 4 and x.shape[3] != w.shape[3]:
        return 6  # grouped convolution (input channels != filter channels)
    if _in(op, 0, _I16) and _in(op, 1, _I16):
        return 4
    if _in(op, 0, _I8) and _in(op, 1, _I8) and _out(op, 0, _I8):
        return 3
    if _in(op, 0, _F32) and _in(op, 1, _I8) and _out(op, 0, _F32):
        return 5 if _per_channel(w) else 2  # hybrid
    return 1


@_rule("DEPTHWISE_CONV_2D")
def _depthwise_conv_2d(op: Op) -> int:
    if _in(op, 0, _I16) and _in(op, 1, _I16):
        return 5
    if _in(op, 0, _F32) and _in(op, 1, _I8) and _out(op, 0, _F32):
        return 6 if _per_channel(op.inputs[1]) else 4
    if _in(op, 0, _I8) and _in(op, 1, _I8) and _out(op, 0, _I8):
        return 3
    if _opt(op, "dilationWFactor", 1) != 1 or _opt(op, "dilationHFactor", 1) != 1:
        return 2
    return 1


@_rule("FULLY_CONNECTED")
def _fully_connected(op: Op) -> int:
    if _in(op, 0, _F32) and _in(op, 1, _I8) and _out(op, 0, _F32) and _per_channel(op.inputs[1]):
        return 12
    if _in(op, 0, _I16) and _in(op, 1, _I16) and _out(op, 0, _I16):
        return 7
    if len(op.inputs) == 2:
        return 6  # no bias input at all (an omitted bias written as -1 still counts)
    if _opt(op, "keepNumDims", False):
        return 5
    if _in(op, 0, _I8) and _in(op, 1, _I8) and _out(op, 0, _I8):
        return 4
    if _in(op, 0, _F32) and _in(op, 1, _I8) and _out(op, 0, _F32):
        return 9 if _opt(op, "asymmetricQuantizeInputs", False) else 3
    if _opt(op, "weightsFormat", "DEFAULT") not in ("DEFAULT", 0):
        return 2
    return 1


@_rule("GATHER")
def _gather(op: Op) -> int:
    if _in(op, 1, _I16):
        return 6
    if _opt(op, "batchDims", 0) != 0:
        return 5
    if _in(op, 0, _I16):
        return 4
    if _in(op, 0, _BOOL):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("MUL")
def _mul(op: Op) -> int:
    if _in(op, 0, _I16) and op.inputs[0].quant is None:
        return 7
    if _in(op, 0, np.complex64):
        return 6
    if _in(op, 0, _I64):
        return 5
    if _in(op, 0, _I16):
        return 4
    return 2 if _in(op, 0, _I8) else 1


@_rule("ADD")
def _add(op: Op) -> int:
    if _in(op, 0, _I16) and op.inputs[0].quant is None:
        return 5
    if _in(op, 0, _I64):
        return 4
    if _in(op, 0, _I16) and _out(op, 0, _I16) and not _opt(op, "potScaleInt16", True):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("SUB")
def _sub(op: Op) -> int:
    if _in(op, 0, _I16) and _out(op, 0, _I16) and not _opt(op, "potScaleInt16", True):
        return 5
    if _in(op, 0, _I64):
        return 4
    if _broadcast_over_4d(op):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("DIV")
def _div(op: Op) -> int:
    return 2 if _broadcast_over_4d(op) else 1


@_rule("MAXIMUM", "MINIMUM")
def _maximum_minimum(op: Op) -> int:
    if _in(op, 0, _I16) and _out(op, 0, _I16):
        return 4
    if _broadcast_over_4d(op):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("MAX_POOL_2D", "AVERAGE_POOL_2D")
def _pool_2d(op: Op) -> int:
    if _in(op, 0, _I16) and _out(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("TRANSPOSE")
def _transpose(op: Op) -> int:
    rank = _rank(op.inputs[0])
    if rank > 5:
        return 6
    if _in(op, 0, _I16):
        return 5
    if rank > 4:
        return 4
    if _in(op, 0, _BOOL):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("TRANSPOSE_CONV")
def _transpose_conv(op: Op) -> int:
    if _opt(op, "fusedActivationFunction", "NONE") not in ("NONE", 0):
        return 4
    if len(op.inputs) == 4 and op.inputs[3] is not None:
        return 3  # with bias
    return 2 if _in(op, 1, _I8) else 1


@_rule("SLICE")
def _slice(op: Op) -> int:
    if _in(op, 0, np.uint32):
        return 6
    if _rank(op.inputs[0]) > 4:
        return 5
    if _in(op, 0, _I16):
        return 4
    return 2 if _in(op, 0, _I8) else 1


@_rule("STRIDED_SLICE")
def _strided_slice(op: Op) -> int:
    if _opt(op, "offset", False):
        return 8
    if _in(op, 0, np.uint32):
        return 7
    if _opt(op, "ellipsisMask", 0) or _opt(op, "newAxisMask", 0):
        return 6
    if _rank(op.inputs[0]) > 4:
        return 4
    if _in(op, 0, _BOOL):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("PAD", "PADV2")
def _pad(op: Op) -> int:
    if _in(op, 0, _BOOL):
        return 5
    if _rank(op.inputs[0]) > 4:
        return 4
    if _in(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("CONCATENATION")
def _concatenation(op: Op) -> int:
    if _in(op, 0, np.uint32):
        return 4
    if _in(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("SOFTMAX", "MEAN", "MIRROR_PAD", "REDUCE_MAX", "REDUCE_MIN", "RELU6", "RSQRT")
def _int8_2_int16_3(op: Op) -> int:
    if _in(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule(
    "SPACE_TO_DEPTH", "SPLIT_V", "SUM", "LOG_SOFTMAX", "GREATER", "LESS_EQUAL", "SQUARED_DIFFERENCE", "DEPTH_TO_SPACE"
)
def _int8_2(op: Op) -> int:
    return 2 if _in(op, 0, _I8) else 1


@_rule("LESS", "GREATER_EQUAL", "TANH", "LOGISTIC")
def _int8_2_int16_3_strict(op: Op) -> int:
    if _in(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("RELU")
def _relu(op: Op) -> int:
    if _in(op, 0, _I16):
        return 3
    return 2 if _in(op, 0, _I8, _U8) else 1


@_rule("LEAKY_RELU")
def _leaky_relu(op: Op) -> int:
    return 2 if _in(op, 0, _I16) else 1


@_rule("GELU")
def _gelu(op: Op) -> int:
    return 2 if _in(op, 0, _I8, _U8) else 1


@_rule("EXP", "LOG", "REDUCE_PROD")
def _exp_log(op: Op) -> int:
    return 2 if _in(op, 0, _I8, _I16) else 1


@_rule("RESIZE_BILINEAR")
def _resize_bilinear(op: Op) -> int:
    if _in(op, 0, _I16):
        return 4
    if _opt(op, "halfPixelCenters", False):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("RESIZE_NEAREST_NEIGHBOR")
def _resize_nearest(op: Op) -> int:
    if _in(op, 0, _I16):
        return 4
    if _opt(op, "halfPixelCenters", False) or _opt(op, "alignCorners", False):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("BATCH_MATMUL")
def _batch_matmul(op: Op) -> int:
    if _in(op, 0, _I16):
        return 3
    if _in(op, 0, _I8):
        return 2
    if _in(op, 0, _F32) and _in(op, 1, _I8) and _opt(op, "asymmetricQuantizeInputs", False):
        return 4
    return 1


@_rule("SPLIT")
def _split(op: Op) -> int:  # the data is input 1 (input 0 is the axis)
    if _in(op, 1, _I16):
        return 4
    if _in(op, 1, _I32):
        return 3
    return 2 if _in(op, 1, _I8) else 1


@_rule("PACK")
def _pack(op: Op) -> int:
    if _in(op, 0, _I8):
        return 2
    if _in(op, 0, _I16) and _out(op, 0, _I16):
        return 3
    return 4 if _in(op, 0, np.uint32) else 1


@_rule("UNPACK")
def _unpack(op: Op) -> int:
    if _in(op, 0, _I8, _U8):
        return 2
    if _in(op, 0, _BOOL):
        return 3
    return 4 if _in(op, 0, _I16) and _out(op, 0, _I16) else 1


@_rule("TILE")
def _tile(op: Op) -> int:
    return 3 if _in(op, 0, _I8) else 1


@_rule("SELECT")
def _select(op: Op) -> int:
    if _in(op, 0, np.uint32):
        return 4
    if any(_rank(t) == 5 for t in op.inputs[:3]):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("SELECT_V2")
def _select_v2(op: Op) -> int:
    return 2 if _in(op, 0, np.uint32) else 1


@_rule("EQUAL")
def _equal(op: Op) -> int:
    if _in(op, 0, _I16):
        return 4
    return 2 if _in(op, 0, _I8) else 1


@_rule("NOT_EQUAL", "ARG_MAX", "ARG_MIN")
def _not_equal_arg(op: Op) -> int:
    if op.opcode != "NOT_EQUAL" and _in(op, 0, _BOOL):
        return 3
    return 2 if _in(op, 0, _I8) else 1


@_rule("CAST")
def _cast(op: Op) -> int:
    def either(*types):
        return _in(op, 0, *types) or _out(op, 0, *types)

    if either(np.float64, _F16):
        return 5
    if either(np.uint16):
        return 4
    if either(_I8):
        return 3
    return 2 if either(np.uint32) else 1


@_rule("ABS")
def _abs(op: Op) -> int:
    if _in(op, 0, _I32):
        return 5
    if _in(op, 0, _I16):
        return 3 if op.inputs[0].quant is not None else 4
    return 2 if _in(op, 0, _I8, _U8) else 1


@_rule("SIGN")
def _sign(op: Op) -> int:
    return 2 if _in(op, 0, _I32) else 1


@_rule("DEQUANTIZE")
def _dequantize(op: Op) -> int:
    if _in(op, 0, _I16, _F16):
        return 3
    if _in(op, 0, _I8):
        return 5 if _per_channel(op.inputs[0]) else 2
    return 1


@_rule("QUANTIZE")
def _quantize(op: Op) -> int:
    if _per_channel(op.outputs[0]):
        return 3
    return 2 if _out(op, 0, _I16) else 1


@_rule("FILL")
def _fill(op: Op) -> int:
    if _in(op, 1, _F16):
        return 4
    if _in(op, 1, _I8, _I16):
        return 3
    return 2 if _in(op, 1, _BOOL) else 1


@_rule("FLOOR_DIV")
def _floor_div(op: Op) -> int:
    if _in(op, 0, _I16, _I8):
        return 3
    return 2 if _in(op, 0, _F32) else 1


@_rule("FLOOR_MOD")
def _floor_mod(op: Op) -> int:
    return 2 if _in(op, 0, _I16, _I8) else 1


@_rule("RANGE")
def _range(op: Op) -> int:
    return 2 if _in(op, 0, _I64) else 1


@_rule("BROADCAST_TO")
def _broadcast_to(op: Op) -> int:
    return 3 if _in(op, 0, _I8, _I16) else 2  # version 1 was withdrawn


@_rule("WHERE")
def _where(op: Op) -> int:
    return 1 if _in(op, 0, _BOOL) else 2


@_rule("REVERSE_V2")
def _reverse_v2(op: Op) -> int:
    if _in(op, 0, _I8):
        return 3
    return 2 if _in(op, 0, _BOOL) else 1


@_rule("SQUEEZE")
def _squeeze(op: Op) -> int:
    return 1


@_rule("GATHER_ND")
def _gather_nd(op: Op) -> int:
    if _in(op, 0, _BOOL):
        return 5
    if _in(op, 1, _I16):
        return 4
    return 3 if _in(op, 0, _I16) else 1


@_rule("EMBEDDING_LOOKUP")
def _embedding_lookup(op: Op) -> int:
    return 4 if _per_channel(op.inputs[1] if len(op.inputs) > 1 else None) else 1


@_rule("DYNAMIC_UPDATE_SLICE")
def _dynamic_update_slice(op: Op) -> int:
    if _in(op, 0, _I16):
        return 4
    if _in(op, 0, _F16):
        return 3
    return 2 if _in(op, 2, _I64) else 1


@_rule("SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND")
def _space_batch(op: Op) -> int:
    if _in(op, 0, _I16):
        return 4
    if _rank(op.inputs[0]) != 4:
        return 3
    return 2 if _in(op, 0, _I8) else 1


# ---- minimum runtime ----------------------------------------------------------------------------

# op -> runtime release needed by version 1, 2, 3 ... (index = version - 1).
MIN_RUNTIME: dict[str, tuple[str, ...]] = {
    "ABS": ("1.13.0", "2.4.0", "2.5.0", "2.6.0", "2.12.0"),
    "ADD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0", "2.13.0"),
    "ADD_N": ("1.14.0",),
    "ARG_MAX": ("1.9.0", "1.14.0", "2.9.0"),
    "ARG_MIN": ("1.9.0", "1.14.0", "2.9.0"),
    "AVERAGE_POOL_2D": ("1.5.0", "1.14.0", "2.3.0"),
    "BATCH_MATMUL": ("2.3.0", "2.3.0", "2.4.0", "2.5.0"),
    "BATCH_TO_SPACE_ND": ("1.6.0", "1.14.0", "2.3.0", "2.12.0"),
    "BROADCAST_TO": ("2.5.0", "2.5.0", "2.5.0"),
    "CAST": ("1.5.0", "2.7.0", "2.8.0", "2.9.0", "2.12.0", "2.15.0", "2.17.0"),
    "CEIL": ("1.14.0",),
    "CONCATENATION": ("1.5.0", "1.14.0", "2.3.0", "2.14.0"),
    "CONV_2D": ("1.5.0", "1.14.0", "1.14.0", "2.3.0", "2.4.0", "2.9.0", "2.11.0", "2.15.0"),
    "CONV_3D": ("2.5.0",),
    "CONV_3D_TRANSPOSE": ("2.6.0",),
    "COS": ("1.14.0",),
    "CUMSUM": ("2.4.0",),
    "DEPTH_TO_SPACE": ("2.1.0", "2.5.0"),
    "DEPTHWISE_CONV_2D": ("1.5.0", "1.12.0", "1.14.0", "2.2.0", "2.3.0", "2.3.0", "2.11.0"),
    "DEQUANTIZE": ("1.13.1", "1.14.0", "1.15.0", "2.2.0", "2.7.0", "2.18.0"),
    "DIV": ("1.6.0", "2.3.0"),
    "DYNAMIC_UPDATE_SLICE": ("2.9.0", "2.17.0", "2.19.0", "2.20.0"),
    "ELU": ("1.14.0",),
    "EMBEDDING_LOOKUP": ("1.13.0", "1.14.0", "1.14.0", "2.18.0"),
    "EQUAL": ("1.14.0", "1.14.0", "2.3.0", "2.13.0"),
    "EXP": ("1.7.0", "2.12.0"),
    "EXPAND_DIMS": ("1.10.0",),
    "FILL": ("1.13.0", "2.3.0", "2.5.0", "2.12.0"),
    "FLOOR": ("1.9.0",),
    "FLOOR_DIV": ("1.14.0", "1.14.0", "2.13.0"),
    "FLOOR_MOD": ("1.13.0", "2.13.0"),
    "FULLY_CONNECTED": (
        "1.5.0",
        "1.10.0",
        "1.14.0",
        "1.14.0",
        "2.0.0",
        "2.1.0",
        "2.3.0",
        "2.3.0",
        "2.3.0",
        "2.11.0",
        "2.15.0",
        "2.17.0",
        "2.18.0",
    ),
    "GATHER": ("1.6.0", "1.14.0", "1.15.0", "2.4.0", "2.5.0", "2.13.0", "2.15.0"),
    "GATHER_ND": ("1.14.0", "2.3.0", "2.5.0", "2.13.0", "2.16.0"),
    "GELU": ("2.9.0", "2.9.0"),
    "GREATER": ("1.14.0", "1.14.0"),
    "GREATER_EQUAL": ("1.14.0", "1.14.0", "2.13.0"),
    "HARD_SWISH": ("1.15.0",),
    "L2_NORMALIZATION": ("1.5.0", "1.14.0"),
    "LEAKY_RELU": ("1.13.1", "2.3.0"),
    "LESS": ("1.14.0", "1.14.0", "2.13.0"),
    "LESS_EQUAL": ("1.14.0", "1.14.0"),
    "LOG": ("1.14.0", "2.15.0"),
    "LOG_SOFTMAX": ("1.14.0", "1.14.0"),
    "LOGICAL_AND": ("1.11.0",),
    "LOGICAL_NOT": ("1.11.0",),
    "LOGICAL_OR": ("1.11.0",),
    "LOGISTIC": ("1.14.0", "1.14.0", "2.3.0"),
    "MAX_POOL_2D": ("1.5.0", "1.14.0", "2.3.0"),
    "MAXIMUM": ("1.14.0", "1.14.0", "2.3.0", "2.3.0"),
    "MEAN": ("1.6.0", "1.14.0", "2.4.0"),
    "MINIMUM": ("1.14.0", "1.14.0", "2.3.0", "2.3.0"),
    "MIRROR_PAD": ("1.13.1", "2.3.0", "2.12.0"),
    "MUL": ("1.5.0", "1.14.0", "1.15.0", "2.3.0", "2.6.0", "2.11.0", "2.13.0"),
    "NEG": ("1.9.0",),
    "NOT_EQUAL": ("1.14.0", "1.14.0", "2.3.0"),
    "PACK": ("1.11.0", "1.14.0", "2.3.0", "2.13.0"),
    "PAD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0"),
    "PADV2": ("1.9.0", "1.14.0", "2.4.0", "2.6.0"),
    "POW": ("1.10.0",),
    "PRELU": ("1.8.0",),
    "QUANTIZE": ("1.14.0", "1.15.0", "2.7.0"),
    "RANGE": ("1.13.0", "2.14.0"),
    "REDUCE_ALL": ("2.6.0",),
    "REDUCE_ANY": ("1.11.0",),
    "REDUCE_MAX": ("1.11.0", "1.14.0", "2.5.0"),
    "REDUCE_MIN": ("1.11.0", "1.14.0", "2.5.0"),
    "REDUCE_PROD": ("1.11.0", "2.6.0"),
    "RELU": ("1.5.0", "2.1.0", "2.5.0"),
    "RELU6": ("1.5.0", "1.14.0", "2.5.0"),
    "RELU_0_TO_1": ("2.10.0",),
    "RELU_N1_TO_1": ("1.5.0",),
    "RESHAPE": ("1.5.0",),
    "RESIZE_BILINEAR": ("1.7.0", "1.14.0", "2.2.0", "2.5.0"),
    "RESIZE_NEAREST_NEIGHBOR": ("1.13.1", "1.14.0", "2.3.0", "2.4.0"),
    "REVERSE_V2": ("1.14.0", "2.2.0", "2.5.0"),
    "ROUND": ("1.14.0",),
    "RSQRT": ("1.10.0", "2.5.0", "2.15.0"),
    "SELECT": ("1.14.0", "1.14.0", "2.12.0", "2.12.0"),
    "SELECT_V2": ("2.2.0", "2.12.0"),
    "SHAPE": ("1.10.0",),
    "SIGN": ("2.11.0", "2.12.0"),
    "SIN": ("1.9.0",),
    "SLICE": ("1.14.0", "1.14.0", "1.14.0", "2.4.0", "2.5.0", "2.14.0"),
    "SOFTMAX": ("1.5.0", "1.14.0", "2.3.0"),
    "SPACE_TO_BATCH_ND": ("1.6.0", "1.14.0", "2.3.0", "2.12.0"),
    "SPACE_TO_DEPTH": ("1.5.0", "1.14.0"),
    "SPLIT": ("1.5.0", "1.14.0", "1.14.0", "2.3.0"),
    "SPLIT_V": ("1.13.1", "2.3.0"),
    "SQRT": ("1.10.0",),
    "SQUARE": ("1.12.0",),
    "SQUARED_DIFFERENCE": ("1.13.1", "2.5.0"),
    "SQUEEZE": ("1.6.0", "2.5.0"),
    "STRIDED_SLICE": ("1.6.0", "1.14.0", "2.1.0", "2.2.0", "2.5.0", "2.6.0", "2.14.0", "2.14.0"),
    "SUB": ("1.6.0", "1.14.0", "2.3.0", "2.4.0", "2.4.0"),
    "SUM": ("1.10.0", "1.15.0"),
    "TANH": ("1.14.0", "1.14.0", "2.3.0"),
    "TILE": ("1.10.1", "2.2.0", "2.8.0"),
    "TOPK_V2": ("1.7.0", "1.14.0", "2.13.0"),
    "TRANSPOSE": ("1.6.0", "1.14.0", "1.15.0", "2.3.0", "2.4.0", "2.12.0", "2.14.4"),
    "TRANSPOSE_CONV": ("1.9.0", "2.2.0", "2.3.0", "2.13.0", "2.15.0"),
    "UNPACK": ("1.11.0", "1.14.0", "2.2.0", "2.3.0"),
    "WHERE": ("1.14.0", "2.8.0"),
    "ZEROS_LIKE": ("1.12.0",),
}


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def min_runtime_version(opcodes_and_versions) -> str:
    """The highest runtime release any (opcode, version) pair needs; pairs not in the
    table are skipped, as LiteRT's own tool does. Empty string when none is known."""
    best = ""
    for opcode, version in opcodes_and_versions:
        releases = MIN_RUNTIME.get(opcode, ())
        if version - 1 >= len(releases):
            continue
        v = releases[version - 1]
        if not best or _version_key(v) > _version_key(best):
            best = v
    return best
