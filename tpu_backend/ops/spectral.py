"""Discrete Fourier transforms (the three ATen primitives every torch.fft/stft call reaches)
and building complex tensors from real parts.

ATen's `normalization` argument: 0 none, 1 by 1/sqrt(n), 2 by 1/n, where n is the product
of the signal sizes over `dim` (for c2r, the sizes of the real output). JAX's transforms
are taken unnormalized (`norm="backward"` forward, `norm="forward"` inverse) and scaled once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops._common import canonical_dim
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _axes(dim, ndim: int) -> tuple[int, ...]:
    """`dim` in the caller's order: the last one is the halved axis of r2c/c2r."""
    return tuple(canonical_dim(d, ndim) for d in dim)


def _normalized(out, signal_sizes, normalization: int):
    n = math.prod(signal_sizes)
    if normalization == 0 or n == 0:
        return out
    scale = 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n
    return out * jnp.asarray(scale, dtype=jnp.real(out).dtype)


@lowers(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    axes = _axes(dim, x.ndim)
    out = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return _normalized(out, [x.shape[a] for a in axes], normalization)


@lowers(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    axes = _axes(dim, x.ndim)
    out = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _normalized(out, [x.shape[a] for a in axes], normalization)


@lowers(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    axes = _axes(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [int(last_dim_size)]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _normalized(out, sizes, normalization)


@lowers(aten.complex.default)
def complex_from_parts(real, imag):
    return jax.lax.complex(*jnp.broadcast_arrays(real, imag))


@lowers(aten.polar.default)
def polar(magnitude, angle):
    return jax.lax.complex(*jnp.broadcast_arrays(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle)))
