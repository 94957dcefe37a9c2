"""Pooling: max/avg (incl. ceil_mode, count_include_pad, divisor_override) and adaptive.

MAX_POOL_2D / AVERAGE_POOL_2D are NHWC-only (wrapped in the layout transposes).
- Max pooling: SAME when PyTorch's padding (and ceil_mode's last window) reads TFLite's
  SAME windows (SAME ignores the padding, as PyTorch's -inf padding does), else PADV2
  with the lowest float + VALID.
- Average pooling: TFLite's SAME divides by the number of real elements, which is
  PyTorch's count_include_pad=False. Every other case is zero-PAD + VALID average,
  rescaled per output position by a constant (kernel area / PyTorch's divisor).
- Adaptive pooling: to 1x1 -> MEAN / REDUCE_MAX over H, W (no transposes); to sizes that
  divide the input -> a plain pool; adaptive average to other sizes is two matmuls with
  constant averaging matrices (it is linear and separable); adaptive max to other sizes
  (or with its indices read) gathers each window as a row and reduces it.
- Indices (`return_indices=True`) are PyTorch's flat positions of each window's first
  maximum; MaxUnpool arrives decomposed (a scatter of the values to those positions).
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from common.resampling import adaptive_average_matrix, adaptive_window_index
from converter.ir import Tensor
from converter.lowering import emit, layout
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _pair(value, default=None) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return (value, value)
    return (int(value[0]), int(value[-1])) if len(value) in (1, 2) else tuple(value)


def _pool_nhwc(ctx, opcode, x_nhwc: Tensor, kernel, stride, mode: str, out_hw) -> Tensor:
    options = {
        "padding": mode,
        "strideH": stride[0],
        "strideW": stride[1],
        "filterHeight": kernel[0],
        "filterWidth": kernel[1],
        "fusedActivationFunction": "NONE",
    }
    n, _, _, c = x_nhwc.shape
    return emit.op(ctx, opcode, [x_nhwc], options, shape=(n, *out_hw, c), dtype=x_nhwc.dtype)


def _pad_for_windows(ctx, x_nhwc: Tensor, kernel, stride, padding, out_hw, value) -> Tensor:
    """Pad NHWC spatial axes by `padding` before and as much as the last window needs after,
    so a VALID pool yields exactly `out_hw` windows."""
    n, h, w, c = x_nhwc.shape
    after = [max((o - 1) * s + k - size - p, 0) for o, s, k, size, p in zip(out_hw, stride, kernel, (h, w), padding)]
    if not any(padding) and not any(after):
        return x_nhwc
    pairs = [[0, 0], [padding[0], after[0]], [padding[1], after[1]], [0, 0]]
    shape = (n, h + padding[0] + after[0], w + padding[1] + after[1], c)
    if value == 0:
        return emit.op(ctx, "PAD", [x_nhwc, emit.int32(ctx, pairs)], shape=shape, dtype=x_nhwc.dtype)
    return emit.op(
        ctx,
        "PADV2",
        [x_nhwc, emit.int32(ctx, pairs), emit.scalar_like(ctx, value, x_nhwc.dtype)],
        shape=shape,
        dtype=x_nhwc.dtype,
    )


def _crop_to(ctx, y_nhwc: Tensor, out_hw) -> Tensor:
    """Drop trailing windows a VALID pool produced beyond PyTorch's count."""
    n, h, w, c = y_nhwc.shape
    if (h, w) == tuple(out_hw):
        return y_nhwc
    return emit.strided_slice(ctx, y_nhwc, [0, 0, 0, 0], [n, out_hw[0], out_hw[1], c], [1, 1, 1, 1])


def _valid_out(size, k, s):
    return (size - k) // s + 1


@lowers(aten.max_pool2d_with_indices.default, aten.max_pool2d.default)
def max_pool2d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = _pair(kernel_size)
    stride = _pair(stride, kernel)
    padding, dilation = _pair(padding), _pair(dilation)
    if dilation != (1, 1):
        raise emit.unsupported(ctx, "dilated max pooling has no TFLite builtin", "Use dilation=1.")
    out = layout.to_nchw(ctx, _max_pool_nhwc(ctx, layout.to_nhwc(ctx, x), kernel, stride, padding, ceil_mode))
    return _with_indices(ctx, out, x, kernel, stride, padding, ceil_mode)


def _with_indices(ctx, out: Tensor, x: Tensor, kernel, stride, padding, ceil_mode):
    """`out`, plus the indices output when the node has one: computed only when something
    reads it (None otherwise, and for calls from a decomposition that drops it)."""
    if ctx.node is None or not isinstance(ctx.meta, (tuple, list)):
        return out
    return out, (_max_pool_indices(ctx, x, kernel, stride, padding, ceil_mode) if _indices_read(ctx) else None)


def _indices_read(ctx) -> bool:
    """Whether the node being lowered has its second output (the indices) read."""
    return ctx.node is not None and any(
        user.target is operator.getitem and user.args[1] == 1 for user in ctx.node.users
    )


def _max_pool_indices(ctx, x: Tensor, kernel, stride, padding, ceil_mode) -> Tensor:
    """PyTorch's max-pool indices (int64, the flat position of each window's first
    maximum within its input plane or volume) of channels-first `x` (2-D or 3-D pools).

    Every kernel offset's strided slice of the (lowest-value) padded input is one row of
    a (window size, outputs) matrix; ARG_MAX down its columns picks the first maximum,
    as PyTorch does; a GATHER maps that offset to its flat distance from the window's
    corner, and an ADD of each window's corner position gives the index."""
    if x.is_dynamic or not np.issubdtype(x.dtype, np.floating):
        raise emit.unsupported(
            ctx, "max pooling indices of a dynamic or non-float input", "Export with static shapes and float inputs."
        )
    n, c, *size = x.shape
    out = [layout.torch_output_size(i, k, s, p, 1, ceil_mode) for i, k, s, p in zip(size, kernel, stride, padding)]
    after = [max((o - 1) * s + k - i - p, 0) for o, s, k, i, p in zip(out, stride, kernel, size, padding)]
    padded = x
    if any(padding) or any(after):
        pairs = [[0, 0], [0, 0], *([p, a] for p, a in zip(padding, after))]
        lowest = emit.scalar_like(ctx, np.finfo(x.dtype).min, x.dtype)
        shape = (n, c, *(i + p + a for i, p, a in zip(size, padding, after)))
        padded = emit.op(ctx, "PADV2", [x, emit.int32(ctx, pairs), lowest], shape=shape, dtype=x.dtype)
    count = n * c * int(np.prod(out))
    rows = []
    for offset in np.ndindex(*kernel):
        end = [n, c, *(k + (o - 1) * s + 1 for k, o, s in zip(offset, out, stride))]
        window = emit.strided_slice(ctx, padded, [0, 0, *offset], end, [1, 1, *stride])
        rows.append(emit.reshape(ctx, window, (1, count)))
    first_max = emit.op(
        ctx, "ARG_MAX", [emit.concat(ctx, rows, 0), emit.int32(ctx, 0)], {"outputType": "INT64"},
        shape=(count,), dtype=np.int64,
    )  # fmt: skip
    plane = np.cumprod([1, *size[::-1]])[:-1][::-1]  # flat strides of the input plane/volume
    offsets = np.array([np.dot(o, plane) for o in np.ndindex(*kernel)], np.int64)
    delta = emit.op(
        ctx, "GATHER", [ctx.const(offsets), first_max], {"axis": 0, "batchDims": 0}, shape=(count,), dtype=np.int64
    )
    corners = np.zeros(out, np.int64)
    for axis, (o, s, p) in enumerate(zip(out, stride, padding)):
        line = [1] * len(out)
        line[axis] = o
        corners += ((np.arange(o) * s - p) * plane[axis]).reshape(line)
    flat = emit.reshape(ctx, delta, (n * c, int(np.prod(out))))
    index = emit.binary(ctx, "ADD", flat, ctx.const(corners.reshape(1, -1)))
    return emit.reshape(ctx, index, (n, c, *out))


def _same_windows(in_hw, kernel, stride, padding, out_hw) -> bool:
    """Whether TFLite's SAME padding reads PyTorch's windows (same count, same first start)
    and pads at all; ceil_mode's extra last window included (GoogLeNet's `MaxPool2d(3, 2,
    ceil_mode=True)`), so no PADV2 is needed (XNNPACK does not take PADV2: each one split
    the delegated graph)."""
    same = [layout.same_padding(size, k, s) for size, k, s in zip(in_hw, kernel, stride)]
    if any(o != so or p != before for o, p, (so, before, _) in zip(out_hw, padding, same)):
        return False
    return any(before + after for _, before, after in same)


def _max_pool_nhwc(ctx, x_nhwc: Tensor, kernel, stride, padding, ceil_mode) -> Tensor:
    n, h, w, c = x_nhwc.shape
    out_hw = [
        layout.torch_output_size(size, k, s, p, 1, ceil_mode) for size, k, s, p in zip((h, w), kernel, stride, padding)
    ]
    if _same_windows((h, w), kernel, stride, padding, out_hw):
        return _pool_nhwc(ctx, "MAX_POOL_2D", x_nhwc, kernel, stride, "SAME", out_hw)
    dtype = x_nhwc.dtype
    lowest = np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min
    padded = _pad_for_windows(ctx, x_nhwc, kernel, stride, padding, out_hw, lowest)
    valid_hw = [_valid_out(size, k, s) for size, k, s in zip(padded.shape[1:3], kernel, stride)]
    return _crop_to(ctx, _pool_nhwc(ctx, "MAX_POOL_2D", padded, kernel, stride, "VALID", valid_hw), out_hw)


def _avg_divisors(in_hw, kernel, stride, padding, out_hw, count_include_pad, divisor_override) -> np.ndarray:
    """PyTorch's divisor for each output position of avg_pool2d, as an (oh, ow) array."""
    if divisor_override:
        return np.full(out_hw, float(divisor_override))
    per_axis = []
    for size, k, s, p, o in zip(in_hw, kernel, stride, padding, out_hw):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        full = end - start
        real = np.minimum(end, size) - np.maximum(start, 0)
        per_axis.append(full if count_include_pad else real)
    return np.outer(per_axis[0], per_axis[1]).astype(np.float64)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(
    ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    kernel = _pair(kernel_size)
    stride = _pair(stride, kernel)
    padding = _pair(padding)
    y = _avg_pool_nhwc(
        ctx, layout.to_nhwc(ctx, x), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    )
    return layout.to_nchw(ctx, y)


def _avg_pool_nhwc(
    ctx, x_nhwc: Tensor, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
) -> Tensor:
    n, h, w, c = x_nhwc.shape
    out_hw = [
        layout.torch_output_size(size, k, s, p, 1, ceil_mode) for size, k, s, p in zip((h, w), kernel, stride, padding)
    ]
    if (
        not ceil_mode
        and not divisor_override
        and not count_include_pad
        and any(padding)
        and layout.is_same_padding((h, w), kernel, stride, padding)
    ):
        return _pool_nhwc(ctx, "AVERAGE_POOL_2D", x_nhwc, kernel, stride, "SAME", out_hw)
    padded = _pad_for_windows(ctx, x_nhwc, kernel, stride, padding, out_hw, 0)
    valid_hw = [_valid_out(size, k, s) for size, k, s in zip(padded.shape[1:3], kernel, stride)]
    y = _crop_to(ctx, _pool_nhwc(ctx, "AVERAGE_POOL_2D", padded, kernel, stride, "VALID", valid_hw), out_hw)
    scale = (
        kernel[0]
        * kernel[1]
        / _avg_divisors((h, w), kernel, stride, padding, out_hw, count_include_pad, divisor_override)
    )
    if np.allclose(scale, 1.0):
        return y
    return emit.binary(ctx, "MUL", y, ctx.const(scale.astype(x_nhwc.dtype)[:, :, None]))


def _adaptive_out(x: Tensor, output_size) -> tuple[int, int]:
    h, w = x.shape[-2:]
    oh, ow = _pair(output_size)
    return (h if oh is None else oh, w if ow is None else ow)


@lowers(aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(ctx, x, output_size):
    n, c, h, w = x.shape
    oh, ow = _adaptive_out(x, output_size)
    if (oh, ow) == (1, 1):
        return ctx.emit("MEAN", [x, emit.int32(ctx, [2, 3])], {"keepDims": True})
    if h % oh == 0 and w % ow == 0:
        kernel = (h // oh, w // ow)
        y = _pool_nhwc(ctx, "AVERAGE_POOL_2D", layout.to_nhwc(ctx, x), kernel, kernel, "VALID", (oh, ow))
        return layout.to_nchw(ctx, y)
    # Separable and linear: rows = A_h @ x, then columns = rows @ A_w^T.
    a_h = ctx.const(adaptive_average_matrix(h, oh).astype(x.dtype))
    a_w_t = ctx.const(adaptive_average_matrix(w, ow).T.astype(x.dtype))
    rows = emit.op(ctx, "BATCH_MATMUL", [a_h, x], {"adjX": False, "adjY": False}, shape=(n, c, oh, w), dtype=x.dtype)
    return ctx.emit("BATCH_MATMUL", [rows, a_w_t], {"adjX": False, "adjY": False})


@lowers(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(ctx, x, output_size):
    """MEAN to one position, else x @ A^T with PyTorch's constant averaging matrix A
    (what the decomposition computes, untraced)."""
    if x.rank != 3 or x.is_dynamic:
        raise NotImplementedError("adaptive_avg_pool1d on a batched 3-D static input only")
    n, c, length = x.shape
    out = _pair(output_size)[-1]
    if out == 1:
        return ctx.emit("MEAN", [x, emit.int32(ctx, [2])], {"keepDims": True})
    a_t = ctx.const(adaptive_average_matrix(length, out).T.astype(x.dtype))
    return emit.op(ctx, "BATCH_MATMUL", [x, a_t], {"adjX": False, "adjY": False}, shape=(n, c, out), dtype=x.dtype)


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(ctx, x, output_size):
    """REDUCE_MAX to 1x1, MAX_POOL_2D where the output size divides the input; other sizes,
    or a read of the indices: `_adaptive_max_windows`."""
    n, c, h, w = x.shape
    oh, ow = _adaptive_out(x, output_size)
    if _indices_read(ctx) or h % oh or w % ow:
        return _adaptive_max_windows(ctx, x, oh, ow, with_indices=_indices_read(ctx))
    if (oh, ow) == (1, 1):
        return emit.reduce(ctx, "REDUCE_MAX", x, [2, 3], keep_dims=True), None
    kernel = (h // oh, w // ow)
    y = _pool_nhwc(ctx, "MAX_POOL_2D", layout.to_nhwc(ctx, x), kernel, kernel, "VALID", (oh, ow))
    return layout.to_nchw(ctx, y), None


def _adaptive_max_windows(ctx, x: Tensor, oh: int, ow: int, with_indices: bool):
    """Adaptive max pooling to any size, and PyTorch's indices (int64, the flat position
    of each window's first maximum in its plane): one GATHER lays every output's window
    out as a row of positions of the flattened plane (shorter windows repeat their last
    cell, which changes neither the maximum nor where it first occurs); REDUCE_MAX and
    ARG_MAX (the first maximum, as PyTorch) along the rows; a GATHER maps the row offset
    to the position."""
    if x.is_dynamic:
        raise emit.unsupported(ctx, "adaptive max pooling of a dynamic input to these sizes", "Export static shapes.")
    n, c, h, w = x.shape
    rows, cols = adaptive_window_index(h, oh), adaptive_window_index(w, ow)  # windows padded by their last cell
    positions = (rows[:, None, :, None] * w + cols[None, :, None, :]).reshape(oh * ow, -1)  # (outputs, window)
    count, size = positions.shape
    plane = emit.reshape(ctx, x, (n * c, h * w))
    flat = ctx.const(positions.reshape(-1).astype(np.int32))
    gathered = emit.op(
        ctx, "GATHER", [plane, flat], {"axis": 1, "batchDims": 0}, shape=(n * c, count * size), dtype=x.dtype
    )
    windows = emit.reshape(ctx, gathered, (n * c, count, size))
    values = emit.reshape(ctx, emit.reduce(ctx, "REDUCE_MAX", windows, [2], keep_dims=False), (n, c, oh, ow))
    if not with_indices:
        return values, None
    first_max = emit.op(
        ctx, "ARG_MAX", [windows, emit.int32(ctx, 2)], {"outputType": "INT64"}, shape=(n * c, count), dtype=np.int64
    )
    at = emit.binary(ctx, "ADD", first_max, ctx.const(np.arange(count, dtype=np.int64) * size))
    table = ctx.const(positions.reshape(-1).astype(np.int64))
    index = emit.op(ctx, "GATHER", [table, at], {"axis": 0, "batchDims": 0}, shape=(n * c, count), dtype=np.int64)
    return values, emit.reshape(ctx, index, (n, c, oh, ow))


# ---- 3-D pooling: separable, two 2-D pools on NDHWC ------------------------------------------
# TFLite has no 3-D pool builtin. A max or average over a (kd, kh, kw) box is the same
# pool over (kh, kw) on each depth slice, then over (kd, 1) along depth (PyTorch's
# average divisor is a product of per-axis counts, so averages separate too).


def _triple(value, default=None) -> tuple[int, int, int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return (value,) * 3
    return tuple(int(v) for v in value) * (3 if len(value) == 1 else 1)


def _pool3d(ctx, x, kernel, stride, padding, pool_2d) -> Tensor:
    """`pool_2d(ctx, x_nhwc, kernel, stride, padding)` over H, W then over D; NCDHW in and out."""
    x_ndhwc = layout.to_ndhwc(ctx, x)
    n, d, h, w, c = x_ndhwc.shape
    y = pool_2d(ctx, emit.reshape(ctx, x_ndhwc, (n * d, h, w, c)), kernel[1:], stride[1:], padding[1:])
    _, oh, ow, _ = y.shape
    y = pool_2d(ctx, emit.reshape(ctx, y, (n, d, oh * ow, c)), (kernel[0], 1), (stride[0], 1), (padding[0], 0))
    return layout.to_ncdhw(ctx, emit.reshape(ctx, y, (n, y.shape[1], oh, ow, c)))


@lowers(aten.max_pool3d_with_indices.default, aten.max_pool3d.default)
def max_pool3d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = _triple(kernel_size)
    stride, padding = _triple(stride, kernel), _triple(padding)
    if _triple(dilation) != (1, 1, 1):
        raise emit.unsupported(ctx, "dilated 3-D max pooling", "Use dilation=1.")
    out = _pool3d(ctx, x, kernel, stride, padding, lambda c, t, k, s, p: _max_pool_nhwc(c, t, k, s, p, ceil_mode))
    return _with_indices(ctx, out, x, kernel, stride, padding, ceil_mode)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(
    ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    if divisor_override:
        raise emit.unsupported(ctx, "3-D average pooling with divisor_override", "Leave divisor_override unset.")
    kernel = _triple(kernel_size)
    stride, padding = _triple(stride, kernel), _triple(padding)
    return _pool3d(
        ctx,
        x,
        kernel,
        stride,
        padding,
        lambda c, t, k, s, p: _avg_pool_nhwc(c, t, k, s, p, ceil_mode, count_include_pad, None),
    )


@lowers(aten.adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(ctx, x, output_size):
    """Global video pooling: one MEAN (other sizes decompose)."""
    if list(output_size) not in ([1], [1, 1, 1]):
        raise NotImplementedError("adaptive average 3-D pooling to more than one position")
    return ctx.emit("MEAN", [x, emit.int32(ctx, [2, 3, 4])], {"keepDims": True})


@lowers(aten.max_pool1d.default)
def max_pool1d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """A 2-D max pool over a height of 1 (what its decomposition does, without tracing it)."""
    if x.rank != 3 or x.is_dynamic:
        raise NotImplementedError("max_pool1d on a batched 3-D static input only")
    kernel, stride = _pair(kernel_size)[-1], (_pair(stride) or _pair(kernel_size))[-1]
    padding, dilation = _pair(padding)[-1], _pair(dilation)[-1]
    x4 = emit.reshape(ctx, x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    y4 = max_pool2d(ctx, x4, (1, kernel), (1, stride), (0, padding), (1, dilation), ceil_mode)
    return emit.reshape(ctx, y4, ctx.out_shape())
