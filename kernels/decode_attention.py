"""Decode-time attention over a KV cache (one query token per sequence) as a Pallas
kernel, with its plain-JAX reference. Forward only: this is the serving path.

q (B, H, D); k_cache, v_cache (B, Hkv, S, D) with H a multiple of Hkv; lengths (B,)
int: sequence b attends to cache positions [0, lengths[b]). One program per
(batch, KV head) handles the H/Hkv query heads that share it as one (group, D) tile, so
grouped-query decoding reads each cached K/V block once; the loop stops after the
block holding position lengths[b] - 1 (blocks past a sequence's length are never read).
A sequence with length 0 gets zeros.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels import tuning
from kernels._common import (
    accelerator,
    cdiv,
    check_implementation,
    default_implementation,
    dot_nn,
    dot_nt,
    iota,
    pad_axis,
    round_up,
    tuning_backend,
)


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


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, *, scale, block_k):
    groups, head_dim = q_ref.shape
    length = lengths_ref[pl.program_id(0)]
    q = q_ref[...]

    def step(j, carry):
        m_prev, l_prev, acc = carry
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        s = dot_nt(q, k) * scale
        s = jnp.where((iota(block_k, start) < length)[None, :], s, -jnp.inf)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        return m_new, alpha * l_prev + jnp.sum(p, axis=1), alpha[:, None] * acc + dot_nn(p.astype(v.dtype), v)

    init = (
        jnp.full((groups,), -jnp.inf, jnp.float32),
        jnp.zeros((groups,), jnp.float32),
        jnp.zeros((groups, head_dim), jnp.float32),
    )
    _, l, acc = lax.fori_loop(0, cdiv(length, block_k), step, init)
    o_ref[...] = (acc / jnp.where(l == 0.0, 1.0, l)[:, None]).astype(o_ref.dtype)


def _lengths_spec():
    """Per-sequence lengths are scalars: SMEM on TPU, a whole small array elsewhere."""
    if accelerator() == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec(memory_space=None)  # the whole array, unblocked


@functools.partial(jax.jit, static_argnames=("config",))
def _decode(q, k_cache, v_cache, lengths, config):
    scale, impl, block_k = config
    batch, heads, head_dim = q.shape
    kv_heads, seq = k_cache.shape[1], k_cache.shape[2]
    groups = heads // kv_heads
    seq_pad = round_up(seq, block_k)
    kp, vp = pad_axis(k_cache, 2, seq_pad), pad_axis(v_cache, 2, seq_pad)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, seq)
    cache_spec = pl.BlockSpec((None, None, seq_pad, head_dim), lambda b, h: (b, h, 0, 0))
    query_spec = pl.BlockSpec((None, None, groups, head_dim), lambda b, h: (b, h, 0, 0))
    out = pl.pallas_call(
        functools.partial(_decode_kernel, scale=scale, block_k=block_k),
        out_shape=jax.ShapeDtypeStruct((batch, kv_heads, groups, head_dim), q.dtype),
        grid=(batch, kv_heads),
        in_specs=[_lengths_spec(), query_spec, cache_spec, cache_spec],
        out_specs=query_spec,
        interpret=impl == "interpret",
        name="decode_attention",
    )(lengths, q.reshape(batch, kv_heads, groups, head_dim), kp, vp)
    return out.reshape(batch, heads, head_dim)


def resolve_config(q, k_cache, scale=None, impl=None, block_k=None) -> tuple:
    """The static part of a call: (scale, impl, block_k)."""
    impl = check_implementation(impl or default_implementation())
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    tuned = tuning.blocks("decode_attention", tuning_backend(impl), k_cache.shape[2], q.shape[-1])
    return (scale, impl, block_k or tuned["block_k"])


def decode_forward(q, k_cache, v_cache, lengths, config):
    if config[1] == "reference":
        return decode_attention_reference(q, k_cache, v_cache, lengths, config[0])
    return _decode(q, k_cache, v_cache, lengths, config)


def decode_attention(q, k_cache, v_cache, lengths, *, scale=None, impl=None, block_k=None):
    """Attention of one new token per sequence over its KV cache (see the module docstring)."""
    if q.ndim != 3 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"decode_attention: expected q (B, H, D) and caches (B, Hkv, S, D); got {q.shape}, {k_cache.shape}, {v_cache.shape}"
        )
    if q.shape[0] != k_cache.shape[0] or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"decode_attention: q {q.shape} does not match the cache {k_cache.shape} (batch, heads multiple, head dim)")
    if lengths.shape != (q.shape[0],):
        raise ValueError(f"decode_attention: lengths must be ({q.shape[0]},), got {lengths.shape}")
    return decode_forward(q, k_cache, v_cache, lengths, resolve_config(q, k_cache, scale, impl, block_k))
