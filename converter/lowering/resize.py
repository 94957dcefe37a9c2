"""Interpolation: nearest and bilinear upsampling (align_corners both ways), and grid_sample
(bilinear / nearest at positions given by a tensor; see the section at the end).

RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR (NHWC, wrapped in the layout transposes) are
used whenever they sample exactly the source positions PyTorch samples:
- bilinear, align_corners=True -> alignCorners=True (both scale by (in-1)/(out-1));
- bilinear, align_corners=False -> halfPixelCenters=True, when PyTorch's scale (1/scale_factor
  if given, else in/out) equals TFLite's in/out;
- nearest -> plain RESIZE_NEAREST_NEIGHBOR when floor(dst * scale) picks the same rows.
Otherwise the exact PyTorch sampling is reproduced: nearest as constant GATHERs, bilinear
(linear and separable) as two matmuls with constant interpolation matrices; bicubic
always so (ATen's cubic weights, A = -0.75).
"""

from __future__ import annotations

import numpy as np
import torch

from common.resampling import cubic_weights, linear_weights, nearest_indices, source_scale
from converter.ir import Tensor
from converter.lowering import emit, layout
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _scales(scale_factors, scales_h=None, scales_w=None):
    if scale_factors:
        return list(scale_factors)
    return [scales_h, scales_w]


def _resize_nhwc(ctx, opcode, x, out_hw, align_corners=False, half_pixel=False) -> Tensor:
    n, c = x.shape[:2]
    y = emit.op(
        ctx,
        opcode,
        [layout.to_nhwc(ctx, x), emit.int32(ctx, out_hw)],
        {"alignCorners": align_corners, "halfPixelCenters": half_pixel},
        shape=(n, *out_hw, c),
        dtype=x.dtype,
    )
    return layout.to_nchw(ctx, y)


def _upsample_nearest(ctx, x, scales, half_pixel):
    if x.rank != 4:
        raise emit.unsupported(ctx, f"nearest interpolation of a rank-{x.rank} tensor", "Use 4-D (N, C, H, W) input.")
    out_hw = ctx.out_shape()[2:]
    sources = [nearest_indices(size, out, s, half_pixel) for size, out, s in zip(x.shape[2:], out_hw, scales)]
    tflite = [nearest_indices(size, out, None, half_pixel) for size, out in zip(x.shape[2:], out_hw)]
    if all(np.array_equal(a, b) for a, b in zip(sources, tflite)):
        return _resize_nhwc(ctx, "RESIZE_NEAREST_NEIGHBOR", x, out_hw, half_pixel=half_pixel)
    for axis, rows in zip((2, 3), sources):  # exact PyTorch sampling
        shape = list(x.shape)
        shape[axis] = len(rows)
        x = emit.op(
            ctx, "GATHER", [x, emit.int32(ctx, rows)], {"axis": axis, "batchDims": 0}, shape=shape, dtype=x.dtype
        )
    return x


@lowers(aten.upsample_nearest2d.vec)
def upsample_nearest2d_vec(ctx, x, output_size, scale_factors):
    return _upsample_nearest(ctx, x, _scales(scale_factors), half_pixel=False)


@lowers(aten.upsample_nearest2d.default)
def upsample_nearest2d(ctx, x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(ctx, x, _scales(None, scales_h, scales_w), half_pixel=False)


@lowers(aten._upsample_nearest_exact2d.vec)
def upsample_nearest_exact2d_vec(ctx, x, output_size, scale_factors):
    return _upsample_nearest(ctx, x, _scales(scale_factors), half_pixel=True)


@lowers(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(ctx, x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(ctx, x, _scales(None, scales_h, scales_w), half_pixel=True)


def _upsample_bilinear(ctx, x, align_corners, scales, out_hw=None):
    if x.rank != 4:
        raise emit.unsupported(ctx, f"bilinear interpolation of a rank-{x.rank} tensor", "Use 4-D (N, C, H, W) input.")
    n, c, h, w = x.shape
    out_hw = tuple(out_hw or ctx.out_shape()[2:])
    if align_corners:
        return _resize_nhwc(ctx, "RESIZE_BILINEAR", x, out_hw, align_corners=True)
    matches = all(
        s is None or source_scale(size, out, s) == source_scale(size, out, None)
        for size, out, s in zip((h, w), out_hw, scales)
    )
    if matches:
        return _resize_nhwc(ctx, "RESIZE_BILINEAR", x, out_hw, half_pixel=True)
    weights = [linear_weights(size, out, False, s) for size, out, s in zip((h, w), out_hw, scales)]
    return _separable(ctx, x, *weights)


def _separable(ctx, x: Tensor, a_h: np.ndarray, a_w: np.ndarray) -> Tensor:
    """A_h @ x @ A_w^T on the last two axes: interpolation that is linear and separable,
    as two matmuls with constant (out, in) weight matrices."""
    n, c, h, w = x.shape
    options = {"adjX": False, "adjY": False, "asymmetricQuantizeInputs": False}
    rows = emit.op(ctx, "BATCH_MATMUL", [ctx.const(a_h.astype(x.dtype)), x], options,
                   shape=(n, c, a_h.shape[0], w), dtype=x.dtype)  # fmt: skip
    return emit.op(ctx, "BATCH_MATMUL", [rows, ctx.const(a_w.T.astype(x.dtype))], options,
                   shape=(n, c, a_h.shape[0], a_w.shape[0]), dtype=x.dtype)  # fmt: skip


@lowers(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d_vec(ctx, x, output_size, align_corners, scale_factors):
    return _upsample_bilinear(ctx, x, align_corners, _scales(scale_factors))


@lowers(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(ctx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bilinear(ctx, x, align_corners, _scales(None, scales_h, scales_w))


def _upsample_bicubic(ctx, x, align_corners, scales):
    """Bicubic is linear and separable: two matmuls with ATen's cubic weights (its
    decomposition traced for ~0.5 s per call, a quarter of a ViT's conversion)."""
    if x.rank != 4 or x.is_dynamic:
        raise NotImplementedError("bicubic interpolation of a static 4-D input only")
    out_hw = ctx.out_shape()[2:]
    weights = [cubic_weights(size, out, align_corners, s) for size, out, s in zip(x.shape[2:], out_hw, scales)]
    return _separable(ctx, x, *weights)


@lowers(aten.upsample_bicubic2d.vec)
def upsample_bicubic2d_vec(ctx, x, output_size, align_corners, scale_factors):
    return _upsample_bicubic(ctx, x, align_corners, _scales(scale_factors))


@lowers(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(ctx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bicubic(ctx, x, align_corners, _scales(None, scales_h, scales_w))


def _upsample_trilinear(ctx, x, align_corners, scales):
    """Separable: bilinear over (H, W) of every depth slice, then the depth axis as one
    matmul with PyTorch's constant linear weights (was a per-node decomposition trace)."""
    if x.rank != 5 or x.is_dynamic:
        raise NotImplementedError("trilinear upsampling of a static 5-D input only")
    n, c, d, h, w = x.shape
    od, oh, ow = ctx.out_shape()[2:]
    planes = _upsample_bilinear(ctx, emit.reshape(ctx, x, (n, c * d, h, w)), align_corners, scales[1:], (oh, ow))
    rows = emit.reshape(ctx, planes, (n, c, d, oh * ow))
    a_d = ctx.const(linear_weights(d, od, align_corners, scales[0]).astype(x.dtype))
    options = {"adjX": False, "adjY": False, "asymmetricQuantizeInputs": False}
    y = emit.op(ctx, "BATCH_MATMUL", [a_d, rows], options, shape=(n, c, od, oh * ow), dtype=x.dtype)
    return emit.reshape(ctx, y, (n, c, od, oh, ow))


@lowers(aten.upsample_trilinear3d.vec)
def upsample_trilinear3d_vec(ctx, x, output_size, align_corners, scale_factors):
    return _upsample_trilinear(ctx, x, align_corners, list(scale_factors) if scale_factors else [None] * 3)


@lowers(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(ctx, x, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_trilinear(ctx, x, align_corners, [scales_d, scales_h, scales_w])


# ---- grid_sample: sampling at positions given by a tensor -----------------------------------
# Coordinates are computed with elementwise ops (PyTorch's unnormalize, border clip or
# reflection), the input is flattened to (N*H*W, C) rows, and each corner is one GATHER of
# rows: bilinear weighs four corners, nearest takes one. With zeros padding a corner
# outside the image weighs 0; every gathered index is clamped into range.

GRID_MODES = {0: "bilinear", 1: "nearest"}
GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _f32(ctx, value) -> Tensor:
    return ctx.const(np.float32(value))


def _source_coordinate(ctx, g: Tensor, size: int, padding: str, align_corners: bool) -> Tensor:
    """PyTorch's grid_sampler_compute_source_index for one axis (float32)."""
    if align_corners:  # -1 -> 0, 1 -> size - 1
        x = emit.binary(ctx, "MUL", emit.binary(ctx, "ADD", g, _f32(ctx, 1)), _f32(ctx, (size - 1) / 2))
    else:  # -1 -> -0.5, 1 -> size - 0.5
        x = emit.binary(
            ctx,
            "SUB",
            emit.binary(ctx, "MUL", emit.binary(ctx, "ADD", g, _f32(ctx, 1)), _f32(ctx, size / 2)),
            _f32(ctx, 0.5),
        )
    if padding == "reflection":
        x = _reflect(ctx, x, *((0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)))
    if padding in ("border", "reflection"):
        x = emit.binary(ctx, "MINIMUM", emit.binary(ctx, "MAXIMUM", x, _f32(ctx, 0)), _f32(ctx, size - 1))
    return x


def _reflect(ctx, x: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """Reflect x into [twice_low / 2, twice_high / 2] (PyTorch's reflect_coordinates)."""
    if twice_low == twice_high:
        return emit.binary(ctx, "MUL", x, _f32(ctx, 0))
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = emit.unary(ctx, "ABS", emit.binary(ctx, "SUB", x, _f32(ctx, low)))
    extra = emit.binary(ctx, "FLOOR_MOD", distance, _f32(ctx, span))
    flips = emit.unary(ctx, "FLOOR", emit.binary(ctx, "DIV", distance, _f32(ctx, span)))
    even = emit.binary(ctx, "EQUAL", emit.binary(ctx, "FLOOR_MOD", flips, _f32(ctx, 2)), _f32(ctx, 0), dtype=np.bool_)
    forward = emit.binary(ctx, "ADD", extra, _f32(ctx, low))
    backward = emit.binary(ctx, "SUB", _f32(ctx, span + low), extra)
    return emit.op(ctx, "SELECT_V2", [even, forward, backward], shape=x.shape, dtype=x.dtype)


def _corner_rows(ctx, ix: Tensor, iy: Tensor, w: int, h: int, batch_offsets: Tensor) -> Tensor:
    """Row index into the (N*H*W, C) input of integer-valued float corners ix, iy (clamped)."""
    cx = emit.cast(
        ctx, emit.binary(ctx, "MINIMUM", emit.binary(ctx, "MAXIMUM", ix, _f32(ctx, 0)), _f32(ctx, w - 1)), np.int32
    )
    cy = emit.cast(
        ctx, emit.binary(ctx, "MINIMUM", emit.binary(ctx, "MAXIMUM", iy, _f32(ctx, 0)), _f32(ctx, h - 1)), np.int32
    )
    rows = emit.binary(ctx, "ADD", emit.binary(ctx, "MUL", cy, ctx.const(np.int32(w))), cx)
    return emit.reshape(ctx, emit.binary(ctx, "ADD", rows, batch_offsets), (int(np.prod(rows.shape)),))


def _inside(ctx, ix: Tensor, iy: Tensor, w: int, h: int) -> Tensor:
    """1.0 where the corner (ix, iy) lies in the image, else 0.0 (zeros padding)."""
    checks = [
        emit.binary(ctx, "GREATER_EQUAL", ix, _f32(ctx, 0), dtype=np.bool_),
        emit.binary(ctx, "LESS_EQUAL", ix, _f32(ctx, w - 1), dtype=np.bool_),
        emit.binary(ctx, "GREATER_EQUAL", iy, _f32(ctx, 0), dtype=np.bool_),
        emit.binary(ctx, "LESS_EQUAL", iy, _f32(ctx, h - 1), dtype=np.bool_),
    ]
    inside = checks[0]
    for check in checks[1:]:
        inside = emit.binary(ctx, "LOGICAL_AND", inside, check, dtype=np.bool_)
    return emit.cast(ctx, inside, np.float32)


@lowers(aten.affine_grid_generator.default)
def affine_grid_generator(ctx, theta, size, align_corners):
    """grid = [x, y, 1] @ theta^T over PyTorch's own base grid (a constant), as one
    BATCH_MATMUL (what the decomposition computes, without tracing it per call)."""
    if len(size) != 4 or theta.is_dynamic or theta.rank != 3:
        raise NotImplementedError("affine_grid_generator for 2-D grids of static shape only")
    n, c, h, w = (int(v) for v in size)
    with torch.no_grad():
        xy = torch.nn.functional.affine_grid(torch.eye(2, 3)[None], [1, c, h, w], align_corners=align_corners)
    base = torch.cat([xy, torch.ones(1, h, w, 1)], -1).reshape(1, h * w, 3).numpy().astype(theta.dtype)
    options = {"adjX": False, "adjY": True, "asymmetricQuantizeInputs": False}
    grid = emit.op(ctx, "BATCH_MATMUL", [ctx.const(base), theta], options, shape=(n, h * w, 2), dtype=theta.dtype)
    return emit.reshape(ctx, grid, (n, h, w, 2))


@lowers(aten.grid_sampler.default)
def grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    """What `F.grid_sample` exports as: the 2-D sampler for a 4-D input."""
    if x.rank != 4:
        raise NotImplementedError("grid_sampler on a non-4-D input")
    return grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_2d.default)
def grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    mode, padding = GRID_MODES.get(interpolation_mode), GRID_PADDING.get(padding_mode)
    if mode is None:
        raise emit.unsupported(ctx, "grid_sample with mode='bicubic'", "Use mode='bilinear' or 'nearest'.")
    if x.is_dynamic or grid.is_dynamic or x.dtype != np.float32:
        raise emit.unsupported(
            ctx, "grid_sample on dynamic shapes or non-float32 tensors", "Export with static shapes and float32 inputs."
        )
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    rows = emit.reshape(ctx, layout.to_nhwc(ctx, x), (n * h * w, c))
    gx = emit.reshape(ctx, emit.slice_axis(ctx, grid, 3, 0, 1), (n, ho, wo))
    gy = emit.reshape(ctx, emit.slice_axis(ctx, grid, 3, 1, 2), (n, ho, wo))
    ix = _source_coordinate(ctx, gx, w, padding, align_corners)
    iy = _source_coordinate(ctx, gy, h, padding, align_corners)
    batch_offsets = ctx.const((np.arange(n, dtype=np.int32) * h * w).reshape(n, 1, 1))

    def sample(cx: Tensor, cy: Tensor, weight: Tensor | None) -> Tensor:
        picked = emit.op(
            ctx,
            "GATHER",
            [rows, _corner_rows(ctx, cx, cy, w, h, batch_offsets)],
            {"axis": 0, "batchDims": 0},
            shape=(n * ho * wo, c),
            dtype=x.dtype,
        )
        if padding == "zeros":
            inside = _inside(ctx, cx, cy, w, h)
            weight = inside if weight is None else emit.binary(ctx, "MUL", weight, inside)
        if weight is None:
            return picked
        return emit.binary(ctx, "MUL", picked, emit.reshape(ctx, weight, (n * ho * wo, 1)))

    if mode == "nearest":
        out = sample(emit.unary(ctx, "ROUND", ix), emit.unary(ctx, "ROUND", iy), None)  # half to even, as nearbyint
    else:
        x0, y0 = emit.unary(ctx, "FLOOR", ix), emit.unary(ctx, "FLOOR", iy)
        x1, y1 = emit.binary(ctx, "ADD", x0, _f32(ctx, 1)), emit.binary(ctx, "ADD", y0, _f32(ctx, 1))
        wx1, wy1 = emit.binary(ctx, "SUB", ix, x0), emit.binary(ctx, "SUB", iy, y0)
        wx0, wy0 = emit.binary(ctx, "SUB", _f32(ctx, 1), wx1), emit.binary(ctx, "SUB", _f32(ctx, 1), wy1)
        out = None
        for cx, cy, wx, wy in ((x0, y0, wx0, wy0), (x1, y0, wx1, wy0), (x0, y1, wx0, wy1), (x1, y1, wx1, wy1)):
            term = sample(cx, cy, emit.binary(ctx, "MUL", wx, wy))
            out = term if out is None else emit.binary(ctx, "ADD", out, term)
    return layout.to_nchw(ctx, emit.reshape(ctx, out, (n, ho, wo, c)))
