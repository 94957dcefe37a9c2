"""RMSNorm and LayerNorm (forward and backward) as Pallas kernels, optionally fused with
the residual add before them, with their plain-JAX reference.

Both norms are one kernel body: LayerNorm subtracts the row mean and adds a bias
(`centered=True`), RMSNorm does neither. Rows are the flattened leading dims; the
normalised dims are one row of D values, held whole in a block (block_rows, D).

With `residual`, the kernel computes h = x + residual and y = norm(h), returning both
(pre-norm transformer blocks feed h to the next residual add): one read of x and
residual, two writes, instead of an add kernel plus a norm kernel.

Statistics are float32 (PyTorch's opmath for half inputs). Backward recomputes the
normalised rows from h and the saved mean/rstd; weight and bias gradients are summed
per row block inside the kernel and over blocks outside it. Ragged row counts use
partial edge blocks (rows past the end are masked out of the sums).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tuning
from kernels._common import cdiv, check_implementation, default_implementation, iota, tuning_backend

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


def _forward_kernel(*refs, centered, eps, has_residual, has_weight, has_bias):
    refs = list(refs)
    x = refs.pop(0)[...]
    if has_residual:
        x = x + refs.pop(0)[...]
    weight = refs.pop(0)[...].astype(jnp.float32) if has_weight else None
    bias = refs.pop(0)[...].astype(jnp.float32) if has_bias else None
    y_ref = refs.pop(0)
    h_ref = refs.pop(0) if has_residual else None
    mean_ref, rstd_ref = refs
    hf = x.astype(jnp.float32)
    mean = jnp.mean(hf, axis=1) if centered else jnp.zeros(hf.shape[:1], jnp.float32)
    centred = hf - mean[:, None]
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=1) + eps)
    y = centred * rstd[:, None]
    if has_weight:
        y = y * weight
    if has_bias:
        y = y + bias
    y_ref[...] = y.astype(y_ref.dtype)
    if has_residual:
        h_ref[...] = x.astype(h_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _backward_kernel(*refs, centered, rows, has_extra_grad, has_weight, has_bias):
    refs = list(refs)
    dy = refs.pop(0)[...].astype(jnp.float32)
    extra = refs.pop(0)[...].astype(jnp.float32) if has_extra_grad else None
    h = refs.pop(0)[...].astype(jnp.float32)
    weight = refs.pop(0)[...].astype(jnp.float32) if has_weight else None
    mean, rstd = refs.pop(0)[...], refs.pop(0)[...]
    dx_ref = refs.pop(0)
    block_rows = h.shape[0]
    valid = (iota(block_rows, pl.program_id(0) * block_rows) < rows)[:, None]
    x_hat = jnp.where(valid, (h - mean[:, None]) * rstd[:, None], 0.0)
    dy = jnp.where(valid, dy, 0.0)
    g = dy * weight if has_weight else dy
    dx = g - x_hat * jnp.mean(g * x_hat, axis=1, keepdims=True)
    if centered:
        dx = dx - jnp.mean(g, axis=1, keepdims=True)
    dx = dx * rstd[:, None]
    if has_extra_grad:
        dx = dx + extra  # the gradient reaching h from the residual stream
    dx_ref[...] = dx.astype(dx_ref.dtype)
    if has_weight:
        refs.pop(0)[...] = jnp.sum(dy * x_hat, axis=0, keepdims=True)
    if has_bias:
        refs.pop(0)[...] = jnp.sum(dy, axis=0, keepdims=True)


def _row_spec(block_rows, dim):
    return pl.BlockSpec((block_rows, dim), lambda i: (i, 0))


def _stat_spec(block_rows):
    return pl.BlockSpec((block_rows,), lambda i: (i,))


def _vector_spec(dim):
    return pl.BlockSpec((1, dim), lambda i: (0, 0))


@functools.partial(jax.jit, static_argnames=("config",))
def _forward(x, residual, weight, bias, config):
    centered, eps, impl, block_rows = config
    rows, dim = x.shape
    operands, specs = [x], [_row_spec(block_rows, dim)]
    if residual is not None:
        operands.append(residual)
        specs.append(_row_spec(block_rows, dim))
    for vector in (weight, bias):
        if vector is not None:
            operands.append(vector.reshape(1, dim))
            specs.append(_vector_spec(dim))
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
    out_specs = [_row_spec(block_rows, dim)]
    if residual is not None:
        out_shape.append(jax.ShapeDtypeStruct(x.shape, x.dtype))
        out_specs.append(_row_spec(block_rows, dim))
    out_shape += [jax.ShapeDtypeStruct((rows,), jnp.float32)] * 2
    out_specs += [_stat_spec(block_rows)] * 2
    kernel = functools.partial(
        _forward_kernel, centered=centered, eps=eps, has_residual=residual is not None,
        has_weight=weight is not None, has_bias=bias is not None,
    )
    outs = pl.pallas_call(
        kernel, out_shape=tuple(out_shape), grid=(cdiv(rows, block_rows),), in_specs=specs,
        out_specs=tuple(out_specs), interpret=impl == "interpret", name="norm_forward",
    )(*operands)
    if residual is None:
        y, mean, rstd = outs
        return y, x, mean, rstd
    return outs


@functools.partial(jax.jit, static_argnames=("config",))
def _backward(dy, dh, h, weight, bias, mean, rstd, config):
    centered, eps, impl, block_rows = config
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
    operands += [mean, rstd]
    specs += [_stat_spec(block_rows)] * 2
    partial_spec = pl.BlockSpec((None, 1, dim), lambda i: (i, 0, 0))
    partial_shape = jax.ShapeDtypeStruct((blocks, 1, dim), jnp.float32)
    out_shape, out_specs = [jax.ShapeDtypeStruct(h.shape, h.dtype)], [_row_spec(block_rows, dim)]
    for vector in (weight, bias):
        if vector is not None:
            out_shape.append(partial_shape)
            out_specs.append(partial_spec)
    kernel = functools.partial(
        _backward_kernel, centered=centered, rows=rows, has_extra_grad=dh is not None,
        has_weight=weight is not None, has_bias=bias is not None,
    )
    outs = list(pl.pallas_call(
        kernel, out_shape=tuple(out_shape), grid=(blocks,), in_specs=specs,
        out_specs=tuple(out_specs), interpret=impl == "interpret", name="norm_backward",
    )(*operands))
    dx = outs.pop(0)
    dw = outs.pop(0).sum(axis=(0, 1)).astype(weight.dtype) if weight is not None else None
    db = outs.pop(0).sum(axis=(0, 1)).astype(bias.dtype) if bias is not None else None
    return dx, dw, db


# --------------------------------------------------------------------------- public API


def resolve_config(x, centered, eps, impl=None, block_rows=None) -> tuple:
    """The static part of a call on (N, D) rows: (centered, eps, impl, block_rows)."""
    impl = check_implementation(impl or default_implementation())
    tuned = tuning.blocks("norm", tuning_backend(impl), x.shape[0], x.shape[1])
    return (bool(centered), float(eps), impl, block_rows or tuned["block_rows"])


def norm_forward(x, residual, weight, bias, config):
    """(y, h, mean, rstd) on (N, D) rows for a resolved config."""
    if config[2] == "reference":
        return norm_reference(x, residual, weight, bias, config[0], config[1])
    return _forward(x, residual, weight, bias, config)


def norm_backward(dy, dh, h, weight, bias, mean, rstd, config):
    """(dx, dweight, dbias): dx is also the residual's gradient; `dh` is the gradient
    reaching h directly (None when h is not used)."""
    if config[2] == "reference":
        centered, eps = config[:2]
        _, vjp = jax.vjp(lambda a, w, b: norm_reference(a, None, w, b, centered, eps)[0], h, weight, bias)
        dx, dw, db = vjp(dy)
        return (dx if dh is None else dx + dh), dw, db
    return _backward(dy, dh, h, weight, bias, mean, rstd, config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _norm(x, residual, weight, bias, config):
    y, h, _, _ = norm_forward(x, residual, weight, bias, config)
    return y, h


def _norm_fwd(x, residual, weight, bias, config):
    y, h, mean, rstd = norm_forward(x, residual, weight, bias, config)
    return (y, h), (h, weight, bias, mean, rstd, residual is not None)


def _norm_bwd(config, saved, grads):
    h, weight, bias, mean, rstd, has_residual = saved
    dy, dh = grads
    dx, dw, db = norm_backward(dy, dh, h, weight, bias, mean, rstd, config)
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
