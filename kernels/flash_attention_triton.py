"""Flash attention for NVIDIA GPUs: Pallas kernels written for the Triton backend.

`kernels.flash_attention` keeps its running statistics in VMEM scratch across a
sequential key-block grid axis, a Mosaic TPU pipeline; Triton runs every program of a
grid in parallel and has no scratch memory. Here each program owns one query block (or,
in the dK/dV kernel, one key block) and loops over the other axis itself, carrying the
running max, normaliser and accumulator in registers (`lax.fori_loop`); the K/V (or Q/dO)
rows of its head are one block ref sliced with `pl.ds` inside the loop. Causal programs
stop the loop at the diagonal. Same math as the TPU kernels (online softmax forward with
the logsumexp saved; FlashAttention-2 backward recomputing the probabilities, with
delta = rowsum(dO * O) computed outside), so `attention_reference` is the oracle.

    out = flash_attention_triton(q, k, v, causal=True)                  # compiled by Triton (GPU)
    out = flash_attention_triton(q, k, v, causal=True, interpret=True)  # Pallas interpreter, any backend

Layout and GQA as `kernels.flash_attention`: q (B, H, Lq, D), k and v (B, Hkv, Lk, D).
Covered: causal or not, GQA/MQA, ragged lengths (zero-padded to blocks outside the
kernel, padded keys masked inside), head dims 32/64/128/256. Not covered: attention masks
and dropout (use the reference). Block sizes are powers of two (Triton's rule for every
array a program loads). Tested in interpret mode on CPU; compiled, it has only run
where `benchmarks/kernels/accelerator_check.py` ran on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels._common import cdiv, dot_nn, dot_nt, dot_tn, iota, pad_axis, round_up
from kernels.flash_attention import SUPPORTED_HEAD_DIMS

DEFAULT_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class TritonAttentionConfig:
    causal: bool
    scale: float
    block_q: int
    block_k: int
    interpret: bool
    num_warps: int = 4
    num_stages: int = 2


def _compiler_params(config: TritonAttentionConfig) -> dict:
    if config.interpret:
        return {"interpret": True}
    from jax.experimental.pallas import triton as pallas_triton

    params = getattr(pallas_triton, "CompilerParams", None) or pallas_triton.TritonCompilerParams
    return {"compiler_params": params(num_warps=config.num_warps, num_stages=config.num_stages)}


def _key_validity(q_pos, k_pos, kv_len, causal):
    """(query, key) tile mask from position vectors: the key is no padding and, when
    causal, not after the query (Triton lays out these broadcasts; Mosaic would not)."""
    valid = (k_pos < kv_len)[None, :]
    if causal:
        valid = valid & (k_pos[None, :] <= q_pos[:, None])
    return valid


def _visible_key_blocks(i, block_q, block_k, num_k_blocks, causal):
    """Key blocks query block i loops over: all, or up to the diagonal when causal."""
    return jnp.minimum(num_k_blocks, cdiv((i + 1) * block_q, block_k)) if causal else num_k_blocks


# --------------------------------------------------------------------------- kernels


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, kv_len, block_k):
    block_q, head_dim = q_ref.shape
    i = pl.program_id(2)
    q = q_ref[...]
    q_pos = iota(block_q, i * block_q)

    def step(j, carry):
        m_prev, l_prev, acc = carry
        start = pl.multiple_of(j * block_k, block_k)
        k, v = k_ref[pl.ds(start, block_k), :], v_ref[pl.ds(start, block_k), :]
        s = dot_nt(q, k) * scale
        s = jnp.where(_key_validity(q_pos, iota(block_k, start), kv_len, causal), s, -jnp.inf)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # every key so far masked
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        acc = alpha[:, None] * acc + dot_nn(p.astype(v.dtype), v)
        return m_new, alpha * l_prev + jnp.sum(p, axis=1), acc

    start = (
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros((block_q, head_dim), jnp.float32),
    )
    num_k = k_ref.shape[0] // block_k
    m, l, acc = lax.fori_loop(0, _visible_key_blocks(i, block_q, block_k, num_k, causal), step, start)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))


def _probabilities(q, k, lse, q_pos, k_pos, kv_len, causal, scale):
    """p (block_q, block_k) recomputed from q, k and the saved logsumexp."""
    s = dot_nt(q, k) * scale
    lse_safe = jnp.where(lse == -jnp.inf, jnp.inf, lse)  # fully masked rows: p = 0
    return jnp.where(_key_validity(q_pos, k_pos, kv_len, causal), jnp.exp(s - lse_safe[:, None]), 0.0)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, causal, kv_len, block_k):
    block_q, head_dim = q_ref.shape
    i = pl.program_id(2)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_pos = iota(block_q, i * block_q)

    def step(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        k, v = k_ref[pl.ds(start, block_k), :], v_ref[pl.ds(start, block_k), :]
        p = _probabilities(q, k, lse, q_pos, iota(block_k, start), kv_len, causal, scale)
        ds = p * (dot_nt(do, v) - delta[:, None])
        return dq + dot_nn(ds.astype(k.dtype), k)

    num_k = k_ref.shape[0] // block_k
    dq = lax.fori_loop(
        0, _visible_key_blocks(i, block_q, block_k, num_k, causal), step, jnp.zeros((block_q, head_dim), jnp.float32)
    )
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, scale, causal, kv_len, block_q):
    block_k, head_dim = k_ref.shape
    j = pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    k_pos = iota(block_k, j * block_k)

    def step(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(start, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        p = _probabilities(q, k, lse_ref[rows], iota(block_q, start), k_pos, kv_len, causal, scale)
        ds = p * (dot_nt(do, v) - delta_ref[rows][:, None])
        return dk + dot_tn(ds.astype(q.dtype), q), dv + dot_tn(p.astype(do.dtype), do)

    first = (j * block_k) // block_q if causal else 0  # earlier query blocks see none of these keys
    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    dk, dv = lax.fori_loop(first, q_ref.shape[0] // block_q, step, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# --------------------------------------------------------------------------- pallas calls


def _rows_spec(block, head_dim):
    return pl.BlockSpec((None, None, block, head_dim), lambda b, h, x: (b, h, x, 0))


def _whole_head_spec(length, head_dim, groups):
    return pl.BlockSpec((None, None, length, head_dim), lambda b, h, x: (b, h // groups, 0, 0))


def _padded(q, k, v, config):
    q_pad, k_pad = round_up(q.shape[2], config.block_q), round_up(k.shape[2], config.block_k)
    return pad_axis(q, 2, q_pad), pad_axis(k, 2, k_pad), pad_axis(v, 2, k_pad)


@functools.partial(jax.jit, static_argnames=("config",))
def _forward(q, k, v, config: TritonAttentionConfig):
    batch, heads, length, head_dim = q.shape
    groups = heads // k.shape[1]
    qp, kp, vp = _padded(q, k, v, config)
    q_pad, k_pad = qp.shape[2], kp.shape[2]
    kernel = functools.partial(
        _forward_kernel, scale=config.scale, causal=config.causal, kv_len=k.shape[2], block_k=config.block_k
    )
    out, lse = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(qp.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, q_pad), jnp.float32)),
        grid=(batch, heads, q_pad // config.block_q),
        in_specs=[
            _rows_spec(config.block_q, head_dim),
            _whole_head_spec(k_pad, head_dim, groups),
            _whole_head_spec(k_pad, head_dim, groups),
        ],
        out_specs=(
            _rows_spec(config.block_q, head_dim),
            pl.BlockSpec((None, None, config.block_q), lambda b, h, i: (b, h, i)),
        ),
        name="flash_attention_triton_fwd",
        **_compiler_params(config),
    )(qp, kp, vp)
    return out[:, :, :length], lse


@functools.partial(jax.jit, static_argnames=("config",))
def _backward(dout, q, k, v, out, lse, config: TritonAttentionConfig):
    batch, heads, length, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    qp, kp, vp = _padded(q, k, v, config)
    q_pad, k_pad = qp.shape[2], kp.shape[2]
    dop = pad_axis(dout, 2, q_pad)
    delta = pad_axis(jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1), 2, q_pad)
    static = dict(scale=config.scale, causal=config.causal, kv_len=kv_len)
    row_stat = pl.BlockSpec((None, None, config.block_q), lambda b, h, i: (b, h, i))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=config.block_k, **static),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        grid=(batch, heads, q_pad // config.block_q),
        in_specs=[
            _rows_spec(config.block_q, head_dim),
            _whole_head_spec(k_pad, head_dim, groups),
            _whole_head_spec(k_pad, head_dim, groups),
            _rows_spec(config.block_q, head_dim),
            row_stat,
            row_stat,
        ],
        out_specs=_rows_spec(config.block_q, head_dim),
        name="flash_attention_triton_dq",
        **_compiler_params(config),
    )(qp, kp, vp, dop, lse, delta)
    # dK/dV per query head (f32), summed over each KV group outside.
    whole_stat = pl.BlockSpec((None, None, q_pad), lambda b, h, j: (b, h, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=config.block_q, **static),
        out_shape=(jax.ShapeDtypeStruct((batch, heads, k_pad, head_dim), jnp.float32),) * 2,
        grid=(batch, heads, k_pad // config.block_k),
        in_specs=[
            _whole_head_spec(q_pad, head_dim, 1),
            pl.BlockSpec((None, None, config.block_k, head_dim), lambda b, h, j: (b, h // groups, j, 0)),
            pl.BlockSpec((None, None, config.block_k, head_dim), lambda b, h, j: (b, h // groups, j, 0)),
            _whole_head_spec(q_pad, head_dim, 1),
            whole_stat,
            whole_stat,
        ],
        out_specs=(_rows_spec(config.block_k, head_dim),) * 2,
        name="flash_attention_triton_dkv",
        **_compiler_params(config),
    )(qp, kp, vp, dop, lse, delta)
    dk = dk.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2)
    dv = dv.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2)
    return dq[:, :, :length], dk[:, :, :kv_len].astype(k.dtype), dv[:, :, :kv_len].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _flash(q, k, v, config):
    return _forward(q, k, v, config)[0]


def _flash_fwd(q, k, v, config):
    out, lse = _forward(q, k, v, config)
    return out, (q, k, v, out, lse)


def _flash_bwd(config, residuals, dout):
    q, k, v, out, lse = residuals
    return _backward(dout, q, k, v, out, lse, config)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _block(requested: int | None, length: int) -> int:
    block = requested or min(DEFAULT_BLOCK, max(16, 1 << (length - 1).bit_length()))
    if block & (block - 1) or block < 16:
        raise ValueError(f"flash_attention_triton: block sizes must be powers of two >= 16 (Triton); got {block}")
    return block


def flash_attention_triton(q, k, v, *, causal=False, scale=None, interpret=False, block_q=None, block_k=None):
    """softmax(q k^T * scale) v (causal: PyTorch's top-left `is_causal`), differentiable in
    q, k, v. Compiled by Pallas's Triton backend (a CUDA GPU), or `interpret=True` on any
    backend."""
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"flash_attention_triton: q (B, H, Lq, D), k and v (B, Hkv, Lk, D) expected; got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"flash_attention_triton: query heads {q.shape[1]} not a multiple of kv heads {k.shape[1]}")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"flash_attention_triton: head dim {q.shape[3]} not in {SUPPORTED_HEAD_DIMS}")
    config = TritonAttentionConfig(
        causal=bool(causal),
        scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale),
        block_q=_block(block_q, q.shape[2]),
        block_k=_block(block_k, k.shape[2]),
        interpret=bool(interpret),
    )
    return _flash(q, k, v, config)
