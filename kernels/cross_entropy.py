"""Softmax cross-entropy over a large vocabulary (forward and backward) as Pallas
kernels, chunked over the vocabulary, with its plain-JAX reference.

logits (N, V), integer targets (N,), `ignore_index` rows contribute nothing.

Forward: a 2-D grid over (row block, vocabulary chunk), chunks sequential, keeping an
online logsumexp per row in VMEM scratch; the target logit is a gather. Nothing of
size (N, V) is written.
Backward: the same grid writes d logits = (exp(logits - lse) - onehot(target)) * g per
tile straight from the logits and the saved logsumexp: no log-softmax or probability
matrix is ever stored (the decomposed path keeps a float32 (N, V) log-softmax alive from
forward to backward). Vocabulary sizes that are not a multiple of the chunk use partial
edge tiles, masked inside the kernel.
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
from kernels.tuning import LANES

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
#
# Forward grid (row block, vocabulary chunk), chunks innermost and sequential: an online
# logsumexp (running max and sum, lane-replicated (block_rows, 128) VMEM scratch) so a
# program holds one (block_rows, block_vocab) tile whatever the vocabulary. Per-row
# vectors cross the kernel boundary lane-dense as (rows, 128) with the value repeated
# over the lanes (a (rows,) array would need (rows,)-blocks that break TPU tiling).


def _columns(tile_shape):
    """Each element's vocabulary column, for a (block_rows, block_vocab) tile (2-D int32)."""
    return positions(tile_shape, 1, pl.program_id(1) * tile_shape[1])


def _logits(x_ref, vocab):
    """The tile as float32, -inf in the columns past the vocabulary (a partial edge tile)."""
    x = x_ref[...].astype(jnp.float32)
    if vocab % x.shape[1] == 0:
        return x
    return jnp.where(_columns(x.shape) < vocab, x, -jnp.inf)


def _lse_kernel(x_ref, lse_ref, m_ref, l_ref, *, vocab):
    c = pl.program_id(1)

    @pl.when(c == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    x = _logits(x_ref, vocab)
    m_prev, l_prev = m_ref[...][:, :1], l_ref[...][:, :1]
    m_new = jnp.maximum(m_prev, jnp.max(x, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    l_new = jnp.exp(m_prev - m_safe) * l_prev + jnp.sum(jnp.exp(x - m_safe), axis=1, keepdims=True)
    m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
    l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)

    @pl.when(c == pl.num_programs(1) - 1)
    def _finish():
        lse_ref[...] = m_ref[...] + jnp.log(l_ref[...])


def _grad_kernel(x_ref, target_ref, lse_ref, scale_ref, dx_ref, *, vocab):
    x = _logits(x_ref, vocab)
    probs = jnp.exp(x - lse_ref[...][:, :1])
    one_hot = (_columns(x.shape) == target_ref[...][:, :1]).astype(jnp.float32)
    dx_ref[...] = ((probs - one_hot) * scale_ref[...][:, :1]).astype(dx_ref.dtype)


# --------------------------------------------------------------------------- pallas calls


def cross_entropy_blocks(rows, vocab, dtype, config, backward=False) -> list:
    """The blocks of the forward (or backward) pallas_call as `kernels.tpu` checks them."""
    br, bv = config.blocks.block_rows, config.blocks.block_vocab
    tile = tpu.Block("logits", (rows, vocab), (br, bv), dtype)
    row = tpu.Block("logsumexp", (rows, LANES), (br, LANES), jnp.float32)
    if not backward:
        scratch = tpu.Block("max", (br, LANES), (br, LANES), jnp.float32, "scratch")
        return [tile, dataclasses.replace(row, role="out"), scratch, dataclasses.replace(scratch, name="sum")]
    return [
        tile,
        dataclasses.replace(row, name="targets", dtype=jnp.int32),
        row,
        dataclasses.replace(row, name="scale"),
        dataclasses.replace(tile, name="dlogits", role="out"),
    ]


def _lanes(vector):
    """(rows,) -> (rows, 128), the value repeated over the lanes."""
    return jnp.broadcast_to(vector[:, None], (vector.shape[0], LANES))


@kernel_program
def _logsumexp(logits, config):
    rows, vocab = logits.shape
    br, bv = config.blocks.block_rows, config.blocks.block_vocab
    tile, lse_block, *scratch = cross_entropy_blocks(rows, vocab, logits.dtype, config)
    return pl.pallas_call(
        functools.partial(_lse_kernel, vocab=vocab),
        out_shape=jax.ShapeDtypeStruct(lse_block.array, jnp.float32),
        grid=(cdiv(rows, br), cdiv(vocab, bv)),
        in_specs=[pl.BlockSpec(tile.block, lambda i, c: (i, c))],
        out_specs=pl.BlockSpec(lse_block.block, lambda i, c: (i, 0)),
        scratch_shapes=[tpu.vmem_scratch(s.block, s.dtype) for s in scratch],
        cost_estimate=cost(3 * logits.size, logits.size, nbytes(logits) + rows * LANES * 4),
        name="cross_entropy_forward",
        **pallas_options(config.impl, "parallel", "arbitrary"),
    )(logits)[:, 0]


def picked_logits(logits, columns):
    """logits[i, columns[i]] as float32 (N,); `columns` must be valid indices."""
    return jnp.take_along_axis(logits, columns.astype(jnp.int32)[:, None], axis=-1)[:, 0].astype(jnp.float32)


def _forward(logits, targets, config):
    lse = row_logsumexp(logits, config)
    valid = targets != config.ignore_index
    picked = picked_logits(logits, jnp.where(valid, targets, 0))
    return jnp.where(valid, lse - picked, 0.0), lse


@kernel_program
def _gradient(logits, columns, lse, scale, config):
    rows, vocab = logits.shape
    br, bv = config.blocks.block_rows, config.blocks.block_vocab
    tile, *row_blocks, out = cross_entropy_blocks(rows, vocab, logits.dtype, config, backward=True)
    tile_spec = pl.BlockSpec(tile.block, lambda i, c: (i, c))
    row_spec = pl.BlockSpec(row_blocks[0].block, lambda i, c: (i, 0))
    return pl.pallas_call(
        functools.partial(_grad_kernel, vocab=vocab),
        out_shape=jax.ShapeDtypeStruct(logits.shape, logits.dtype),
        grid=(cdiv(rows, br), cdiv(vocab, bv)),
        in_specs=[tile_spec, row_spec, row_spec, row_spec],
        out_specs=tile_spec,
        cost_estimate=cost(4 * logits.size, logits.size, 2 * nbytes(logits) + 3 * rows * LANES * 4),
        name="cross_entropy_backward",
        **pallas_options(config.impl, "parallel", "parallel"),
    )(logits, _lanes(columns.astype(jnp.int32)), _lanes(lse), _lanes(scale))


def _backward(grad_losses, logits, targets, lse, config):
    valid = targets != config.ignore_index
    scale = jnp.where(valid, grad_losses.astype(jnp.float32), 0.0)
    return logits_gradient(logits, jnp.where(valid, targets, -1), lse, scale, config)


# --------------------------------------------------------------------------- public API


@dataclasses.dataclass(frozen=True)
class CrossEntropyConfig:
    """The static part of a call (hashable: jitted programs are keyed by it)."""

    ignore_index: int
    impl: str
    blocks: tuning.CrossEntropyBlocks


def resolve_config(logits, ignore_index=-100, impl=None, block_rows=None, block_vocab=None) -> CrossEntropyConfig:
    """The static part of a call on (N, V) logits."""
    impl = check_implementation(impl or default_implementation())
    tuned = tuning.blocks("cross_entropy", tuning_backend(impl), *logits.shape)
    blocks = tuning.with_explicit(tuned, block_rows=block_rows, block_vocab=block_vocab)
    return CrossEntropyConfig(int(ignore_index), impl, blocks)


def row_logsumexp(logits, config: CrossEntropyConfig):
    """logsumexp of each row of (N, V) logits, float32 (N,)."""
    if config.impl == "reference":
        return jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return _logsumexp(logits, config)


def logits_gradient(logits, columns, lse, scale, config: CrossEntropyConfig):
    """(softmax(logits) - one_hot(columns)) * scale per row, from the rows' logsumexp;
    a column outside [0, V) (-1) adds no one-hot term (a target on another vocabulary shard)."""
    if config.impl == "reference":
        probs = jnp.exp(logits.astype(jnp.float32) - lse[:, None])
        one_hot = columns[:, None] == jnp.arange(logits.shape[1], dtype=columns.dtype)[None, :]
        return ((probs - one_hot) * scale[:, None]).astype(logits.dtype)
    return _gradient(logits, columns, lse, scale, config)


def cross_entropy_forward(logits, targets, config: CrossEntropyConfig):
    """(per-row loss (N,) float32, logsumexp (N,) float32) for a resolved config."""
    if config.impl == "reference":
        return cross_entropy_reference(logits, targets, config.ignore_index)
    return _forward(logits, targets, config)


def cross_entropy_backward(grad_losses, logits, targets, lse, config: CrossEntropyConfig):
    """d logits for the per-row loss gradient `grad_losses` (N,)."""
    if config.impl == "reference":
        _, vjp = jax.vjp(lambda x: cross_entropy_reference(x, targets, config.ignore_index)[0], logits)
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


def cross_entropy(
    logits, targets, *, ignore_index=-100, reduction="mean", impl=None, block_rows=None, block_vocab=None
):
    """Softmax cross-entropy of (N, V) logits against (N,) class indices, like
    `F.cross_entropy` (mean over non-ignored rows by default). Differentiable in logits."""
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy: expected logits (N, V) and targets (N,); got {logits.shape} and {targets.shape}"
        )
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
