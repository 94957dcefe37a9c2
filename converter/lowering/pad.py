"""Padding: constant (PAD / PADV2), reflect (MIRROR_PAD), replicate and circular.

PyTorch lists pads from the LAST axis backwards: (left_last, right_last, left_prev, ...).
Padding works in any layout, so no transposes are needed here.

TFLite has no "edge" or "wrap" padding mode, so replicate and circular padding are one
GATHER per padded axis with constant indices (clip(i) for replicate, i mod n for
circular): exact, and a single op per axis.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _pairs(rank: int, pad) -> list[list[int]]:
    """Per-axis [before, after] from PyTorch's last-axis-first flat list."""
    pairs = [[0, 0] for _ in range(rank)]
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    return pairs


def _crop_negative(ctx, x: Tensor, pairs) -> tuple[Tensor, list[list[int]]]:
    """Negative pads crop: slice them off first, keep the positive part."""
    for axis, (before, after) in enumerate(pairs):
        if before < 0 or after < 0:
            start, stop = max(-before, 0), x.shape[axis] - max(-after, 0)
            x = emit.slice_axis(ctx, x, axis, start, stop)
    return x, [[max(b, 0), max(a, 0)] for b, a in pairs]


def _padded_shape(shape, pairs):
    return tuple(d + b + a for d, (b, a) in zip(shape, pairs))


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    x, pairs = _crop_negative(ctx, x, _pairs(x.rank, pad))
    if not any(b or a for b, a in pairs):
        return x
    shape = _padded_shape(x.shape, pairs)
    if value == 0:
        return ctx.emit("PAD", [x, emit.int32(ctx, pairs)], shape=shape, dtype=x.dtype)
    return ctx.emit(
        "PADV2", [x, emit.int32(ctx, pairs), emit.scalar_like(ctx, value, x.dtype)], shape=shape, dtype=x.dtype
    )


@lowers(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(ctx, x, padding):
    pairs = _pairs(x.rank, padding)
    return ctx.emit(
        "MIRROR_PAD",
        [x, emit.int32(ctx, pairs)],
        {"mode": "REFLECT"},
        shape=_padded_shape(x.shape, pairs),
        dtype=x.dtype,
    )


def _gather_pad(ctx, x: Tensor, pairs, source_index) -> Tensor:
    """Pad each axis by gathering `source_index(positions, size)` along it."""
    for axis, (before, after) in enumerate(pairs):
        if not (before or after):
            continue
        size = x.shape[axis]
        indices = source_index(np.arange(-before, size + after), size).astype(np.int32)
        shape = list(x.shape)
        shape[axis] = len(indices)
        x = emit.op(
            ctx, "GATHER", [x, emit.int32(ctx, indices)], {"axis": axis, "batchDims": 0}, shape=shape, dtype=x.dtype
        )
    return x


@lowers(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(ctx, x, padding):
    return _gather_pad(ctx, x, _pairs(x.rank, padding), lambda i, n: np.clip(i, 0, n - 1))


@lowers(aten._pad_circular.default)
def circular_pad(ctx, x, pad):
    x, pairs = _crop_negative(ctx, x, _pairs(x.rank, pad))
    return _gather_pad(ctx, x, pairs, lambda i, n: np.mod(i, n))


@lowers(aten.pad.default)
def pad(ctx, x, pad, mode="constant", value=None):
    if mode == "constant":
        return constant_pad_nd(ctx, x, pad, value or 0)
    if mode == "reflect":
        return reflection_pad(ctx, x, pad)
    if mode == "replicate":
        return replication_pad(ctx, x, pad)
    if mode == "circular":
        return circular_pad(ctx, x, pad)
    raise emit.unsupported(ctx, f"padding mode {mode!r}", "Use constant, reflect, replicate or circular.")
