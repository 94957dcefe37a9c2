"""Softmax cross-entropy over a large vocabulary (forward and backward) as Pallas
kernels, chunked over the vocabulary, with its plain-JAX reference.

logits (N, V), integer targets (N,), `ignore_index` rows contribute nothing.

Forward: a 2-D grid over (row block, vocabulary chunk); each program writes its chunk's
row max and sum of exponentials, and the (N, chunks) partials are merged outside into
the logsumexp (N,). The target logit is a gather. Nothing of size (N, V) is written.
Backward: the same grid writes d logits = (exp(logits - lse) - onehot(target)) * g per
tile straight from the logits and the saved logsumexp: no log-softmax or probability
matrix is ever stored (the decomposed path keeps a float32 (N, V) log-softmax alive from
forward to backward). Vocabulary sizes that are not a multiple of the chunk use partial
edge tiles, masked inside the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tuning
from kernels._common import cdiv, check_implementation, default_implementation, iota, tuning_backend

REDUCTIONS = ("none", "mean", "sum")

# --------------------------------------------------------------------------- reference


def cross_entropy_reference(logits, targets, ignore_index=-100):
    """(per-row loss (N,) float32, logsumexp (N,) float32); ignored rows have loss 0."""
    x = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(x, axis=-1)
    valid = targets != ignore_index
    picked = jnp.take_along_axis(x, jnp.where(valid, targets, 0)[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return jnp.where(valid, lse - picked, 0.0), lse


# --------------------------------------------------------------------------- kernels


def _partials_kernel(x_ref, max_ref, sum_ref, *, vocab):
    block_rows, block_vocab = x_ref.shape
    columns = iota(block_vocab, pl.program_id(1) * block_vocab)
    x = jnp.where((columns < vocab)[None, :], x_ref[...].astype(jnp.float32), -jnp.inf)
    row_max = jnp.max(x, axis=1)
    safe_max = jnp.where(row_max == -jnp.inf, 0.0, row_max)
    max_ref[...] = row_max
    sum_ref[...] = jnp.sum(jnp.exp(x - safe_max[:, None]), axis=1)


def _grad_kernel(x_ref, target_ref, lse_ref, scale_ref, dx_ref, *, vocab):
    block_rows, block_vocab = x_ref.shape
    columns = iota(block_vocab, pl.program_id(1) * block_vocab)
    x = jnp.where((columns < vocab)[None, :], x_ref[...].astype(jnp.float32), -jnp.inf)
    probs = jnp.exp(x - lse_ref[...][:, None])
    one_hot = (columns[None, :] == target_ref[...][:, None]).astype(jnp.float32)
    dx_ref[...] = ((probs - one_hot) * scale_ref[...][:, None]).astype(dx_ref.dtype)


@functools.partial(jax.jit, static_argnames=("config",))
def _forward(logits, targets, config):
    ignore_index, impl, block_rows, block_vocab = config
    rows, vocab = logits.shape
    chunks = cdiv(vocab, block_vocab)
    partial_spec = pl.BlockSpec((None, block_rows), lambda i, c: (c, i))
    partial_shape = jax.ShapeDtypeStruct((chunks, rows), jnp.float32)
    maxes, sums = pl.pallas_call(
        functools.partial(_partials_kernel, vocab=vocab),
        out_shape=(partial_shape, partial_shape),
        grid=(cdiv(rows, block_rows), chunks),
        in_specs=[pl.BlockSpec((block_rows, block_vocab), lambda i, c: (i, c))],
        out_specs=(partial_spec, partial_spec),
        interpret=impl == "interpret",
        name="cross_entropy_forward",
    )(logits)
    row_max = jnp.max(maxes, axis=0)
    safe_max = jnp.where(row_max == -jnp.inf, 0.0, row_max)
    chunk_max = jnp.where(maxes == -jnp.inf, safe_max, maxes)
    lse = safe_max + jnp.log(jnp.sum(sums * jnp.exp(chunk_max - safe_max), axis=0))
    valid = targets != ignore_index
    safe_targets = jnp.where(valid, targets, 0).astype(jnp.int32)
    picked = jnp.take_along_axis(logits, safe_targets[:, None], axis=-1)[:, 0].astype(jnp.float32)
    return jnp.where(valid, lse - picked, 0.0), lse


@functools.partial(jax.jit, static_argnames=("config",))
def _backward(grad_losses, logits, targets, lse, config):
    ignore_index, impl, block_rows, block_vocab = config
    rows, vocab = logits.shape
    valid = targets != ignore_index
    scale = jnp.where(valid, grad_losses.astype(jnp.float32), 0.0)
    row_spec = pl.BlockSpec((block_rows,), lambda i, c: (i,))
    tile_spec = pl.BlockSpec((block_rows, block_vocab), lambda i, c: (i, c))
    return pl.pallas_call(
        functools.partial(_grad_kernel, vocab=vocab),
        out_shape=jax.ShapeDtypeStruct(logits.shape, logits.dtype),
        grid=(cdiv(rows, block_rows), cdiv(vocab, block_vocab)),
        in_specs=[tile_spec, row_spec, row_spec, row_spec],
        out_specs=tile_spec,
        interpret=impl == "interpret",
        name="cross_entropy_backward",
    )(logits, jnp.where(valid, targets, -1).astype(jnp.int32), lse, scale)


# --------------------------------------------------------------------------- public API


def resolve_config(logits, ignore_index=-100, impl=None, block_rows=None, block_vocab=None) -> tuple:
    """The static part of a call: (ignore_index, impl, block_rows, block_vocab)."""
    impl = check_implementation(impl or default_implementation())
    tuned = tuning.blocks("cross_entropy", tuning_backend(impl), *logits.shape)
    return (int(ignore_index), impl, block_rows or tuned["block_rows"], block_vocab or tuned["block_vocab"])


def cross_entropy_forward(logits, targets, config):
    """(per-row loss (N,) float32, logsumexp (N,) float32) for a resolved config."""
    if config[1] == "reference":
        return cross_entropy_reference(logits, targets, config[0])
    return _forward(logits, targets, config)


def cross_entropy_backward(grad_losses, logits, targets, lse, config):
    """d logits for the per-row loss gradient `grad_losses` (N,)."""
    if config[1] == "reference":
        _, vjp = jax.vjp(lambda x: cross_entropy_reference(x, targets, config[0])[0], logits)
        return vjp(grad_losses.astype(jnp.float32))[0]
    return _backward(grad_losses, logits, targets, lse, config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _losses(logits, targets, config):
    return cross_entropy_forward(logits, targets, config)[0]


def _losses_fwd(logits, targets, config):
    losses, lse = cross_entropy_forward(logits, targets, config)
    return losses, (logits, targets, lse)


def _losses_bwd(config, saved, grad_losses):
    logits, targets, lse = saved
    return cross_entropy_backward(grad_losses, logits, targets, lse, config), None


_losses.defvjp(_losses_fwd, _losses_bwd)


def cross_entropy(logits, targets, *, ignore_index=-100, reduction="mean", impl=None, block_rows=None, block_vocab=None):
    """Softmax cross-entropy of (N, V) logits against (N,) class indices, like
    `F.cross_entropy` (mean over non-ignored rows by default). Differentiable in logits."""
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (N, V) and targets (N,); got {logits.shape} and {targets.shape}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    config = resolve_config(logits, ignore_index, impl, block_rows, block_vocab)
    losses = _losses(logits, targets, config)
    if reduction == "none":
        return losses.astype(logits.dtype)
    total = jnp.sum(losses)
    if reduction == "sum":
        return total.astype(logits.dtype)
    return (total / jnp.sum(targets != ignore_index)).astype(logits.dtype)
