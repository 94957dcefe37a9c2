"""Normalisation: batch norm (inference and batch statistics), group, instance and layer norm.

Inference batch norm with constant statistics is one MUL and one ADD by per-channel
constants shaped (C, 1, 1): the batch-norm folding pass folds them into a preceding
CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED. The others compute statistics with MEAN:

    d = x - mean(x);  y = d * rsqrt(mean(d * d) + eps)  [* weight + bias]

Weight norm (`nn.utils.weight_norm`) of constant parameters is computed now, a constant.

The returned tuples mirror the ATen ops' (out, mean, rstd) outputs; only `out` is ever
used after export, so the statistics are returned as None.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


def _affine(ctx, y: Tensor, weight, bias) -> Tensor:
    """y * weight + bias with per-channel (axis 1) weight and bias, either may be None."""
    rank = y.rank

    def per_channel(t):
        if t.is_const:
            return emit.channel_vector(ctx, t.data, rank, y.dtype)
        return emit.reshape(ctx, t, (t.shape[0],) + (1,) * (rank - 2))

    if weight is not None:
        y = emit.binary(ctx, "MUL", y, per_channel(weight))
    if bias is not None:
        y = emit.binary(ctx, "ADD", y, per_channel(bias))
    return y


def _normalize(ctx, x: Tensor, axes, eps: float) -> Tensor:
    """(x - mean) * rsqrt(var + eps), statistics over `axes` (biased variance)."""
    centered = emit.binary(ctx, "SUB", x, emit.mean(ctx, x, axes))
    variance = emit.mean(ctx, emit.binary(ctx, "MUL", centered, centered), axes)
    rstd = emit.unary(ctx, "RSQRT", emit.binary(ctx, "ADD", variance, emit.scalar_like(ctx, eps, x.dtype)))
    return emit.binary(ctx, "MUL", centered, rstd)


@lowers(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    rank = x.rank
    if all(t is None or t.is_const for t in (weight, bias, running_mean, running_var)):
        channels = running_mean.shape[0]
        w = weight.data if weight is not None else np.ones(channels)
        b = bias.data if bias is not None else np.zeros(channels)
        scale = w.astype(np.float64) / np.sqrt(running_var.data.astype(np.float64) + eps)
        shift = b - running_mean.data.astype(np.float64) * scale
        scaled = emit.binary(ctx, "MUL", x, emit.channel_vector(ctx, scale, rank, x.dtype))
        out = emit.binary(ctx, "ADD", scaled, emit.channel_vector(ctx, shift, rank, x.dtype))
        return out, None, None
    # Statistics that are activations (rare): compute the same formula with ops.
    mean = emit.reshape(ctx, running_mean, (running_mean.shape[0],) + (1,) * (rank - 2))
    var = emit.reshape(ctx, running_var, mean.shape)
    rstd = emit.unary(ctx, "RSQRT", emit.binary(ctx, "ADD", var, emit.scalar_like(ctx, eps, x.dtype)))
    y = emit.binary(ctx, "MUL", emit.binary(ctx, "SUB", x, mean), rstd)
    return _affine(ctx, y, weight, bias), None, None


@lowers(
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit_functional.default,
)
def batch_norm_batch_stats(ctx, x, weight, bias, *args):
    """Batch statistics (training-mode batch norm, and instance norm after its reshape):
    normalise over every axis but the channel axis 1."""
    eps = args[-1]
    axes = [0] + list(range(2, x.rank))
    y = _affine(ctx, _normalize(ctx, x, axes, eps), weight, bias)
    return (y, None, None) if len(ctx.meta) == 3 else (y, None, None, None, None)


@lowers(aten.native_group_norm.default)
def group_norm(ctx, x, weight, bias, n, c, hw, groups, eps):
    per_group = (x.shape[1] // groups) * int(np.prod(x.shape[2:], dtype=np.int64))
    grouped = emit.reshape(ctx, x, (x.shape[0], groups, per_group))
    y = emit.reshape(ctx, _normalize(ctx, grouped, [2], eps), x.shape)
    return _affine(ctx, y, weight, bias), None, None


@lowers(aten.native_layer_norm.default)
def layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    axes = list(range(x.rank - len(normalized_shape), x.rank))
    y = _normalize(ctx, x, axes, eps)
    # weight/bias have the normalized shape: they broadcast against the trailing axes as is.
    if weight is not None:
        y = emit.binary(ctx, "MUL", y, weight)
    if bias is not None:
        y = emit.binary(ctx, "ADD", y, bias)
    return y, None, None


# ---- the normalisation ops torch.export gives (lowered directly, not decomposed first) -----


@lowers(aten.batch_norm.default)
def batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    if not training and running_mean is not None and running_var is not None:
        return batch_norm_inference(ctx, x, weight, bias, running_mean, running_var, momentum, eps)[0]
    # Batch statistics; the running-statistics update does not exist at inference.
    return _affine(ctx, _normalize(ctx, x, [0] + list(range(2, x.rank)), eps), weight, bias)


@lowers(aten.layer_norm.default)
def layer_norm_whole(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return layer_norm(ctx, x, normalized_shape, weight, bias, eps)[0]


@lowers(aten.group_norm.default)
def group_norm_whole(ctx, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    if x.shape_signature is not None:
        raise NotImplementedError("group_norm with dynamic sizes")  # its decomposition handles them
    return group_norm(ctx, x, weight, bias, None, None, None, num_groups, eps)[0]


@lowers(aten._weight_norm.default)
def weight_norm(ctx, v, g, dim=0):
    """`nn.utils.weight_norm`'s weight, v * g / ||v|| (norm over every axis but `dim`; of
    the whole tensor for dim=-1), computed now from the constant v and g."""
    if not (v.is_const and g.is_const):
        raise NotImplementedError("weight norm of run-time tensors")  # its decomposition computes it
    data = np.asarray(v.data, np.float32)
    axes = tuple(range(data.ndim)) if dim == -1 else tuple(a for a in range(data.ndim) if a != dim % data.ndim)
    norm = np.sqrt(np.sum(data * data, axis=axes, keepdims=True))
    return ctx.const((data * (np.asarray(g.data, np.float32) / norm)).astype(v.dtype))
