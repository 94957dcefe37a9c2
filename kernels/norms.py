"""RMSNorm and LayerNorm (forward and backward) as Pallas kernels, optionally fused with
the residual add before them, with their plain-JAX reference.

Both norms are one kernel body: LayerNorm subtracts the row mean and adds a bias
(`centered=True`), RMSNorm does neither. Rows are the flattened leading dims; the
normalised dims are one row of D values, held whole in a block (block_rows, D).

With `residual`, the kernel computes h = x + residual and y = norm(h), returning both
(pre-norm transformer blocks feed h to the next residual add): one read of x and
residual, two writes, instead of an add kernel plus a norm kernel.

Statistics are float32 (PyTorch's opmath for half inputs). Backward recomputes the
row statistics and normalised rows from h (no per-row vector is stored: on a TPU a
(rows,) output would be a narrow, padded layout); weight and bias gradients are summed
per row block inside the kernel and over blocks outside it. Ragged row counts use
partial edge blocks (rows past the end are masked out of the sums).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tpu, tuning
from kernels._common import (
    cdiv,
    check_implementation,
    cost,
    default_implementation,
    kernel_program,
    nbytes,
    pallas_options,
    positions,
    tuning_backend,
)

# --------------------------------------------------------------------------- reference


def norm_reference(x, residual, weight, bias, centered, eps):
    """(y, h, mean, rstd): h = x + residual (or x), y = normalise(h) * weight + bias.
    x is (N, D); mean and rstd are float32 (N,); mean is zeros when not centered."""
    h = x if residual is None else x + residual
    hf = h.astype(jnp.float32)
    mean = jnp.mean(hf, axis=-1) if centered else jnp.zeros(hf.shape[:-1], jnp.float32)
    centred = hf - mean[:, None]
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1) + eps)
    y = centred * rstd[:, None]
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype), h, mean, rstd


# --------------------------------------------------------------------------- kernels
#
# One program per row block ("parallel" grid). No per-row statistic leaves a kernel: the
# backward recomputes mean and rstd from h (one more reduction over a row it reads
# anyway), so nothing narrower than a (block_rows, D) tile is ever stored.


def _statistics(hf, centered, eps):
    """Row mean (zeros when not centered) and rstd, float32, as (rows, 1) columns."""
    mean = jnp.mean(hf, axis=1, keepdims=True) if centered else jnp.zeros((hf.shape[0], 1), jnp.float32)
    centred = hf - mean
    return mean, jax.lax.rsqrt(jnp.mean(centred * centred, axis=1, keepdims=True) + eps)


def _forward_kernel(*refs, centered, eps, has_residual, has_weight, has_bias):
    refs = list(refs)
    x = refs.pop(0)[...]
    if has_residual:
        x = x + refs.pop(0)[...]
    weight = refs.pop(0)[...].astype(jnp.float32) if has_weight else None
    bias = refs.pop(0)[...].astype(jnp.float32) if has_bias else None
    y_ref = refs.pop(0)
    hf = x.astype(jnp.float32)
    mean, rstd = _statistics(hf, centered, eps)
    y = (hf - mean) * rstd
    if has_weight:
        y = y * weight
    if has_bias:
        y = y + bias
    y_ref[...] = y.astype(y_ref.dtype)
    if has_residual:
        refs.pop(0)[...] = x.astype(y_ref.dtype)


def _backward_kernel(*refs, centered, eps, rows, has_extra_grad, has_weight, has_bias):
    refs = list(refs)
    dy = refs.pop(0)[...].astype(jnp.float32)
    extra = refs.pop(0)[...].astype(jnp.float32) if has_extra_grad else None
    h = refs.pop(0)[...].astype(jnp.float32)
    weight = refs.pop(0)[...].astype(jnp.float32) if has_weight else None
    dx_ref = refs.pop(0)
    block_rows = h.shape[0]
    if rows % block_rows:  # rows past the end of a partial block hold garbage
        valid = positions(h.shape, 0, pl.program_id(0) * block_rows) < rows
        h, dy = jnp.where(valid, h, 0.0), jnp.where(valid, dy, 0.0)
    mean, rstd = _statistics(h, centered, eps)
    x_hat = (h - mean) * rstd
    g = dy * weight if has_weight else dy
    dx = g - x_hat * jnp.mean(g * x_hat, axis=1, keepdims=True)
    if centered:
        dx = dx - jnp.mean(g, axis=1, keepdims=True)
    dx = dx * rstd
    if has_extra_grad:
        dx = dx + extra  # the gradient reaching h from the residual stream
    dx_ref[...] = dx.astype(dx_ref.dtype)
    if has_weight:
        refs.pop(0)[...] = jnp.sum(dy * x_hat, axis=0, keepdims=True)
    if has_bias:
        refs.pop(0)[...] = jnp.sum(dy, axis=0, keepdims=True)


# --------------------------------------------------------------------------- pallas calls


def norm_blocks(rows, dim, dtype, config, *, residual=False, weight=True, bias=False, backward=False) -> list:
    """The blocks of the forward (or backward) pallas_call as `kernels.tpu` checks them."""
    br = config.blocks.block_rows
    tile = tpu.Block("x", (rows, dim), (br, dim), dtype)
    vector = tpu.Block("weight", (1, dim), (1, dim), dtype)
    if not backward:
        blocks = [tile] + ([dataclasses.replace(tile, name="residual")] if residual else [])
        blocks += [vector] * weight + [dataclasses.replace(vector, name="bias")] * bias
        blocks += [dataclasses.replace(tile, name="y", role="out")]
        return blocks + ([dataclasses.replace(tile, name="h", role="out")] if residual else [])
    blocks = [dataclasses.replace(tile, name="dy")] + ([dataclasses.replace(tile, name="dh")] if residual else [])
    blocks += [dataclasses.replace(tile, name="h")] + [vector] * weight
    blocks += [dataclasses.replace(tile, name="dx", role="out")]
    partial = tpu.Block("dweight", (cdiv(rows, br), 1, dim), (None, 1, dim), jnp.float32, "out")
    return blocks + [partial] * weight + [dataclasses.replace(partial, name="dbias")] * bias


def _row_spec(block_rows, dim):
    return pl.BlockSpec((block_rows, dim), lambda i: (i, 0))


def _vector_spec(dim):
    return pl.BlockSpec((1, dim), lambda i: (0, 0))


@kernel_program
def _forward(x, residual, weight, bias, config):
    block_rows = config.blocks.block_rows
    rows, dim = x.shape
    operands, specs = [x], [_row_spec(block_rows, dim)]
    if residual is not None:
        operands.append(residual)
        specs.append(_row_spec(block_rows, dim))
    for vector in (weight, bias):
        if vector is not None:
            operands.append(vector.reshape(1, dim))
            specs.append(_vector_spec(dim))
    outputs = 1 if residual is None else 2
    kernel = functools.partial(
        _forward_kernel,
        centered=config.centered,
        eps=config.eps,
        has_residual=residual is not None,
        has_weight=weight is not None,
        has_bias=bias is not None,
    )
    outs = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),) * outputs,
        grid=(cdiv(rows, block_rows),),
        in_specs=specs,
        out_specs=(_row_spec(block_rows, dim),) * outputs,
        cost_estimate=cost(8 * x.size, rows, nbytes(*operands) + outputs * nbytes(x)),
        name="norm_forward",
        **pallas_options(config.impl, "parallel"),
    )(*operands)
    return outs[0], (x if residual is None else outs[1])


@kernel_program
def _backward(dy, dh, h, weight, bias, config):
    block_rows = config.blocks.block_rows
    rows, dim = h.shape
    blocks = cdiv(rows, block_rows)
    operands, specs = [dy], [_row_spec(block_rows, dim)]
    if dh is not None:
        operands.append(dh)
        specs.append(_row_spec(block_rows, dim))
    operands.append(h)
    specs.append(_row_spec(block_rows, dim))
    if weight is not None:
        operands.append(weight.reshape(1, dim))
        specs.append(_vector_spec(dim))
    partial_spec = pl.BlockSpec((None, 1, dim), lambda i: (i, 0, 0))
    partial_shape = jax.ShapeDtypeStruct((blocks, 1, dim), jnp.float32)
    out_shape, out_specs = [jax.ShapeDtypeStruct(h.shape, h.dtype)], [_row_spec(block_rows, dim)]
    for vector in (weight, bias):
        if vector is not None:
            out_shape.append(partial_shape)
            out_specs.append(partial_spec)
    kernel = functools.partial(
        _backward_kernel,
        centered=config.centered,
        eps=config.eps,
        rows=rows,
        has_extra_grad=dh is not None,
        has_weight=weight is not None,
        has_bias=bias is not None,
    )
    outs = list(
        pl.pallas_call(
            kernel,
            out_shape=tuple(out_shape),
            grid=(blocks,),
            in_specs=specs,
            out_specs=tuple(out_specs),
            cost_estimate=cost(14 * h.size, rows, nbytes(*operands) + nbytes(h)),
            name="norm_backward",
            **pallas_options(config.impl, "parallel"),
        )(*operands)
    )
    dx = outs.pop(0)
    dw = outs.pop(0).sum(axis=(0, 1)).astype(weight.dtype) if weight is not None else None
    db = outs.pop(0).sum(axis=(0, 1)).astype(bias.dtype) if bias is not None else None
    return dx, dw, db


# --------------------------------------------------------------------------- public API


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """The static part of a call (hashable: jitted programs are keyed by it)."""

    centered: bool
    eps: float
    impl: str
    blocks: tuning.NormBlocks


def resolve_config(x, centered, eps, impl=None, block_rows=None) -> NormConfig:
    """The static part of a call on (N, D) rows."""
    impl = check_implementation(impl or default_implementation())
    tuned = tuning.blocks("norm", tuning_backend(impl), x.shape[0], x.shape[1])
    return NormConfig(bool(centered), float(eps), impl, tuning.with_explicit(tuned, block_rows=block_rows))


def norm_forward(x, residual, weight, bias, config: NormConfig):
    """(y, h) on (N, D) rows for a resolved config; h = x + residual (x without one)."""
    if config.impl == "reference":
        return norm_reference(x, residual, weight, bias, config.centered, config.eps)[:2]
    return _forward(x, residual, weight, bias, config)


def norm_backward(dy, dh, h, weight, bias, config: NormConfig):
    """(dx, dweight, dbias): dx is also the residual's gradient; `dh` is the gradient
    reaching h directly (None when h is not used)."""
    if config.impl == "reference":
        _, vjp = jax.vjp(lambda a, w, b: norm_reference(a, None, w, b, config.centered, config.eps)[0], h, weight, bias)
        dx, dw, db = vjp(dy)
        return (dx if dh is None else dx + dh), dw, db
    return _backward(dy, dh, h, weight, bias, config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _norm(x, residual, weight, bias, config):
    return norm_forward(x, residual, weight, bias, config)


def _norm_fwd(x, residual, weight, bias, config):
    y, h = norm_forward(x, residual, weight, bias, config)
    return (y, h), (h, weight, bias, residual is not None)


def _norm_bwd(config, saved, grads):
    h, weight, bias, has_residual = saved
    dy, dh = grads
    dx, dw, db = norm_backward(dy, dh, h, weight, bias, config)
    return dx, (dx if has_residual else None), dw, db


_norm.defvjp(_norm_fwd, _norm_bwd)


def _apply(x, residual, weight, bias, centered, eps, impl, block_rows):
    dim = x.shape[-1]
    if weight is not None and weight.shape != (dim,) or bias is not None and bias.shape != (dim,):
        raise ValueError(f"norm: weight and bias must have shape ({dim},) for input {x.shape}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"norm: residual {residual.shape} must have the input's shape {x.shape}")
    rows = x.reshape(-1, dim)
    res = None if residual is None else residual.reshape(-1, dim)
    config = resolve_config(rows, centered, eps, impl, block_rows)
    y, h = _norm(rows, res, weight, bias, config)
    y = y.reshape(x.shape)
    return y if residual is None else (y, h.reshape(x.shape))


def rms_norm(x, weight=None, *, eps=1e-6, residual=None, impl=None, block_rows=None):
    """RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight. With `residual`:
    returns (rms_norm(x + residual), x + residual). impl: see `kernels._common`."""
    return _apply(x, residual, weight, None, False, eps, impl, block_rows)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None, impl=None, block_rows=None):
    """LayerNorm over the last dim. With `residual`: returns (layer_norm(x + residual), x + residual)."""
    return _apply(x, residual, weight, bias, True, eps, impl, block_rows)
