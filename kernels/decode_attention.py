"""Decode-time attention over a KV cache (one query token per sequence) as a Pallas
kernel, with its plain-JAX reference. Forward only: this is the serving path.

q (B, H, D); k_cache, v_cache (B, Hkv, S, D) with H a multiple of Hkv; lengths (B,)
int: sequence b attends to cache positions [0, lengths[b]). One program per
(batch, KV head, cache block) handles the H/Hkv query heads that share it as one
(group, D) tile, so grouped-query decoding reads each cached K/V block once; cache blocks
are a sequential grid axis with the online softmax in VMEM scratch (VMEM per program does
not grow with the cache), and blocks past a sequence's length are neither fetched nor
computed (the lengths are scalar-prefetched into the index maps).
A sequence with length 0 gets zeros.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tpu, tuning
from kernels._common import (
    cdiv,
    check_implementation,
    cost,
    default_implementation,
    dot_nn,
    dot_nt,
    kernel_program,
    nbytes,
    pad_axis,
    pallas_options,
    positions,
    round_up,
    tuning_backend,
)
from kernels.tuning import LANES


def decode_attention_reference(q, k_cache, v_cache, lengths, scale=None):
    """softmax(q k^T * scale) v over the first lengths[b] cache entries (XLA)."""
    batch, heads, head_dim = q.shape
    kv_heads, seq = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qg = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).astype(jnp.float32)
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, k_cache.astype(jnp.float32)) * scale
    valid = jnp.arange(seq)[None, :] < lengths[:, None]
    scores = jnp.where(valid[:, None, None, :], scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    exp_scores = jnp.exp(scores - jnp.where(row_max == -jnp.inf, 0.0, row_max))
    total = jnp.sum(exp_scores, axis=-1, keepdims=True)
    probs = exp_scores / jnp.where(total == 0.0, 1.0, total)
    out = jnp.einsum("bkgs,bksd->bkgd", probs, v_cache.astype(jnp.float32))
    return out.reshape(batch, heads, head_dim).astype(q.dtype)


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale):
    """Grid (batch, KV head, cache block), cache blocks innermost and sequential; the
    lengths are scalar-prefetched (SMEM), so the index maps and this body know them."""
    block_k = k_ref.shape[0]
    j = pl.program_id(2)
    length = lengths_ref[pl.program_id(0)]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(j * block_k < length)
    def _step():
        s = dot_nt(q_ref[...], k_ref[...]) * scale
        s = jnp.where(positions(s.shape, 1, j * block_k) < length, s, -jnp.inf)
        m_prev, l_prev = m_ref[...][:, :1], l_ref[...][:, :1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe)
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(alpha * l_prev + jnp.sum(p, axis=1, keepdims=True), l_ref.shape)
        acc_ref[...] = alpha * acc_ref[...] + dot_nn(p.astype(v_ref.dtype), v_ref[...])

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        l = l_ref[...][:, :1]
        o_ref[...] = (acc_ref[...] / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


def decode_blocks(q_shape, cache_shape, dtype, config) -> list:
    """The blocks of the pallas_call as `kernels.tpu` checks them."""
    batch, heads, head_dim = q_shape
    kv_heads, seq = cache_shape[1], cache_shape[2]
    groups, bk = heads // kv_heads, config.blocks.block_k
    seq_pad = round_up(seq, bk)
    query = tpu.Block("q", (batch, kv_heads, groups, head_dim), (None, None, groups, head_dim), dtype)
    cache = tpu.Block("k_cache", (batch, kv_heads, seq_pad, head_dim), (None, None, bk, head_dim), dtype)
    stat = tpu.Block("max", (groups, LANES), (groups, LANES), jnp.float32, "scratch")
    return [
        tpu.Block("lengths", (batch,), (batch,), jnp.int32, "smem"),
        query,
        cache,
        dataclasses.replace(cache, name="v_cache"),
        dataclasses.replace(query, name="out", role="out"),
        stat,
        dataclasses.replace(stat, name="sum"),
        tpu.Block("acc", (groups, head_dim), (groups, head_dim), jnp.float32, "scratch"),
    ]


@kernel_program
def _decode(q, k_cache, v_cache, lengths, config):
    batch, heads, head_dim = q.shape
    kv_heads, seq = k_cache.shape[1], k_cache.shape[2]
    groups, bk = heads // kv_heads, config.blocks.block_k
    seq_pad = round_up(seq, bk)
    kp, vp = pad_axis(k_cache, 2, seq_pad), pad_axis(v_cache, 2, seq_pad)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, seq)
    _, query, cache, _, out, *scratch = decode_blocks(q.shape, k_cache.shape, q.dtype, config)

    def cache_index(b, h, j, lengths_ref):
        last = jnp.maximum(cdiv(lengths_ref[b], bk) - 1, 0)  # blocks past the length: no new DMA
        return (b, h, jnp.minimum(j, last), 0)

    query_spec = pl.BlockSpec(query.block, lambda b, h, j, lengths_ref: (b, h, 0, 0))
    cache_spec = pl.BlockSpec(cache.block, cache_index)
    grid_spec = tpu.pallas_tpu().PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(batch, kv_heads, seq_pad // bk),
        in_specs=[query_spec, cache_spec, cache_spec],
        out_specs=query_spec,
        scratch_shapes=[tpu.vmem_scratch(s.block, s.dtype) for s in scratch],
    )
    out = pl.pallas_call(
        functools.partial(_decode_kernel, scale=config.scale),
        out_shape=jax.ShapeDtypeStruct(out.array, q.dtype),
        grid_spec=grid_spec,
        cost_estimate=cost(4 * batch * heads * seq * head_dim, batch * heads * seq, nbytes(q, kp, vp, q)),
        name="decode_attention",
        **pallas_options(config.impl, "parallel", "parallel", "arbitrary"),
    )(lengths, q.reshape(batch, kv_heads, groups, head_dim), kp, vp)
    return out.reshape(batch, heads, head_dim)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The static part of a call (hashable: jitted programs are keyed by it)."""

    scale: float
    impl: str
    blocks: tuning.DecodeBlocks


def resolve_config(q, k_cache, scale=None, impl=None, block_k=None) -> DecodeConfig:
    """The static part of a call on q (B, H, D) and caches (B, Hkv, S, D)."""
    impl = check_implementation(impl or default_implementation())
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    tuned = tuning.blocks("decode_attention", tuning_backend(impl), k_cache.shape[2], q.shape[-1])
    return DecodeConfig(scale, impl, tuning.with_explicit(tuned, block_k=block_k))


def decode_forward(q, k_cache, v_cache, lengths, config: DecodeConfig):
    if config.impl == "reference":
        return decode_attention_reference(q, k_cache, v_cache, lengths, config.scale)
    return _decode(q, k_cache, v_cache, lengths, config)


def decode_attention(q, k_cache, v_cache, lengths, *, scale=None, impl=None, block_k=None):
    """Attention of one new token per sequence over its KV cache (see the module docstring)."""
    if q.ndim != 3 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"decode_attention: expected q (B, H, D) and caches (B, Hkv, S, D); got {q.shape}, {k_cache.shape}, {v_cache.shape}"
        )
    if q.shape[0] != k_cache.shape[0] or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(
            f"decode_attention: q {q.shape} does not match the cache {k_cache.shape} (batch, heads multiple, head dim)"
        )
    if lengths.shape != (q.shape[0],):
        raise ValueError(f"decode_attention: lengths must be ({q.shape[0]},), got {lengths.shape}")
    return decode_forward(q, k_cache, v_cache, lengths, resolve_config(q, k_cache, scale, impl, block_k))
