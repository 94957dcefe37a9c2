"""Flash attention (forward and backward) as Pallas kernels, with its plain-JAX reference.

Layout: q (B, H, Lq, D), k and v (B, Hkv, Lk, D) with H a multiple of Hkv (grouped- or
multi-query attention read the shared K/V head directly: nothing is repeated). Optional
mask broadcastable to (B, H, Lq, Lk): boolean (True = attend) or additive float.
`causal` is PyTorch's `is_causal` (top-left aligned: query i sees keys 0..i).

Forward: one program per (batch, head, query block); an online softmax over key blocks
keeps a running max, normaliser and output accumulator, so memory is O(sequence) (no
(Lq, Lk) scores exist outside one tile) and the logsumexp per query row is saved.
Backward (FlashAttention-2): delta = rowsum(dO * O), then one kernel per query block for
dQ and one per key block for dK/dV, both recomputing the probabilities from q, k and the
saved logsumexp. Causal programs skip the key (or query) blocks the mask removes.

Ragged lengths: q/k/v are zero-padded to block multiples outside the kernel and padded
keys are masked inside. Fully masked query rows give zeros (PyTorch's safe softmax).
Gradients with respect to the mask are not computed (it is treated as a constant; the
torch integration routes differentiable masks to the reference).
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
    cdiv,
    check_implementation,
    compute_dtype,
    default_implementation,
    dot_nn,
    dot_nt,
    dot_tn,
    iota,
    pad_axis,
    round_up,
    tuning_backend,
)

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


def _key_validity(q_pos, k_pos, kv_len, causal):
    valid = (k_pos < kv_len)[None, :]
    if causal:
        valid = valid & (k_pos[None, :] <= q_pos[:, None])
    return valid


def _scores(q, k, mask_tile, q_pos, k_pos, kv_len, causal, scale):
    s = dot_nt(q, k) * scale
    if mask_tile is not None:
        s = s + mask_tile.astype(jnp.float32)
    return jnp.where(_key_validity(q_pos, k_pos, kv_len, causal), s, -jnp.inf)


def _forward_kernel(q_ref, k_ref, v_ref, *refs, scale, causal, kv_len, block_k, has_mask):
    mask_ref = refs[0] if has_mask else None
    o_ref, lse_ref = refs[-2:]
    block_q, head_dim = q_ref.shape
    i = pl.program_id(2)
    q = q_ref[...]
    q_pos = iota(block_q, i * block_q)
    num_k_blocks = k_ref.shape[0] // block_k

    def step(j, carry):
        m_prev, l_prev, acc = carry
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        mask_tile = mask_ref[:, pl.ds(start, block_k)] if has_mask else None
        s = _scores(q, k, mask_tile, q_pos, iota(block_k, start), kv_len, causal, scale)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # all keys masked so far
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe[:, None])
        l_new = alpha * l_prev + jnp.sum(p, axis=1)
        acc = alpha[:, None] * acc + dot_nn(p.astype(v.dtype), v)
        return m_new, l_new, acc

    upper = jnp.minimum(num_k_blocks, cdiv((i + 1) * block_q, block_k)) if causal else num_k_blocks
    init = (
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros((block_q, head_dim), jnp.float32),
    )
    m, l, acc = lax.fori_loop(0, upper, step, init)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))


def _probabilities(s, lse):
    lse_safe = jnp.where(lse == -jnp.inf, jnp.inf, lse)  # fully masked rows: p = 0
    return jnp.exp(s - lse_safe[:, None])


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, scale, causal, kv_len, block_k, has_mask):
    mask_ref = refs[0] if has_mask else None
    dq_ref = refs[-1]
    block_q, head_dim = q_ref.shape
    i = pl.program_id(2)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_pos = iota(block_q, i * block_q)
    num_k_blocks = k_ref.shape[0] // block_k

    def step(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        mask_tile = mask_ref[:, pl.ds(start, block_k)] if has_mask else None
        p = _probabilities(_scores(q, k, mask_tile, q_pos, iota(block_k, start), kv_len, causal, scale), lse)
        ds = p * (dot_nt(do, v) - delta[:, None])
        return dq + dot_nn(ds.astype(k.dtype), k)

    upper = jnp.minimum(num_k_blocks, cdiv((i + 1) * block_q, block_k)) if causal else num_k_blocks
    dq = lax.fori_loop(0, upper, step, jnp.zeros((block_q, head_dim), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, scale, causal, kv_len, block_q, has_mask):
    mask_ref = refs[0] if has_mask else None
    dk_ref, dv_ref = refs[-2:]
    block_k, head_dim = k_ref.shape
    j = pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    k_pos = iota(block_k, j * block_k)
    num_q_blocks = q_ref.shape[0] // block_q

    def step(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        q = q_ref[pl.ds(start, block_q), :]
        do = do_ref[pl.ds(start, block_q), :]
        lse = lse_ref[pl.ds(start, block_q)]
        delta = delta_ref[pl.ds(start, block_q)]
        mask_tile = mask_ref[pl.ds(start, block_q), :] if has_mask else None
        p = _probabilities(_scores(q, k, mask_tile, iota(block_q, start), k_pos, kv_len, causal, scale), lse)
        dv = dv + dot_tn(p.astype(do.dtype), do)
        ds = p * (dot_nt(do, v) - delta[:, None])
        dk = dk + dot_tn(ds.astype(q.dtype), q)
        return dk, dv

    lower = (j * block_k) // block_q if causal else 0  # earlier query blocks see none of these keys
    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    dk, dv = lax.fori_loop(lower, num_q_blocks, step, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# --------------------------------------------------------------------------- pallas calls


def _mask_4d(mask, q_shape, kv_len):
    """The mask as additive float32 (Bm, Hm, Lq, Lk) with Bm, Hm in {1, B/H}."""
    mask = _additive_mask(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    return jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], q_shape[2], kv_len))


def _mask_spec(mask, rows, cols, index):
    """BlockSpec for a (Bm, Hm, Lq, Lk) mask whose batch/head dims may be broadcast."""
    broadcast_b, broadcast_h = mask.shape[0] == 1, mask.shape[1] == 1

    def index_map(b, h, x):
        row, col = index(x)
        return (0 if broadcast_b else b, 0 if broadcast_h else h, row, col)

    return pl.BlockSpec((None, None, rows, cols), index_map)


@functools.partial(jax.jit, static_argnames=("config",))
def _forward(q, k, v, mask, config):
    causal, scale, impl, block_q, block_k = config
    batch, heads, length, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    q_pad, k_pad = round_up(length, block_q), round_up(kv_len, block_k)
    qp = pad_axis(q, 2, q_pad)
    kp, vp = pad_axis(k, 2, k_pad), pad_axis(v, 2, k_pad)
    in_specs = [
        pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0)),
        pl.BlockSpec((None, None, k_pad, head_dim), lambda b, h, i: (b, h // groups, 0, 0)),
        pl.BlockSpec((None, None, k_pad, head_dim), lambda b, h, i: (b, h // groups, 0, 0)),
    ]
    operands = [qp, kp, vp]
    if mask is not None:
        mask = pad_axis(pad_axis(_mask_4d(mask, q.shape, kv_len), 2, q_pad), 3, k_pad, -jnp.inf)
        in_specs.append(_mask_spec(mask, block_q, k_pad, lambda i: (i, 0)))
        operands.append(mask)
    kernel = functools.partial(
        _forward_kernel, scale=scale, causal=causal, kv_len=kv_len, block_k=block_k, has_mask=mask is not None
    )
    out, lse = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((batch, heads, q_pad, head_dim), q.dtype),
            jax.ShapeDtypeStruct((batch, heads, q_pad), jnp.float32),
        ),
        grid=(batch, heads, q_pad // block_q),
        in_specs=in_specs,
        out_specs=(
            pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0)),
            pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i)),
        ),
        interpret=impl == "interpret",
        name="flash_attention_forward",
    )(*operands)
    return out[:, :, :length], lse[:, :, :length]


@functools.partial(jax.jit, static_argnames=("config",))
def _backward(dout, q, k, v, mask, out, lse, config):
    causal, scale, impl, block_q, block_k = config
    batch, heads, length, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    q_pad, k_pad = round_up(length, block_q), round_up(kv_len, block_k)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    qp, dop = pad_axis(q, 2, q_pad), pad_axis(dout, 2, q_pad)
    lsep, deltap = pad_axis(lse, 2, q_pad, jnp.inf), pad_axis(delta, 2, q_pad)
    kp, vp = pad_axis(k, 2, k_pad), pad_axis(v, 2, k_pad)
    if mask is not None:
        mask = pad_axis(pad_axis(_mask_4d(mask, q.shape, kv_len), 2, q_pad), 3, k_pad, -jnp.inf)
    has_mask = mask is not None
    static = dict(scale=scale, causal=causal, kv_len=kv_len, has_mask=has_mask)

    q_block = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0))
    row_block = pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))
    kv_whole = pl.BlockSpec((None, None, k_pad, head_dim), lambda b, h, i: (b, h // groups, 0, 0))
    dq_specs = [q_block, kv_whole, kv_whole, q_block, row_block, row_block]
    dq_operands = [qp, kp, vp, dop, lsep, deltap]
    if has_mask:
        dq_specs.append(_mask_spec(mask, block_q, k_pad, lambda i: (i, 0)))
        dq_operands.append(mask)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=block_k, **static),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        grid=(batch, heads, q_pad // block_q),
        in_specs=dq_specs,
        out_specs=q_block,
        interpret=impl == "interpret",
        name="flash_attention_dq",
    )(*dq_operands)

    # dK/dV per query head (one program per key block), then summed over each KV group.
    q_whole = pl.BlockSpec((None, None, q_pad, head_dim), lambda b, h, j: (b, h, 0, 0))
    row_whole = pl.BlockSpec((None, None, q_pad), lambda b, h, j: (b, h, 0))
    kv_block = pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, j: (b, h // groups, j, 0))
    out_block = pl.BlockSpec((None, None, block_k, head_dim), lambda b, h, j: (b, h, j, 0))
    dkv_specs = [q_whole, kv_block, kv_block, q_whole, row_whole, row_whole]
    dkv_operands = [qp, kp, vp, dop, lsep, deltap]
    if has_mask:
        dkv_specs.append(_mask_spec(mask, q_pad, block_k, lambda j: (0, j)))
        dkv_operands.append(mask)
    grad_dtype = k.dtype if groups == 1 else jnp.float32
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=block_q, **static),
        out_shape=(
            jax.ShapeDtypeStruct((batch, heads, k_pad, head_dim), grad_dtype),
            jax.ShapeDtypeStruct((batch, heads, k_pad, head_dim), grad_dtype),
        ),
        grid=(batch, heads, k_pad // block_k),
        in_specs=dkv_specs,
        out_specs=(out_block, out_block),
        interpret=impl == "interpret",
        name="flash_attention_dkv",
    )(*dkv_operands)
    if groups > 1:
        dk = dk.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2).astype(k.dtype)
        dv = dv.reshape(batch, kv_heads, groups, k_pad, head_dim).sum(axis=2).astype(v.dtype)
    return dq[:, :, :length], dk[:, :, :kv_len], dv[:, :, :kv_len]


# --------------------------------------------------------------------------- public API


def _check_shapes(q, k, v, mask):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"flash_attention: q, k, v must be (batch, heads, seq, head_dim); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"flash_attention: k and v must be (batch, kv_heads, kv_seq, head_dim) like q; got {k.shape}, {v.shape} for q {q.shape}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"flash_attention: query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if mask is not None:
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        padded = (1,) * (4 - mask.ndim) + tuple(mask.shape)
        if mask.ndim > 4 or any(m not in (1, f) for m, f in zip(padded, full)):
            raise ValueError(f"flash_attention: mask {tuple(mask.shape)} does not broadcast to (batch, heads, q_seq, kv_seq) = {full}")


def resolve_config(q, k, causal=False, scale=None, impl=None, block_q=None, block_k=None) -> tuple:
    """The static part of a call: (causal, scale, impl, block_q, block_k)."""
    impl = check_implementation(impl or default_implementation())
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    tuned = tuning.blocks("attention", tuning_backend(impl), q.shape[2], k.shape[2], q.shape[3])
    return (bool(causal), scale, impl, block_q or tuned["block_q"], block_k or tuned["block_k"])


def attention_forward(q, k, v, mask, config):
    """(out, logsumexp) for a resolved config (see `resolve_config`)."""
    if config[2] == "reference":
        return attention_reference(q, k, v, mask, config[0], config[1])
    return _forward(q, k, v, mask, config)


def attention_backward(dout, q, k, v, mask, out, lse, config):
    """(dq, dk, dv) from the saved output and logsumexp."""
    if config[2] == "reference":
        _, vjp = jax.vjp(lambda a, b, c: attention_reference(a, b, c, mask, config[0], config[1])[0], q, k, v)
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

    impl: "pallas" (TPU/GPU), "interpret" (Pallas interpreter, any backend) or
    "reference" (plain XLA); default: compiled on an accelerator, interpreted on CPU.
    Block sizes default to `kernels.tuning`. The mask is not differentiated.
    """
    _check_shapes(q, k, v, mask)
    config = resolve_config(q, k, causal, scale, impl, block_q, block_k)
    return _flash(q, k, v, mask, config)
