"""Small op builders shared by the lowering families.

Each helper emits ONE TFLite op (or none) with an explicit output shape, so a lowering
that needs several steps can chain them without reading the fx node's metadata. The last
op of a lowering usually goes through `ctx.emit` without a shape, which takes the node's
own shape and dtype.

Conventions every family follows (the flatbuffer writer relies on them):
- option values that are schema enums are written by name: `"padding": "SAME"`,
  `"fusedActivationFunction": "NONE"`, `"outputType": "INT64"` (a `TensorType` name);
- shape-like operands (new shapes, axes, permutations, begin/end/strides) are int32
  constants, as the TFLite kernels expect.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from common.tflite_schema import DTYPE_TYPE_NAMES
from common.tflite_schema import tensor_type_name as tflite_type_name
from converter.ir import Tensor, transposed

TFLITE_TYPE_NAMES = DTYPE_TYPE_NAMES  # numpy dtype -> TensorType name (CAST / ARG_MAX / SHAPE options)


def unsupported(ctx, what: str, hint: str) -> NotImplementedError:
    """The error a lowering raises for a variant it cannot express: `what` is unsupported,
    `hint` says what to do. The pipeline collects these (with the op and the user's source
    line) into one report of every unsupported use in the model."""
    return NotImplementedError(f"{what}. {hint}")


def normalize_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def normalize_dims(dims, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, rank) for d in dims})


def int32(ctx, values) -> Tensor:
    """An int32 constant (shapes, axes, permutations...)."""
    return ctx.const(np.asarray(values, dtype=np.int32))


def scalar_like(ctx, value, like_dtype) -> Tensor:
    """A 0-d constant of `like_dtype` (TFLite broadcasts it against any shape)."""
    return ctx.const(np.asarray(value, dtype=like_dtype))


def as_tensor(ctx, value, dtype) -> Tensor:
    """`value` if it is already a Tensor of `dtype`; a CAST of it if of another dtype;
    else a scalar constant of `dtype` (Python numbers in ATen calls)."""
    if isinstance(value, Tensor):
        return cast(ctx, value, dtype)
    return scalar_like(ctx, value, dtype)


# ---- single-op builders ------------------------------------------------------------------


def op(ctx, opcode: str, inputs, options=None, *, shape, dtype, signature=None) -> Tensor:
    """Emit an intermediate op with an explicit output shape/dtype."""
    return ctx.emit(opcode, inputs, options, shape=shape, dtype=dtype, signature=signature)


def unary(ctx, opcode: str, x: Tensor, options=None, dtype=None) -> Tensor:
    """An elementwise op whose output has x's shape (and signature)."""
    return ctx.emit(opcode, [x], options, shape=x.shape, dtype=dtype or x.dtype, signature=x.shape_signature)


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    shape = []
    for x, y in _right_aligned(a, b):
        if x != y and x != 1 and y != 1:
            return tuple(np.broadcast_shapes(tuple(a), tuple(b)))  # raises numpy's error
        shape.append(y if x == 1 else x)
    return tuple(shape)


def binary(ctx, opcode: str, a: Tensor, b: Tensor, options=None, dtype=None) -> Tensor:
    """A broadcasting binary op (ADD, MUL, LESS...) with a computed output shape."""
    shape = broadcast_shape(a.shape, b.shape)
    signature = None
    if a.is_dynamic or b.is_dynamic:
        signature = tuple(
            _broadcast_dim(x, y) for x, y in _right_aligned(a.shape_signature or a.shape, b.shape_signature or b.shape)
        )
    if opcode in ("ADD", "SUB", "MUL", "DIV") and options is None:
        options = {"fusedActivationFunction": "NONE"}
    return ctx.emit(opcode, [a, b], options, shape=shape, dtype=dtype or a.dtype, signature=signature)


def _broadcast_dim(x: int, y: int) -> int:
    """One dimension of a broadcast signature (-1 = dynamic)."""
    if x == 1:
        return y
    if y == 1:
        return x
    return max(x, y)  # -1 vs n > 1 gives n; -1 vs -1 stays -1


def _right_aligned(a, b):
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return zip(a, b)


def reshape(ctx, x: Tensor, shape: Sequence[int], signature=None) -> Tensor:
    """RESHAPE to a static shape (returns x itself when nothing changes)."""
    shape = tuple(int(d) for d in shape)
    if shape == x.shape and not x.is_dynamic:
        return x
    if x.is_const:
        return ctx.const(x.data.reshape(shape))
    if x.is_dynamic and signature is None:  # keep the dynamic dims dynamic
        return dynamic_reshape(ctx, x, shape)
    new_shape = list(signature) if signature is not None else list(shape)
    return ctx.emit(
        "RESHAPE", [x, int32(ctx, new_shape)], {"newShape": new_shape}, shape=shape, dtype=x.dtype, signature=signature
    )


def dynamic_reshape(ctx, x: Tensor, shape) -> Tensor:
    """RESHAPE a dynamic tensor to `shape` (its sample sizes), when the lowering knows only
    sample sizes: each dynamic input dim must reappear whole in the output, between the
    same amounts of data on either side (a batch or sequence dim kept through a lift,
    flatten or split). One such dim is written -1; several read their sizes from SHAPE."""
    shape = tuple(int(d) for d in shape)
    sig = x.shape_signature
    dynamic = [k for k, s in enumerate(sig) if s == -1]
    out_sig = list(shape)
    source = {}
    for k in dynamic:
        before, after = math.prod(x.shape[:k]), math.prod(x.shape[k + 1 :])
        match = [
            j
            for j in range(len(shape))
            if j not in source
            and shape[j] == x.shape[k]
            and math.prod(shape[:j]) == before
            and math.prod(shape[j + 1 :]) == after
        ]
        if len(match) != 1:
            raise unsupported(
                ctx,
                f"reshaping a tensor of dynamic shape {list(sig)} to {list(shape)}",
                "Keep each dynamic dimension whole through view/reshape (merge or split only static "
                "dims), or mark fewer dims dynamic.",
            )
        source[match[0]] = k
        out_sig[match[0]] = -1
    if len(dynamic) == 1:
        target = int32(ctx, out_sig)
    else:
        sizes = shape_of(ctx, x)
        gathered = {
            j: op(
                ctx,
                "STRIDED_SLICE",
                [sizes, int32(ctx, [k]), int32(ctx, [k + 1]), int32(ctx, [1])],
                {
                    "beginMask": 0,
                    "endMask": 0,
                    "ellipsisMask": 0,
                    "newAxisMask": 0,
                    "shrinkAxisMask": 0,
                    "offset": False,
                },
                shape=(1,),
                dtype=np.int32,
            )
            for j, k in source.items()
        }
        pieces, static = [], []
        for j, d in enumerate(shape):
            if j in gathered:
                if static:
                    pieces.append(int32(ctx, static))
                    static = []
                pieces.append(gathered[j])
            else:
                static.append(d)
        if static:
            pieces.append(int32(ctx, static))
        target = op(
            ctx,
            "CONCATENATION",
            pieces,
            {"axis": 0, "fusedActivationFunction": "NONE"},
            shape=(len(shape),),
            dtype=np.int32,
        )
    options = {"newShape": out_sig} if len(dynamic) == 1 else {}
    return ctx.emit("RESHAPE", [x, target], options, shape=shape, dtype=x.dtype, signature=tuple(out_sig))


def shape_of(ctx, tensor: Tensor) -> Tensor:
    """SHAPE of `tensor` as int32, emitted once per graph (kept with the symbolic sizes'
    values, `ctx.sym_values`, which `symbolic.register_input` sets up)."""
    key = ("shape", tensor.id)
    if key not in ctx.sym_values:
        ctx.sym_values[key] = op(ctx, "SHAPE", [tensor], {"outType": "INT32"}, shape=(tensor.rank,), dtype=np.int32)
    return ctx.sym_values[key]


def transpose(ctx, x: Tensor, perm: Sequence[int]) -> Tensor:
    """TRANSPOSE by `perm` (identity returns x). A constant becomes a lazy transposed
    constant: its values are rearranged once, when the writer writes them."""
    perm = [int(p) for p in perm]
    if perm == list(range(x.rank)):
        return x
    if x.is_const:
        return ctx.const(transposed(x.constant, perm))
    shape = tuple(x.shape[p] for p in perm)
    signature = tuple(x.shape_signature[p] for p in perm) if x.shape_signature else None
    return ctx.emit("TRANSPOSE", [x, int32(ctx, perm)], shape=shape, dtype=x.dtype, signature=signature)


def cast(ctx, x: Tensor, dtype) -> Tensor:
    """CAST to `dtype` (no op when already of that dtype; constants are cast here)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.is_const:
        return ctx.const(x.data.astype(dtype))
    return ctx.emit(
        "CAST",
        [x],
        {"inDataType": tflite_type_name(x.dtype), "outDataType": tflite_type_name(dtype)},
        shape=x.shape,
        dtype=dtype,
        signature=x.shape_signature,
    )


def strided_slice(ctx, x: Tensor, begin, end, strides, shrink_axis_mask: int = 0) -> Tensor:
    """STRIDED_SLICE with explicit (already clamped, non-negative) bounds.

    On static shapes, dropped axes (`shrink_axis_mask`) are a RESHAPE after a plain
    slice: XNNPACK does not take a STRIDED_SLICE with a shrink mask, and each one left
    to the builtin kernels splits the delegated graph (a selective-scan decoder's
    per-step `x[:, t]`: 3.4x the anchor's latency, which emits SLICE + RESHAPE)."""
    if shrink_axis_mask and not x.is_dynamic:
        kept = strided_slice(ctx, x, begin, end, strides)
        return reshape(ctx, kept, [d for axis, d in enumerate(kept.shape) if not shrink_axis_mask >> axis & 1])
    out_shape, out_sig, whole = [], [], 0
    sig = x.shape_signature or x.shape
    for axis, (b, e, s) in enumerate(zip(begin, end, strides)):
        if (b, e, s) == (0, x.shape[axis], 1) and sig[axis] == -1:
            whole |= 1 << axis  # a dynamic axis taken whole: masks, not its sample size
        if shrink_axis_mask >> axis & 1:
            continue
        out_shape.append(max(0, -(-(e - b) // s)))
        out_sig.append(-1 if whole >> axis & 1 else out_shape[-1])
    return ctx.emit(
        "STRIDED_SLICE",
        [x, int32(ctx, begin), int32(ctx, end), int32(ctx, strides)],
        {
            "beginMask": whole,
            "endMask": whole,
            "ellipsisMask": 0,
            "newAxisMask": 0,
            "shrinkAxisMask": shrink_axis_mask,
            "offset": False,
        },
        shape=out_shape,
        dtype=x.dtype,
        signature=tuple(out_sig) if whole else None,
    )


def slice_axis(ctx, x: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
    """x[..., start:stop:step, ...] along one axis (bounds already clamped)."""
    begin = [0] * x.rank
    end = list(x.shape)
    strides = [1] * x.rank
    begin[axis], end[axis], strides[axis] = start, stop, step
    if x.is_const:
        index = [slice(None)] * x.rank
        index[axis] = slice(start, stop, step)
        return ctx.const(x.data[tuple(index)])
    return strided_slice(ctx, x, begin, end, strides)


def concat(ctx, parts: list[Tensor], axis: int) -> Tensor:
    """CONCATENATION along `axis` (a single part is returned as is)."""
    if len(parts) == 1:
        return parts[0]
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    signature = None
    if any(p.is_dynamic for p in parts):
        signature = [
            -1 if any(p.is_dynamic and p.shape_signature[k] == -1 for p in parts) else d for k, d in enumerate(shape)
        ]
    return ctx.emit(
        "CONCATENATION",
        parts,
        {"axis": axis, "fusedActivationFunction": "NONE"},
        shape=shape,
        dtype=parts[0].dtype,
        signature=signature,
    )


def mean(ctx, x: Tensor, axes: Sequence[int], keep_dims: bool = True) -> Tensor:
    """MEAN over `axes` (an intermediate: output shape computed here)."""
    return reduce(ctx, "MEAN", x, axes, keep_dims)


def reduce(ctx, opcode: str, x: Tensor, axes: Sequence[int], keep_dims: bool, dtype=None) -> Tensor:
    axes = sorted(normalize_dim(a, x.rank) for a in axes)
    sig = x.shape_signature or x.shape
    if keep_dims:
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
        signature = [1 if i in axes else d for i, d in enumerate(sig)]
    else:
        shape = [d for i, d in enumerate(x.shape) if i not in axes]
        signature = [d for i, d in enumerate(sig) if i not in axes]
    return ctx.emit(
        opcode,
        [x, int32(ctx, axes)],
        {"keepDims": keep_dims},
        shape=shape,
        dtype=dtype or x.dtype,
        signature=signature if -1 in signature else None,
    )


def channel_vector(ctx, values: np.ndarray, rank: int, dtype) -> Tensor:
    """A per-channel constant shaped (C, 1, ..., 1) so it broadcasts over NCHW-like axis 1."""
    values = np.asarray(values, dtype=dtype)
    return ctx.const(values.reshape((-1,) + (1,) * max(rank - 2, 0)))
