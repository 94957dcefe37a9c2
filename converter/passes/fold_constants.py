"""Constant folding: evaluate now, in numpy, every op whose inputs are all constant.

Lowering leaves weight rearrangements (TRANSPOSE/RESHAPE of a constant filter), shape
arithmetic and broadcast helpers as ops; folding them turns each into one constant
tensor. SHAPE of a statically shaped tensor folds too, whatever produces it.

Guarantees:
- a folded result equals what the op computes (numpy implementations below, one small
  function per op; the op's fused activation is applied);
- ops without a numpy implementation here, quantized ops, ops with side effects and
  ops producing a graph output are left as they are;
- size rule: a result is only folded if its bytes are at most
  max(bytes of its constant inputs, 64 KiB), so a BROADCAST_TO/TILE/FILL that would
  store megabytes in the file stays an op computed at run time.

float16 -> float32 DEQUANTIZE is folded only with `fold_dequantize=True` (default False):
it is how float16 weights are stored on purpose, and folding doubles their size.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from converter.ir import Graph, Op, Tensor

from ._graph import SIDE_EFFECT_OPS, Uses, activation, fresh_name

SIZE_ALLOWANCE_BYTES = 64 * 1024

Evaluator = Callable[[Op, list], list]
EVALUATORS: dict[str, Evaluator] = {}


def evaluates(*opcodes: str):
    """Register the decorated function as the numpy implementation of `opcodes`."""

    def register(fn: Evaluator) -> Evaluator:
        for opcode in opcodes:
            EVALUATORS[opcode] = fn
        return fn

    return register


def fold_constants(graph: Graph, *, fold_dequantize: bool = False) -> Graph:
    """Replace every foldable op by constant tensors (in place); returns the graph."""
    outputs = {t.id for t in graph.outputs}
    uses = None  # built at the first fold (most calls find nothing to fold)
    kept = []
    for op in graph.ops:
        results = _try_fold(op, outputs, fold_dequantize)
        if results is None:
            kept.append(op)
            continue
        uses = uses or Uses(graph)  # (folds only re-point readers of folded outputs: no reader of a later op changes)
        for out, value in zip(op.outputs, results):
            folded = Tensor(fresh_name(out.name), value.shape, out.dtype, data=np.array(value, order="C"))
            for reader in uses.consumers(out):  # (never a graph output: those are not folded)
                reader.inputs = [folded if t is out else t for t in reader.inputs]
    graph.ops = kept
    return graph


def _try_fold(op: Op, graph_outputs: set[int], fold_dequantize: bool) -> list[np.ndarray] | None:
    """The op's output values if it can and should be folded, else None."""
    if op.opcode in SIDE_EFFECT_OPS or any(t.id in graph_outputs or t.is_variable for t in op.outputs):
        return None  # (writing a variable tensor is a side effect: e.g. an LSTM's state refresh)
    if any(t.quant is not None for t in [*op.inputs, *op.outputs] if t is not None):
        return None
    if op.opcode == "SHAPE":
        x = op.inputs[0]
        if x is None or x.is_dynamic:
            return None
        return [np.asarray(x.shape, dtype=op.outputs[0].dtype)]
    if op.opcode == "DEQUANTIZE" and not fold_dequantize:
        return None
    if op.opcode not in EVALUATORS or not all(t is None or t.is_const for t in op.inputs):
        return None
    if not any(t is not None for t in op.inputs):
        return None
    in_bytes = sum(t.nbytes for t in op.inputs if t is not None)
    out_bytes = sum(int(np.prod(t.shape)) * t.dtype.itemsize for t in op.outputs)
    if out_bytes > max(in_bytes, SIZE_ALLOWANCE_BYTES):
        return None
    args = [None if t is None else np.asarray(t.data) for t in op.inputs]
    try:
        values = EVALUATORS[op.opcode](op, args)
    except (ValueError, IndexError, TypeError, FloatingPointError):
        return None  # an op we cannot evaluate faithfully stays an op
    values = [_apply_activation(np.asarray(v), activation(op)) for v in values]
    results = []
    for out, v in zip(op.outputs, values):
        if tuple(v.shape) != tuple(out.shape):
            return None  # disagreement with the recorded shape: trust the runtime instead
        results.append(v.astype(out.dtype, copy=False))
    return results


def _apply_activation(v: np.ndarray, name: str) -> np.ndarray:
    if name == "NONE":
        return v
    if name == "RELU":
        return np.maximum(v, 0)
    if name == "RELU6":
        return np.clip(v, 0, 6)
    if name == "RELU_N1_TO_1":
        return np.clip(v, -1, 1)
    if name == "TANH":
        return np.tanh(v)
    raise ValueError(f"fused activation {name} cannot be folded")


# ---- layout and shape ops -----------------------------------------------------------------


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


@evaluates("TRANSPOSE")
def _transpose(op, args):
    return [np.transpose(args[0], _ints(args[1]))]


@evaluates("RESHAPE", "EXPAND_DIMS", "SQUEEZE")
def _reshape(op, args):
    # The recorded output shape is authoritative (it resolved -1 and squeeze dims).
    return [args[0].reshape(op.outputs[0].shape)]


@evaluates("CAST")
def _cast(op, args):
    with np.errstate(invalid="ignore"):  # +-inf/NaN to integers: the same values as the kernel's cast on x86
        return [args[0].astype(op.outputs[0].dtype)]


@evaluates("DEQUANTIZE")
def _dequantize(op, args):
    if args[0].dtype != np.float16:
        raise ValueError("only float16 DEQUANTIZE folds")
    return [args[0].astype(np.float32)]


@evaluates("CONCATENATION")
def _concatenation(op, args):
    return [np.concatenate(args, axis=op.options.get("axis", 0))]


@evaluates("PACK")
def _pack(op, args):
    return [np.stack(args, axis=op.options.get("axis", 0))]


@evaluates("UNPACK")
def _unpack(op, args):
    axis = op.options.get("axis", 0)
    return [np.take(args[0], i, axis=axis) for i in range(args[0].shape[axis])]


@evaluates("SPLIT")
def _split(op, args):
    return np.split(args[1], op.options["numSplits"], axis=int(args[0]))


@evaluates("SPLIT_V")
def _split_v(op, args):
    if min(_ints(args[1])) < 0:
        raise ValueError("SPLIT_V with an inferred (-1) size is not folded")
    return np.split(args[0], np.cumsum(_ints(args[1]))[:-1], axis=int(args[2]))


@evaluates("GATHER")
def _gather(op, args):
    if op.options.get("batchDims", 0):
        raise ValueError("batched GATHER is not folded")
    return [np.take(args[0], args[1], axis=op.options.get("axis", 0))]


@evaluates("GATHER_ND")
def _gather_nd(op, args):
    params, indices = args
    depth = indices.shape[-1]
    return [params[tuple(np.moveaxis(indices, -1, 0))] if depth else params]


@evaluates("SCATTER_ND")
def _scatter_nd(op, args):
    # Index tables written by assignment in forward (index_put) fold through here.
    indices, updates, shape = args
    out = np.zeros(tuple(int(d) for d in shape), dtype=updates.dtype)
    depth = indices.shape[-1]
    flat = indices.reshape(-1, depth)
    np.add.at(out, tuple(flat.T), updates.reshape(flat.shape[0], *out.shape[depth:]))  # duplicates add up
    return [out]


@evaluates("CUMSUM")
def _cumsum(op, args):
    # Attention masks built from arange/cumsum of constants fold through here.
    x, axis = args[0], int(_ints(args[1])[0]) % max(args[0].ndim, 1)
    if op.options.get("reverse", False):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if op.options.get("exclusive", False):
        out = np.concatenate(
            [np.zeros_like(np.take(out, [0], axis=axis)), np.take(out, np.arange(x.shape[axis] - 1), axis=axis)],
            axis=axis,
        )
    if op.options.get("reverse", False):
        out = np.flip(out, axis)
    return [out]


@evaluates("SLICE")
def _slice(op, args):
    x, begin, size = args
    index = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(_ints(begin), _ints(size)))
    return [x[index]]


@evaluates("STRIDED_SLICE")
def _strided_slice(op, args):
    o = op.options
    if o.get("ellipsisMask", 0) or o.get("newAxisMask", 0) or o.get("offset", False):
        raise ValueError("STRIDED_SLICE with ellipsis/new axis/offset is not folded")
    x, begin, end, strides = args[0], _ints(args[1]), _ints(args[2]), _ints(args[3])
    index = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        if o.get("shrinkAxisMask", 0) >> i & 1:
            index.append(b)
            continue
        b = None if o.get("beginMask", 0) >> i & 1 else b
        e = None if o.get("endMask", 0) >> i & 1 else e
        index.append(slice(b, e, s))
    return [x[tuple(index)]]


@evaluates("TILE")
def _tile(op, args):
    return [np.tile(args[0], _ints(args[1]))]


@evaluates("BROADCAST_TO")
def _broadcast_to(op, args):
    return [np.broadcast_to(args[0], _ints(args[1]))]


@evaluates("FILL")
def _fill(op, args):
    return [np.full(_ints(args[0]), args[1].reshape(()))]


@evaluates("RANGE")
def _range(op, args):
    start, limit, delta = (a.reshape(()) for a in args)
    return [np.arange(start, limit, delta)]


@evaluates("ZEROS_LIKE")
def _zeros_like(op, args):
    return [np.zeros_like(args[0])]


@evaluates("ONES_LIKE")
def _ones_like(op, args):
    return [np.ones_like(args[0])]


@evaluates("PAD", "PADV2")
def _pad(op, args):
    value = args[2].reshape(()) if len(args) > 2 and args[2] is not None else 0
    return [np.pad(args[0], np.asarray(args[1]).reshape(-1, 2), constant_values=value)]


# ---- arithmetic ------------------------------------------------------------------------------


def _float_only(*arrays):
    if not all(np.issubdtype(a.dtype, np.floating) for a in arrays):
        raise TypeError("integer rounding differs between numpy and TFLite for this op")


_BINARY = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "MAXIMUM": np.maximum,
    "MINIMUM": np.minimum,
    "SQUARED_DIFFERENCE": lambda a, b: np.square(a - b),
    "FLOOR_DIV": np.floor_divide,
    "FLOOR_MOD": np.mod,
    "LESS": np.less,
    "LESS_EQUAL": np.less_equal,
    "GREATER": np.greater,
    "GREATER_EQUAL": np.greater_equal,
    "EQUAL": np.equal,
    "NOT_EQUAL": np.not_equal,
    "LOGICAL_AND": np.logical_and,
    "LOGICAL_OR": np.logical_or,
}


@evaluates(*_BINARY)
def _binary(op, args):
    return [_BINARY[op.opcode](args[0], args[1])]


@evaluates("DIV")
def _div(op, args):
    _float_only(*args)
    return [args[0] / args[1]]


@evaluates("POW")
def _pow(op, args):
    _float_only(args[0])
    return [np.power(args[0], args[1])]


@evaluates("FULLY_CONNECTED")
def _fully_connected(op, args):
    # A projection of a constant (a relative-position table through a key projection):
    # computed here in float64, rounded once, instead of at every invoke.
    x, w, b = (args + [None])[:3]
    _float_only(x, w)
    y = x.reshape(-1, w.shape[-1]).astype(np.float64) @ w.T.astype(np.float64)
    if b is not None:
        y = y + b
    return [y.reshape(op.outputs[0].shape)]


@evaluates("BATCH_MATMUL")
def _batch_matmul(op, args):
    x, y = (a.astype(np.float64) for a in args)
    _float_only(*args)
    if op.options.get("adjX", False):
        x = np.swapaxes(x, -1, -2)
    if op.options.get("adjY", False):
        y = np.swapaxes(y, -1, -2)
    return [np.matmul(x, y)]


_UNARY = {
    "NEG": np.negative,
    "ABS": np.abs,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: 1 / np.sqrt(x),
    "EXP": np.exp,
    "LOG": np.log,
    "SQUARE": np.square,
    "SIN": np.sin,
    "COS": np.cos,
    "FLOOR": np.floor,
    "CEIL": np.ceil,
    "LOGICAL_NOT": np.logical_not,
    "SIGN": np.sign,
    "RELU": lambda x: np.maximum(x, 0),
    "RELU6": lambda x: np.clip(x, 0, 6),
    "RELU_N1_TO_1": lambda x: np.clip(x, -1, 1),
    "TANH": np.tanh,
    "LOGISTIC": lambda x: 1 / (1 + np.exp(-x)),
}


@evaluates(*_UNARY)
def _unary(op, args):
    if op.opcode not in ("NEG", "ABS", "SQUARE", "LOGICAL_NOT", "SIGN", "RELU", "RELU6", "RELU_N1_TO_1"):
        _float_only(args[0])
    # LOG(0) = -inf is what the LiteRT kernel computes too (T5's relative position
    # buckets take the log of 0 and discard it with a SELECT): fold it.
    with np.errstate(all="raise", divide="ignore" if op.opcode == "LOG" else "raise"):
        return [_UNARY[op.opcode](args[0])]


@evaluates("SELECT", "SELECT_V2")
def _select(op, args):
    return [np.where(args[0], args[1], args[2])]


_REDUCE = {
    "SUM": np.sum,
    "MEAN": np.mean,
    "REDUCE_MAX": np.max,
    "REDUCE_MIN": np.min,
    "REDUCE_PROD": np.prod,
    "REDUCE_ANY": np.any,
    "REDUCE_ALL": np.all,
}


@evaluates(*_REDUCE)
def _reduce(op, args):
    if op.opcode == "MEAN":
        _float_only(args[0])
    axes = tuple(sorted({a % args[0].ndim for a in _ints(args[1])})) if args[0].ndim else ()
    return [_REDUCE[op.opcode](args[0], axis=axes, keepdims=bool(op.options.get("keepDims")))]
