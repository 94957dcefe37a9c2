"""The arithmetic of quantization: scales, zero points, rounding, int4 packing.

Conventions (TFLite's): real = scale * (q - zero_point). Weights are symmetric
(zero point 0, int8 range [-127, 127]) and per output channel; activations are
per-tensor, asymmetric for int8 and symmetric (zero point 0) for int16; biases are
int32 (int64 under int16 activations) with scale = input scale * weight scale and zero
point 0. Every activation range is widened to contain 0, so zero padding and ReLU's
floor are exact.
"""

from __future__ import annotations

import numpy as np

QMIN = {np.dtype(np.int8): -128, np.dtype(np.uint8): 0, np.dtype(np.int16): -32768}
QMAX = {np.dtype(np.int8): 127, np.dtype(np.uint8): 255, np.dtype(np.int16): 32767}
_TINY = 1e-8


def per_channel_symmetric(w: np.ndarray, axis: int, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scales): symmetric per-channel along `axis`, range
    [-(2^(bits-1) - 1), 2^(bits-1) - 1]."""
    qmax = 2 ** (bits - 1) - 1
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=reduce_axes) if reduce_axes else np.abs(w)
    scale = np.maximum(amax, _TINY).astype(np.float32) / qmax
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale.astype(np.float32)


def blockwise_int4(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values in [-7, 7], float16 scales of shape (rows, cols / block_size)):
    symmetric int4 per block of `block_size` consecutive elements along the last axis of
    a 2-D weight. The scales are rounded to float16 first, so the values are quantized
    with exactly the scale the runtime will use."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // block_size, block_size)
    scale = (np.maximum(np.max(np.abs(blocks), axis=2), _TINY) / 7).astype(np.float16)
    scale = np.where(scale == 0, np.float16(6e-8), scale)  # fp16 underflow of a tiny block
    q = np.clip(np.round(blocks / scale.astype(np.float32)[..., None]), -7, 7).astype(np.int8)
    return q.reshape(rows, cols), scale


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Two int4 values per byte, the first in the low nibble (TFLite's INT4 layout)."""
    flat = q.reshape(-1).astype(np.int8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    low = flat[0::2].astype(np.uint8) & 0x0F
    high = (flat[1::2].astype(np.uint8) & 0x0F) << 4
    return (low | high).astype(np.uint8)


def activation_params(lo: float, hi: float, dtype) -> tuple[float, int]:
    """(scale, zero point) covering [lo, hi] (widened to contain 0) in `dtype`:
    asymmetric for int8/uint8, symmetric for int16."""
    dtype = np.dtype(dtype)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if dtype == np.int16:
        return max(max(-lo, hi), _TINY) / 32767, 0
    qmin, qmax = QMIN[dtype], QMAX[dtype]
    scale = max(hi - lo, _TINY) / (qmax - qmin)
    zero_point = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return scale, zero_point


def quantize_values(x: np.ndarray, scale, zero_point, dtype, axis: int = 0) -> np.ndarray:
    """Affine quantization of a constant (per-tensor, or per-channel along `axis`)."""
    dtype = np.dtype(dtype)
    scale, zero_point = np.asarray(scale, np.float64), np.asarray(zero_point, np.float64)
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    lo, hi = (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return np.asarray(np.clip(np.round(x / scale) + zero_point, lo, hi)).astype(dtype)


def dequantize_values(q: np.ndarray, scale, zero_point, axis: int = 0) -> np.ndarray:
    scale, zero_point = np.asarray(scale, np.float64), np.asarray(zero_point, np.float64)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return ((q.astype(np.float64) - zero_point) * scale).astype(np.float32)
