"""Flash attention (interpret mode) against its JAX reference and PyTorch CPU: forward
and gradients, causal/non-causal, boolean/additive masks, GQA/MQA, ragged lengths.

Small blocks (16) make every case span several query and key blocks with a partial
last block. The default suite runs three representative cases; the full grid
(head dims 64/128/256, float32/bfloat16, MQA, masks) is `-m slow`.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

from kernels.flash_attention import attention_reference, flash_attention
from tests.kernels._util import KERNEL_IMPL, assert_close, attention_block, normal, to_torch, tolerance

BLOCK = 16


def _inputs(batch, heads, kv_heads, length, kv_length, head_dim, dtype, mask_kind):
    q = normal(1, (batch, heads, length, head_dim), dtype)
    k = normal(2, (batch, kv_heads, kv_length, head_dim), dtype)
    v = normal(3, (batch, kv_heads, kv_length, head_dim), dtype)
    mask = None
    if mask_kind == "bool":  # about 1 key in 5 hidden, some rows fully hidden
        mask = normal(4, (batch, 1, length, kv_length)) > -0.85
        mask = mask.at[:, :, 1, :].set(False)
    elif mask_kind == "additive":
        mask = normal(4, (1, heads, length, kv_length)) * 2.0
    return q, k, v, mask


def _torch_attention(q, k, v, mask, causal):
    """PyTorch CPU's SDPA (float32 math) on the same inputs; outputs and gradients."""
    tq, tk, tv = (to_torch(t.astype(jnp.float32), requires_grad=True) for t in (q, k, v))
    tmask = None if mask is None else to_torch(mask)
    if causal and tmask is not None:  # PyTorch takes one or the other: fold causality into the mask
        tril = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        tmask = tmask & tril if tmask.dtype == torch.bool else tmask.masked_fill(~tril, -math.inf)
        causal = False
    out = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=tmask, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1]
    )
    return out, (tq, tk, tv)


def check_case(
    batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind, block_q=BLOCK, block_k=BLOCK
):
    q, k, v, mask = _inputs(batch, heads, kv_heads, length, kv_length, head_dim, dtype, mask_kind)
    block_q, block_k = attention_block(block_q), attention_block(block_k)
    kernel = lambda a, b, c: flash_attention(
        a, b, c, mask, causal=causal, impl=KERNEL_IMPL, block_q=block_q, block_k=block_k
    )
    reference = lambda a, b, c: attention_reference(a, b, c, mask, causal)[0]
    out, kernel_vjp = jax.vjp(kernel, q, k, v)
    expected, reference_vjp = jax.vjp(reference, q, k, v)
    cotangent = normal(5, out.shape, dtype)
    tol = tolerance(dtype, matmuls=True)
    assert out.dtype == q.dtype
    assert_close(out, expected, tol, "output vs JAX reference")
    for name, grad, ref_grad in zip("qkv", kernel_vjp(cotangent), reference_vjp(cotangent)):
        assert_close(grad, ref_grad, tol, f"d{name} vs JAX reference")

    torch_out, leaves = _torch_attention(q, k, v, mask, causal)
    if mask_kind == "bool":  # PyTorch's math path gives NaN for fully hidden rows; we give zeros
        torch_out = torch.nan_to_num(torch_out)
    torch_out.backward(to_torch(cotangent.astype(jnp.float32)))
    assert_close(out, torch_out, tol, "output vs PyTorch CPU")
    for name, grad, leaf in zip("qkv", kernel_vjp(cotangent), leaves):
        assert_close(grad, torch.nan_to_num(leaf.grad), tol, f"d{name} vs PyTorch CPU")


REPRESENTATIVE = [
    # batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask
    pytest.param(1, 4, 2, 40, 40, 64, jnp.float32, True, None, id="causal-gqa-ragged-f32"),
    pytest.param(2, 2, 2, 24, 37, 64, jnp.float32, False, "bool", id="bool-mask-cross-ragged-f32"),
    pytest.param(
        1, 2, 1, 33, 33, 64, jnp.bfloat16, True, "additive", id="mqa-additive-causal-bf16", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize("batch,heads,kv_heads,length,kv_length,head_dim,dtype,causal,mask_kind", REPRESENTATIVE)
def test_flash_attention(batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind):
    check_case(batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind)


GRID = [
    pytest.param(
        1,
        heads,
        kv_heads,
        length,
        length,
        head_dim,
        dtype,
        causal,
        mask,
        id=f"d{head_dim}-h{heads}/{kv_heads}-L{length}-{'causal' if causal else 'full'}-{mask}-{jnp.dtype(dtype).name}",
    )
    for head_dim, (heads, kv_heads), length, causal, mask, dtype in itertools.product(
        (64, 128, 256),
        ((2, 2), (4, 2), (4, 1)),
        (32, 45),
        (False, True),
        (None, "bool", "additive"),
        (jnp.float32, jnp.bfloat16),
    )
]


@pytest.mark.slow
@pytest.mark.parametrize("batch,heads,kv_heads,length,kv_length,head_dim,dtype,causal,mask_kind", GRID)
def test_flash_attention_grid(batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind):
    check_case(batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind)


def test_flash_attention_rejects_bad_shapes():
    q = jnp.zeros((1, 3, 8, 64))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        flash_attention(q, jnp.zeros((1, 2, 8, 64)), jnp.zeros((1, 2, 8, 64)), impl="interpret")
    with pytest.raises(ValueError, match="does not broadcast"):
        flash_attention(q, q, q, jnp.zeros((2, 8, 8)), impl="interpret")
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        flash_attention(q[0], q[0], q[0], impl="interpret")
    if jax.default_backend() == "cpu":
        with pytest.raises(ValueError, match="impl='interpret'"):
            flash_attention(q, q, q, impl="pallas")


UNEQUAL = [
    # causal bounds mix both block sizes and both lengths: Lq != Lk, block_q != block_k,
    # partial last blocks on both sides (#22 item 9)
    pytest.param(1, 4, 2, 40, 72, 32, jnp.float32, True, None, 8, 32, id="causal-gqa-lq<lk-bq8-bk32"),
    pytest.param(
        1,
        2,
        1,
        70,
        30,
        32,
        jnp.float32,
        True,
        "bool",
        32,
        8,
        id="causal-mqa-mask-lq>lk-bq32-bk8",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        1, 2, 2, 50, 50, 64, jnp.float32, False, "additive", 16, 48, id="additive-bk-not-pow2", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize(
    "batch,heads,kv_heads,length,kv_length,head_dim,dtype,causal,mask_kind,block_q,block_k", UNEQUAL
)
def test_flash_attention_unequal_blocks_and_lengths(
    batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind, block_q, block_k
):
    check_case(batch, heads, kv_heads, length, kv_length, head_dim, dtype, causal, mask_kind, block_q, block_k)


@pytest.mark.slow
def test_flash_attention_long_sequence_gqa():
    """The grid-tiled path at a long context: 2048 x 2048 over 16 key blocks per query
    block, GQA 4:1, causal, with the TPU tuning's 128-row blocks."""
    check_case(1, 4, 1, 2048, 2048, 64, jnp.float32, True, None, 128, 128)


@pytest.mark.slow
def test_reference_matches_pytorch_scale_and_causal_alignment():
    """The reference itself: explicit scale and top-left causal alignment for Lq != Lk."""
    q, k, v, _ = _inputs(1, 2, 2, 5, 9, 64, jnp.float32, None)
    out = attention_reference(q, k, v, None, True, 0.3)[0]
    expected = F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), is_causal=True, scale=0.3)
    assert_close(out, expected, 2e-5, "reference vs PyTorch")
    assert math.isclose(float(jnp.sum(out)), float(expected.sum()), rel_tol=1e-4)
