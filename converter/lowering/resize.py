"""Interpolation: nearest and bilinear upsampling (align_corners both ways).

RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR (NHWC, wrapped in the layout transposes) are
used whenever they sample exactly the source positions PyTorch samples:
- bilinear, align_corners=True -> alignCorners=True (both scale by (in-1)/(out-1));
- bilinear, align_corners=False -> halfPixelCenters=True, when PyTorch's scale (1/scale_factor
  if given, else in/out) equals TFLite's in/out;
- nearest -> plain RESIZE_NEAREST_NEIGHBOR when floor(dst * scale) picks the same rows.
Otherwise the exact PyTorch sampling is reproduced: nearest as constant GATHERs, bilinear
(linear and separable) as two matmuls with constant interpolation matrices.
"""

from __future__ import annotations

import numpy as np
import torch

from common.resampling import linear_weights, nearest_indices, source_scale
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
    y = emit.op(ctx, opcode, [layout.to_nhwc(ctx, x), emit.int32(ctx, out_hw)],
                {"alignCorners": align_corners, "halfPixelCenters": half_pixel},
                shape=(n, *out_hw, c), dtype=x.dtype)
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
        x = emit.op(ctx, "GATHER", [x, emit.int32(ctx, rows)], {"axis": axis, "batchDims": 0},
                    shape=shape, dtype=x.dtype)
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


def _upsample_bilinear(ctx, x, align_corners, scales):
    if x.rank != 4:
        raise emit.unsupported(ctx, f"bilinear interpolation of a rank-{x.rank} tensor", "Use 4-D (N, C, H, W) input.")
    n, c, h, w = x.shape
    out_hw = ctx.out_shape()[2:]
    if align_corners:
        return _resize_nhwc(ctx, "RESIZE_BILINEAR", x, out_hw, align_corners=True)
    matches = all(s is None or source_scale(size, out, s) == source_scale(size, out, None)
                  for size, out, s in zip((h, w), out_hw, scales))
    if matches:
        return _resize_nhwc(ctx, "RESIZE_BILINEAR", x, out_hw, half_pixel=True)
    a_h = ctx.const(linear_weights(h, out_hw[0], False, scales[0]).astype(x.dtype))
    a_w_t = ctx.const(linear_weights(w, out_hw[1], False, scales[1]).T.astype(x.dtype))
    options = {"adjX": False, "adjY": False, "asymmetricQuantizeInputs": False}
    rows = emit.op(ctx, "BATCH_MATMUL", [a_h, x], options, shape=(n, c, out_hw[0], w), dtype=x.dtype)
    return ctx.emit("BATCH_MATMUL", [rows, a_w_t], options)


@lowers(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d_vec(ctx, x, output_size, align_corners, scale_factors):
    return _upsample_bilinear(ctx, x, align_corners, _scales(scale_factors))


@lowers(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(ctx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_bilinear(ctx, x, align_corners, _scales(None, scales_h, scales_w))
