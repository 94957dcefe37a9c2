"""Decode attention over a KV cache (interpret mode): one query token per sequence, a
valid length per sequence (including 0 and the full cache), MHA and GQA, against the
JAX reference and PyTorch CPU's SDPA with the equivalent mask."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

from kernels.decode_attention import decode_attention, decode_attention_reference
from tests.kernels._util import KERNEL_IMPL, assert_close, normal, to_torch, tolerance


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,dtype",
    [
        pytest.param(4, 2, 64, jnp.float32, id="gqa-f32"),
        pytest.param(2, 2, 128, jnp.bfloat16, id="mha-bf16", marks=pytest.mark.slow),
        pytest.param(8, 1, 256, jnp.float32, id="mqa-d256-f32", marks=pytest.mark.slow),
    ],
)
def test_decode_attention(heads, kv_heads, head_dim, dtype):
    batch, cache = 3, 50
    q = normal(1, (batch, heads, head_dim), dtype)
    k_cache, v_cache = (
        normal(2, (batch, kv_heads, cache, head_dim), dtype),
        normal(3, (batch, kv_heads, cache, head_dim), dtype),
    )
    lengths = jnp.array([cache, 17, 0])
    out = decode_attention(q, k_cache, v_cache, lengths, impl=KERNEL_IMPL, block_k=16)
    tol = tolerance(dtype, matmuls=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, decode_attention_reference(q, k_cache, v_cache, lengths), tol, "vs JAX reference")

    mask = torch.arange(cache)[None, :] < torch.tensor([cache, 17, 0])[:, None]
    expected = F.scaled_dot_product_attention(
        to_torch(q.astype(jnp.float32))[:, :, None],
        to_torch(k_cache.astype(jnp.float32)),
        to_torch(v_cache.astype(jnp.float32)),
        attn_mask=mask[:, None, None, :],
        enable_gqa=True,
    )[:, :, 0]
    assert_close(out, torch.nan_to_num(expected), tol, "vs PyTorch CPU")
    assert float(jnp.max(jnp.abs(out[2].astype(jnp.float32)))) == 0.0  # length 0: zeros


def test_decode_attention_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths must be"):
        decode_attention(
            jnp.zeros((2, 2, 64)), jnp.zeros((2, 2, 8, 64)), jnp.zeros((2, 2, 8, 64)), jnp.array([1]), impl="interpret"
        )
