"""Fused scaled-dot-product attention ops and their backward.

`F.scaled_dot_product_attention` reaches a backend either decomposed (the "math" path:
matmul, softmax...) or as one fused op, depending on `_fused_sdp_choice`. For a
PrivateUse1 device the fused op is `_scaled_dot_product_fused_attention_overrideable`
(SDPBackend.overrideable = 4); the CPU-named `_scaled_dot_product_flash_attention_for_cpu`
shows up in graphs traced on CPU. All of them are one function here, `_attention`, in
float32 for half-precision inputs; backward ops are `jax.vjp` of it (recomputation,
no saved probabilities). Dropout inside the fused op is not supported: it raises and
says to use the math path (`torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`).

logsumexp (the softmax normaliser per query row, shape (B, H, L), float32) is
returned so graphs that save it for backward keep ATen's shapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _repeat_kv_heads(q, kv):
    """Grouped-query attention: repeat key/value heads to match the query heads."""
    if kv.ndim < 3 or kv.shape[-3] == q.shape[-3]:
        return kv
    return jnp.repeat(kv, q.shape[-3] // kv.shape[-3], axis=-3)


def _attention(q, k, v, mask, is_causal, scale):
    """(output, logsumexp). `mask`: bool (True = attend) or additive float, broadcastable."""
    out_dtype = q.dtype
    compute = jnp.float32 if q.dtype in (jnp.float16, jnp.bfloat16) else q.dtype
    q, k, v = (t.astype(compute) for t in (q, k, _repeat_kv_heads(q, v)))
    k = _repeat_kv_heads(q, k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...le,...se->...ls", q, k) * scale
    if is_causal:
        length, source = scores.shape[-2:]
        causal = jnp.tril(jnp.ones((length, source), jnp.bool_))
        scores = jnp.where(causal, scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == jnp.bool_ else scores + mask.astype(compute)
    logsumexp = jax.nn.logsumexp(scores, axis=-1)
    probs = jnp.exp(scores - logsumexp[..., None])
    probs = jnp.where(jnp.isnan(probs), 0.0, probs)  # fully masked rows give zeros, not NaN
    out = jnp.einsum("...ls,...se->...le", probs, v)
    return out.astype(out_dtype), logsumexp.astype(jnp.float32)


def _no_dropout(op_name, dropout_p):
    # A traced dropout_p makes this `if` raise a tracer error: the device then retries
    # with Python floats static, and the check runs on the real value.
    if dropout_p != 0:
        raise NotImplementedError(
            f"aten.{op_name}: dropout inside fused attention is not supported on the tpu device; "
            "use the math path (torch.nn.attention.sdpa_kernel(SDPBackend.MATH)) or dropout_p=0"
        )


def _grads(grad_out, q, k, v, mask, is_causal, scale):
    """(grad_q, grad_k, grad_v, grad_mask or None) by jax.vjp of `_attention`."""
    differentiable_mask = mask is not None and mask.dtype != jnp.bool_
    if differentiable_mask:
        _, vjp = jax.vjp(lambda a, b, c, m: _attention(a, b, c, m, is_causal, scale)[0], q, k, v, mask)
        return vjp(grad_out)
    _, vjp = jax.vjp(lambda a, b, c: _attention(a, b, c, mask, is_causal, scale)[0], q, k, v)
    return (*vjp(grad_out), None)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _no_dropout("_scaled_dot_product_flash_attention_for_cpu", dropout_p)
    return _attention(query, key, value, attn_mask, is_causal, scale)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_flash_for_cpu_backward(
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    return _grads(grad_out, query, key, value, attn_mask, is_causal, scale)[:3]


@lowers(aten._scaled_dot_product_fused_attention_overrideable.default)
def sdpa_overrideable(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """ATen's nine outputs; only output and logsumexp carry data (the sequence
    bookkeeping is for variable-length kernels we do not use)."""
    _no_dropout("_scaled_dot_product_fused_attention_overrideable", dropout_p)
    out, logsumexp = _attention(query, key, value, attn_bias, is_causal, scale)
    empty = jnp.zeros((0,), jnp.int64)
    return out, logsumexp, empty, empty, query.shape[-2], key.shape[-2], empty, empty, jnp.zeros((0,), query.dtype)


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_overrideable_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    """(grad_query, grad_key, grad_value, grad_attn_bias); None where the mask says so."""
    grads = _grads(grad_out, query, key, value, attn_bias, is_causal, scale)
    return tuple(g if wanted else None for g, wanted in zip(grads, grad_input_mask))


@lowers(aten._scaled_dot_product_efficient_attention.default)
def sdpa_efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    _no_dropout("_scaled_dot_product_efficient_attention", dropout_p)
    out, logsumexp = _attention(query, key, value, attn_bias, is_causal, scale)
    empty = jnp.zeros((), jnp.int64)
    return out, logsumexp if compute_log_sumexp else jnp.zeros((0,), jnp.float32), empty, empty


@lowers(aten._scaled_dot_product_efficient_attention_backward.default)
def sdpa_efficient_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    *,
    scale=None,
):
    grads = _grads(grad_out, query, key, value, attn_bias, is_causal, scale)
    return tuple(g if wanted else None for g, wanted in zip(grads, grad_input_mask))
