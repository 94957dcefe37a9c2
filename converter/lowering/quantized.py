"""torch.ao PT2E / QAT quantize and dequantize ops (`quantized_decomposed.*`).

A `convert_pt2e` model carries int8 weights with `dequantize_per_channel` and activation
fake-quantization as `quantize_per_tensor` -> `dequantize_per_tensor` pairs.
- Dequantizing a constant weight becomes a float constant holding exactly q * scale, so
  the usual numpy weight rearrangements (OIHW -> OHWI ...) apply; re-quantizing it
  symmetric per channel gives the same integers when the channel reaches +-127 (what
  PT2E's symmetric weight observers produce).
- Activation pairs become QUANTIZE -> DEQUANTIZE ops: the float model runs as PyTorch's
  fake-quantized one, and `converter.quantize.qdq.absorb_qdq` later turns each pair into
  fixed parameters for full-integer quantization.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.ao.quantization.fx import _decomposed  # noqa: F401  (defines the quantized_decomposed ops)

from converter import ir
from converter.lowering.context import numpy_dtype
from converter.lowering.registry import lowers
from converter.quantize.numerics import dequantize_values

qd = torch.ops.quantized_decomposed


def _number(value) -> float:
    """A scale or zero point given as a Python number or a one-element constant."""
    if isinstance(value, ir.Tensor):
        if not value.is_const:
            raise NotImplementedError("quantization parameters computed at run time (dynamic quantization)")
        return np.asarray(value.data).reshape(-1)[0].item()
    return value


def _params(scale, zero_point) -> ir.QuantParams:
    return ir.QuantParams(np.asarray([_number(scale)], np.float32), np.asarray([int(_number(zero_point))], np.int64))


@lowers(qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor)
def quantize_per_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype):
    out = ctx.tensor(x.shape, numpy_dtype(dtype), signature=x.shape_signature)
    out.quant = _params(scale, zero_point)
    ctx.graph.ops.append(ir.Op("QUANTIZE", [x], [out], source=ctx.source))
    return out


@lowers(qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor)
def dequantize_per_tensor(ctx, q, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    params = _params(scale, zero_point)
    if q.is_const:
        return ctx.const(dequantize_values(q.data, params.scale, params.zero_point), name=f"{q.name}_dequantized")
    if q.quant is None:
        q.quant = params
    return ctx.emit("DEQUANTIZE", [q], shape=q.shape, signature=q.shape_signature, dtype=np.float32)


@lowers(qd.dequantize_per_channel.default)
def dequantize_per_channel(ctx, q, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None):
    if not (q.is_const and scales.is_const and (zero_points is None or zero_points.is_const)):
        raise NotImplementedError("per-channel dequantize of a computed tensor (only constant weights are supported)")
    zeros = np.zeros(1) if zero_points is None else zero_points.data
    values = dequantize_values(q.data, scales.data, zeros, axis % q.rank)
    return ctx.const(values, name=f"{q.name}_dequantized")
