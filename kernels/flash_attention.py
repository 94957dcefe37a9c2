"""Flash attention (forward and backward) as Pallas kernels, with its plain-JAX reference.

Layout: q (B, H, Lq, D), k and v (B, Hkv, Lk, D) with H a multiple of Hkv (grouped- or
multi-query attention read the shared K/V head directly: nothing is repeated). Optional
mask broadcastable to (B, H, Lq, Lk): boolean (True = attend) or additive float.
`causal` is PyTorch's `is_causal` (top-left aligned: query i sees keys 0..i).

Forward: grid (batch, head, query block, key block), keys innermost and sequential; an
online softmax keeps a running max, normaliser and output accumulator in VMEM scratch,
so memory is O(sequence) (no (Lq, Lk) scores exist outside one tile), a program holds
one block of each of q, k, v whatever the length, and the logsumexp per query row is
saved (lane-dense, (B, H, 1, Lq)). Backward (FlashAttention-2): delta = rowsum(dO * O),
then a dQ kernel (key blocks sequential) and a dK/dV kernel (query blocks sequential),
both recomputing the probabilities from q, k and the saved logsumexp. Causal programs
past the diagonal skip their body and re-read the previous block (no DMA); only the
blocks on the diagonal (or holding padded keys) build a mask, from 2-D int32 iotas.
On TPU every block obeys the (8, 128) rule; `attention_blocks` lists them for
`kernels.tpu` and `kernels.check_lowering`.

Ragged lengths: q/k/v are zero-padded to block multiples outside the kernel and padded
keys are masked inside. Fully masked query rows give zeros (PyTorch's safe softmax).
Gradients with respect to the mask are not computed (it is treated as a constant; the
torch integration routes differentiable masks to the reference).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import tpu, tuning
from kernels._common import (
    check_implementation,
    compute_dtype,
    cost,
    default_implementation,
    dot_nn,
    dot_nt,
    dot_tn,
    kernel_program,
    nbytes,
    pad_axis,
    pallas_options,
    positions,
    round_up,
    tuning_backend,
)
from kernels.tuning import LANES

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)


# --------------------------------------------------------------------------- reference


def _repeat_kv(q, kv):
    groups = q.shape[1] // kv.shape[1]
    return kv if groups == 1 else jnp.repeat(kv, groups, axis=1)


def _additive_mask(mask, dtype=jnp.float32):
    if mask is None or mask.dtype != jnp.bool_:
        return None if mask is None else mask.astype(dtype)
    return jnp.where(mask, 0.0, -jnp.inf).astype(dtype)


def attention_reference(q, k, v, mask=None, causal=False, scale=None):
    """(out, logsumexp): softmax(q k^T * scale + mask) v, the XLA way (materialises scores)."""
    compute = compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qf, kf, vf = (t.astype(compute) for t in (q, _repeat_kv(q, k), _repeat_kv(q, v)))
    scores = jnp.einsum("bhld,bhsd->bhls", qf, kf) * scale
    if mask is not None:
        scores = scores + _additive_mask(mask, compute)
    if causal:
        length, source = scores.shape[-2:]
        scores = jnp.where(jnp.tril(jnp.ones((length, source), jnp.bool_)), scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    shift = lax.stop_gradient(jnp.where(row_max == -jnp.inf, 0.0, row_max))  # fully masked rows
    exp_scores = jnp.exp(scores - shift)
    total = jnp.sum(exp_scores, axis=-1, keepdims=True)
    empty = total == 0.0
    probs = exp_scores / jnp.where(empty, 1.0, total)
    lse = jnp.where(empty, -jnp.inf, shift + jnp.log(jnp.where(empty, 1.0, total)))[..., 0]
    out = jnp.einsum("bhls,bhsd->bhld", probs, vf)
    return out.astype(q.dtype), lse.astype(jnp.float32)


# --------------------------------------------------------------------------- kernels
#
# Forward grid (batch, head, query block, key block); the key-block axis is innermost and
# sequential ("arbitrary"): the running max and normaliser (lane-replicated (block_q, 128)
# tiles) and the output accumulator live in VMEM scratch across it, so a program holds one
# query block, one key block and one value block whatever the sequence length.
# Per-row statistics (logsumexp, delta) are stored lane-dense, (B, H, 1, Lq) with
# (1, block_q) blocks. The backward kernels work on transposed scores s^T = k q^T
# (block_k, block_q), where those rows broadcast without any relayout.


def _masked(scores, key_axis, key_start, query_start, kv_len, causal, fill):
    """`scores` (a (query, key) or transposed (key, query) tile) with `fill` where the key
    is padding (past kv_len) or, when causal, after the query. The masks are built from
    2-D int32 iotas; a ragged mask only where kv_len is not a multiple of the key block
    (`_run_visible` calls this only for blocks that need a mask)."""
    block_k = scores.shape[key_axis]
    valid = None
    keys = positions(scores.shape, key_axis, key_start)
    if kv_len % block_k:
        valid = keys < kv_len
    if causal:
        before = keys <= positions(scores.shape, 1 - key_axis, query_start)
        valid = before if valid is None else valid & before
    return scores if valid is None else jnp.where(valid, scores, fill)


def _visible(i, j, block_q, block_k, causal):
    """Whether key block j holds a key some query of block i may see (causal skipping)."""
    return j * block_k < (i + 1) * block_q if causal else True


def _run_visible(step, i, j, block_q, block_k, kv_len, causal):
    """`step(masked)` for program (i, j) if its key block is visible: masked=True only for
    the blocks that straddle the causal diagonal or hold padded keys; the others (most of
    a long causal sequence) build no masks at all."""
    visible = _visible(i, j, block_q, block_k, causal)
    partial = []
    if causal:  # a key after the block's first query
        partial.append((j + 1) * block_k - 1 > i * block_q)
    if kv_len % block_k:  # the last key block is padded
        partial.append((j + 1) * block_k > kv_len)
    if not partial:
        pl.when(visible)(lambda: step(False))
        return
    needs_mask = functools.reduce(jnp.logical_or, partial)
    pl.when(jnp.logical_and(visible, needs_mask))(lambda: step(True))
    pl.when(jnp.logical_and(visible, jnp.logical_not(needs_mask)))(lambda: step(False))


def _last_visible_key_block(i, block_q, block_k):
    return ((i + 1) * block_q - 1) // block_k


def _first_visible_query_block(j, block_q, block_k):
    return (j * block_k) // block_q


def _forward_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, kv_len, has_mask):
    mask_ref = refs[0] if has_mask else None
    o_ref, lse_ref, m_ref, l_ref, acc_ref = refs[-5:]
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(masked):
        s = dot_nt(q_ref[...], k_ref[...]) * scale
        if has_mask:
            s = s + mask_ref[...]
        if masked:
            s = _masked(s, 1, j * block_k, i * block_q, kv_len, causal, -jnp.inf)
        m_prev, l_prev = m_ref[...][:, :1], l_ref[...][:, :1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # every key so far masked
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe)
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(alpha * l_prev + jnp.sum(p, axis=1, keepdims=True), l_ref.shape)
        acc_ref[...] = alpha * acc_ref[...] + dot_nn(p.astype(v_ref.dtype), v_ref[...])

    _run_visible(step, i, j, block_q, block_k, kv_len, causal)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_ref[...]
        empty = l == 0.0
        l_safe = jnp.where(empty, 1.0, l)
        o_ref[...] = (acc_ref[...] / l_safe[:, :1]).astype(o_ref.dtype)
        lse = jnp.where(empty, -jnp.inf, m_ref[...] + jnp.log(l_safe))  # (block_q, 128), rows replicated
        lse_ref[...] = jnp.transpose(lse)[:1, :]  # one lane-dense row


def _transposed_probabilities(q, k, mask_t, lse, q_start, k_start, kv_len, causal, scale, masked):
    """p^T (block_k, block_q) recomputed from q, k and the saved logsumexp row."""
    s = dot_nt(k, q) * scale
    if mask_t is not None:
        s = s + mask_t
    lse_safe = jnp.where(lse == -jnp.inf, jnp.inf, lse)  # fully masked rows: p = 0
    p_t = jnp.exp(s - lse_safe)
    return _masked(p_t, 0, k_start, q_start, kv_len, causal, 0.0) if masked else p_t


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, scale, causal, kv_len, has_mask):
    mask_ref = refs[0] if has_mask else None
    dq_ref, acc_ref = refs[-2:]
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(masked):
        k = k_ref[...]
        p_t = _transposed_probabilities(
            q_ref[...],
            k,
            mask_ref[...] if has_mask else None,
            lse_ref[...],
            i * block_q,
            j * block_k,
            kv_len,
            causal,
            scale,
            masked,
        )
        ds_t = p_t * (dot_nt(v_ref[...], do_ref[...]) - delta_ref[...])
        acc_ref[...] += dot_tn(ds_t.astype(k.dtype), k)

    _run_visible(step, i, j, block_q, block_k, kv_len, causal)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, scale, causal, kv_len, has_mask):
    mask_ref = refs[0] if has_mask else None
    dk_ref, dv_ref, dk_acc, dv_acc = refs[-4:]
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    j, i = pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _init():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def step(masked):
        q, do = q_ref[...], do_ref[...]
        p_t = _transposed_probabilities(
            q,
            k_ref[...],
            mask_ref[...] if has_mask else None,
            lse_ref[...],
            i * block_q,
            j * block_k,
            kv_len,
            causal,
            scale,
            masked,
        )
        dv_acc[...] += dot_nn(p_t.astype(do.dtype), do)
        ds_t = p_t * (dot_nt(v_ref[...], do) - delta_ref[...])
        dk_acc[...] += dot_nn(ds_t.astype(q.dtype), q)

    _run_visible(step, i, j, block_q, block_k, kv_len, causal)

    @pl.when(i == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


# --------------------------------------------------------------------------- pallas calls


def _mask_4d(mask, q_shape, kv_len):
    """The mask as additive float32 (Bm, Hm, Lq, Lk) with Bm, Hm in {1, B/H}."""
    mask = _additive_mask(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    return jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], q_shape[2], kv_len))


def _padded_mask(mask, q_shape, kv_len, q_pad, k_pad):
    return pad_axis(pad_axis(_mask_4d(mask, q_shape, kv_len), 2, q_pad), 3, k_pad, -jnp.inf)


def _mask_index(mask_shape, index):
    """index_map for a (Bm, Hm, ., .) mask whose batch/head dims may be broadcast."""
    broadcast_b, broadcast_h = mask_shape[0] == 1, mask_shape[1] == 1

    def index_map(b, h, x, y):
        row, col = index(x, y)
        return (0 if broadcast_b else b, 0 if broadcast_h else h, row, col)

    return index_map


def _spec(block: tpu.Block, index_map):
    return pl.BlockSpec(block.block, index_map)


def attention_blocks(q_shape, kv_shape, dtype, config, mask_shape=None, backward=False) -> list:
    """The blocks of the forward (or the two backward) pallas_calls, as `kernels.tpu`
    checks them: the same shapes the BlockSpecs and scratch below use."""
    batch, heads, length, head_dim = q_shape
    kv_heads, kv_len = kv_shape[1], kv_shape[2]
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_pad, k_pad = round_up(length, bq), round_up(kv_len, bk)
    f32 = jnp.float32
    q_rows = tpu.Block("q", (batch, heads, q_pad, head_dim), (None, None, bq, head_dim), dtype)
    kv_rows = tpu.Block("k", (batch, kv_heads, k_pad, head_dim), (None, None, bk, head_dim), dtype)
    stat = tpu.Block("logsumexp", (batch, heads, 1, q_pad), (None, None, 1, bq), f32)
    mask = []
    if mask_shape is not None:
        rows_cols = (k_pad, q_pad) if backward else (q_pad, k_pad)
        tile = (bk, bq) if backward else (bq, bk)
        mask = [tpu.Block("mask", (*mask_shape[:2], *rows_cols), (None, None, *tile), f32)]
    if not backward:
        return [
            q_rows,
            kv_rows,
            dataclasses.replace(kv_rows, name="v"),
            *mask,
            dataclasses.replace(q_rows, name="out", role="out"),
            dataclasses.replace(stat, role="out"),
            tpu.Block("max", (bq, LANES), (bq, LANES), f32, "scratch"),
            tpu.Block("sum", (bq, LANES), (bq, LANES), f32, "scratch"),
            tpu.Block("acc", (bq, head_dim), (bq, head_dim), f32, "scratch"),
        ]
    grad_dtype = dtype if heads == kv_heads else f32
    common = [
        q_rows,
        kv_rows,
        dataclasses.replace(kv_rows, name="v"),
        dataclasses.replace(q_rows, name="dout"),
        stat,
        dataclasses.replace(stat, name="delta"),
        *mask,
    ]
    dq = common + [
        dataclasses.replace(q_rows, name="dq", role="out"),
        tpu.Block("dq_acc", (bq, head_dim), (bq, head_dim), f32, "scratch"),
    ]
    dk_out = tpu.Block("dk", (batch, heads, k_pad, head_dim), (None, None, bk, head_dim), grad_dtype, "out")
    dkv = common + [
        dk_out,
        dataclasses.replace(dk_out, name="dv"),
        tpu.Block("dk_acc", (bk, head_dim), (bk, head_dim), f32, "scratch"),
        tpu.Block("dv_acc", (bk, head_dim), (bk, head_dim), f32, "scratch"),
    ]
    return [dq, dkv]


def _key_block_index(config, num_k_blocks):
    """Key block for program (i, j): causal programs past the diagonal re-read the last
    visible block (no DMA) and skip their body."""
    bq, bk = config.blocks.block_q, config.blocks.block_k
    if not config.causal:
        return lambda i, j: j
    return lambda i, j: jnp.minimum(j, jnp.minimum(_last_visible_key_block(i, bq, bk), num_k_blocks - 1))


def _query_block_index(config):
    bq, bk = config.blocks.block_q, config.blocks.block_k
    if not config.causal:
        return lambda j, i: i
    return lambda j, i: jnp.maximum(i, _first_visible_query_block(j, bq, bk))


def _attention_cost(q, k, causal, passes):
    batch, heads, length, head_dim = q.shape
    pairs = batch * heads * length * k.shape[2] * (0.5 if causal else 1.0)
    return pairs * head_dim * 2 * passes, pairs


@kernel_program
def _forward(q, k, v, mask, config):
    batch, heads, length, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_pad, k_pad = round_up(length, bq), round_up(kv_len, bk)
    qp = pad_axis(q, 2, q_pad)
    kp, vp = pad_axis(k, 2, k_pad), pad_axis(v, 2, k_pad)
    operands = [qp, kp, vp]
    if mask is not None:
        mask = _padded_mask(mask, q.shape, kv_len, q_pad, k_pad)
        operands.append(mask)
    blocks = attention_blocks(q.shape, k.shape, q.dtype, config, None if mask is None else mask.shape)
    key_block = _key_block_index(config, k_pad // bk)
    q_index = lambda b, h, i, j: (b, h, i, 0)
    kv_index = lambda b, h, i, j: (b, h // groups, key_block(i, j), 0)
    in_specs = [_spec(blocks[0], q_index), _spec(blocks[1], kv_index), _spec(blocks[2], kv_index)]
    if mask is not None:
        in_specs.append(_spec(blocks[3], _mask_index(mask.shape, lambda i, j: (i, key_block(i, j)))))
    out_block, lse_block, *scratch = blocks[-5:]
    kernel = functools.partial(
        _forward_kernel, scale=config.scale, causal=config.causal, kv_len=kv_len, has_mask=mask is not None
    )
    flops, exps = _attention_cost(q, k, config.causal, passes=2)
    out, lse = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct(out_block.array, q.dtype),
            jax.ShapeDtypeStruct(lse_block.array, jnp.float32),
        ),
        grid=(batch, heads, q_pad // bq, k_pad // bk),
        in_specs=in_specs,
        out_specs=(_spec(out_block, q_index), _spec(lse_block, lambda b, h, i, j: (b, h, 0, i))),
        scratch_shapes=[tpu.vmem_scratch(s.block, s.dtype) for s in scratch],
        cost_estimate=cost(flops, exps, nbytes(*operands) + nbytes(qp)),
        name="flash_attention_forward",
        **pallas_options(config.impl, "parallel", "parallel", "parallel", "arbitrary"),
    )(*operands)
    return out[:, :, :length], lse[:, :, 0, :length]


@kernel_program
def _backward(dout, q, k, v, mask, out, lse, config):
    batch, heads, length, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_pad, k_pad = round_up(length, bq), round_up(kv_len, bk)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    qp, dop = pad_axis(q, 2, q_pad), pad_axis(dout, 2, q_pad)
    lsep = pad_axis(lse, 2, q_pad, jnp.inf)[:, :, None, :]
    deltap = pad_axis(delta, 2, q_pad)[:, :, None, :]
    kp, vp = pad_axis(k, 2, k_pad), pad_axis(v, 2, k_pad)
    operands = [qp, kp, vp, dop, lsep, deltap]
    if mask is not None:  # transposed once here: both kernels read (key, query) tiles
        operands.append(jnp.swapaxes(_padded_mask(mask, q.shape, kv_len, q_pad, k_pad), 2, 3))
    has_mask = mask is not None
    static = dict(scale=config.scale, causal=config.causal, kv_len=kv_len, has_mask=has_mask)
    dq_blocks, dkv_blocks = attention_blocks(
        q.shape, k.shape, q.dtype, config, operands[-1].shape if has_mask else None, backward=True
    )
    flops, exps = _attention_cost(q, k, config.causal, passes=2)
    inputs = nbytes(*operands)

    def specs(blocks, query_index, key_index):
        """in_specs for (q, k, v, dout, lse, delta, mask?) given a program's query and key block."""
        q_map = lambda b, h, x, y: (b, h, query_index(x, y), 0)
        kv_map = lambda b, h, x, y: (b, h // groups, key_index(x, y), 0)
        row_map = lambda b, h, x, y: (b, h, 0, query_index(x, y))
        maps = [q_map, kv_map, kv_map, q_map, row_map, row_map]
        if has_mask:
            maps.append(_mask_index(operands[-1].shape, lambda x, y: (key_index(x, y), query_index(x, y))))
        return [_spec(block, index) for block, index in zip(blocks, maps)]

    # dQ: grid (batch, head, query block, key block), keys innermost.
    key_block = _key_block_index(config, k_pad // bk)
    dq_out, dq_acc = dq_blocks[-2:]
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, **static),
        out_shape=jax.ShapeDtypeStruct(dq_out.array, q.dtype),
        grid=(batch, heads, q_pad // bq, k_pad // bk),
        in_specs=specs(dq_blocks, lambda i, j: i, key_block),
        out_specs=_spec(dq_out, lambda b, h, i, j: (b, h, i, 0)),
        scratch_shapes=[tpu.vmem_scratch(dq_acc.block, dq_acc.dtype)],
        cost_estimate=cost(flops * 1.5, exps, inputs + nbytes(qp)),
        name="flash_attention_dq",
        **pallas_options(config.impl, "parallel", "parallel", "parallel", "arbitrary"),
    )(*operands)

    # dK/dV per query head: grid (batch, head, key block, query block), queries innermost;
    # summed over each KV group outside.
    query_block = _query_block_index(config)
    dk_out, dv_out, *scratch = dkv_blocks[-4:]
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, **static),
        out_shape=(jax.ShapeDtypeStruct(dk_out.array, dk_out.dtype), jax.ShapeDtypeStruct(dv_out.array, dv_out.dtype)),
        grid=(batch, heads, k_pad // bk, q_pad // bq),
        in_specs=specs(dkv_blocks, query_block, lambda j, i: j),
        out_specs=(_spec(dk_out, lambda b, h, j, i: (b, h, j, 0)), _spec(dv_out, lambda b, h, j, i: (b, h, j, 0))),
        scratch_shapes=[tpu.vmem_scratch(s.block, s.dtype) for s in scratch],
        cost_estimate=cost(flops * 2, exps, inputs + 2 * nbytes(kp) * groups),
        name="flash_attention_dkv",
        **pallas_options(config.impl, "parallel", "parallel", "parallel", "arbitrary"),
    )(*operands)
    if groups > 1:
        dk = dk.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2).astype(k.dtype)
        dv = dv.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2).astype(v.dtype)
    return dq[:, :, :length], dk[:, :, :kv_len], dv[:, :, :kv_len]


# --------------------------------------------------------------------------- public API


def _check_shapes(q, k, v, mask):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"flash_attention: q, k, v must be (batch, heads, seq, head_dim); got {q.shape}, {k.shape}, {v.shape}"
        )
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"flash_attention: k and v must be (batch, kv_heads, kv_seq, head_dim) like q; got {k.shape}, {v.shape} for q {q.shape}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"flash_attention: query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})"
        )
    if mask is not None:
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        padded = (1,) * (4 - mask.ndim) + tuple(mask.shape)
        if mask.ndim > 4 or any(m not in (1, f) for m, f in zip(padded, full)):
            raise ValueError(
                f"flash_attention: mask {tuple(mask.shape)} does not broadcast to (batch, heads, q_seq, kv_seq) = {full}"
            )


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """The static part of a call (hashable: jitted programs are keyed by it)."""

    causal: bool
    scale: float
    impl: str
    blocks: tuning.AttentionBlocks


def resolve_config(q, k, causal=False, scale=None, impl=None, block_q=None, block_k=None) -> AttentionConfig:
    """The static part of a call on q (B, H, Lq, D) and k (B, Hkv, Lk, D)."""
    impl = check_implementation(impl or default_implementation())
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    itemsize = jnp.dtype(q.dtype).itemsize
    tuned = tuning.blocks("attention", tuning_backend(impl), q.shape[2], k.shape[2], q.shape[3], itemsize)
    return AttentionConfig(bool(causal), scale, impl, tuning.with_explicit(tuned, block_q=block_q, block_k=block_k))


def attention_forward(q, k, v, mask, config: AttentionConfig):
    """(out, logsumexp) for a resolved config (see `resolve_config`)."""
    if config.impl == "reference":
        return attention_reference(q, k, v, mask, config.causal, config.scale)
    return _forward(q, k, v, mask, config)


def attention_backward(dout, q, k, v, mask, out, lse, config: AttentionConfig):
    """(dq, dk, dv) from the saved output and logsumexp."""
    if config.impl == "reference":
        _, vjp = jax.vjp(lambda a, b, c: attention_reference(a, b, c, mask, config.causal, config.scale)[0], q, k, v)
        return vjp(dout)
    return _backward(dout, q, k, v, mask, out, lse, config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, mask, config):
    return attention_forward(q, k, v, mask, config)[0]


def _flash_fwd(q, k, v, mask, config):
    out, lse = attention_forward(q, k, v, mask, config)
    return out, (q, k, v, mask, out, lse)


def _flash_bwd(config, residuals, dout):
    q, k, v, mask, out, lse = residuals
    dq, dk, dv = attention_backward(dout, q, k, v, mask, out, lse, config)
    return dq, dk, dv, None  # the mask is a constant (see the module docstring)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, mask=None, *, causal=False, scale=None, impl=None, block_q=None, block_k=None):
    """softmax(q k^T * scale + mask) v with O(sequence) memory; differentiable in q, k, v.

    impl: "pallas" (TPU), "interpret" (Pallas interpreter, any backend) or
    "reference" (plain XLA); default: compiled on a TPU, interpreted elsewhere.
    Block sizes default to `kernels.tuning`. The mask is not differentiated.
    """
    _check_shapes(q, k, v, mask)
    config = resolve_config(q, k, causal, scale, impl, block_q, block_k)
    return _flash(q, k, v, mask, config)
