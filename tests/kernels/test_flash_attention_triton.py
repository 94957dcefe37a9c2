"""The GPU (Triton) flash attention against the JAX reference and PyTorch CPU: forward
and gradients, causal and not, GQA, ragged lengths, Lq != Lk.

Runs in Pallas's interpreter here (the kernel bodies as written for Triton); with
`KERNELS_TEST_IMPL=triton` on a CUDA GPU the same cases run compiled by Triton
(`benchmarks/kernels/accelerator_check.py`). Blocks of 16 make every case span several query and
key blocks with a partial last one. Interpreted, a case costs 5-40 s (compiling three
interpreted kernels and their reference), so the numerical cases are `-m slow` here and
in the default selection when compiled on a GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch.nn.functional as F

from kernels.flash_attention import attention_reference
from kernels.flash_attention_triton import flash_attention_triton
from tests.kernels._util import TRITON_INTERPRET, assert_close, normal, to_torch, tolerance

slow_when_interpreted = pytest.mark.slow if TRITON_INTERPRET else (lambda test: test)


def check_case(heads, kv_heads, length, kv_length, head_dim, dtype, causal, block=16):
    q = normal(1, (1, heads, length, head_dim), dtype)
    k = normal(2, (1, kv_heads, kv_length, head_dim), dtype)
    v = normal(3, (1, kv_heads, kv_length, head_dim), dtype)
    dout = normal(4, q.shape, dtype)
    kernel = lambda a, b, c: flash_attention_triton(
        a, b, c, causal=causal, interpret=TRITON_INTERPRET, block_q=block, block_k=block
    )
    reference = lambda a, b, c: attention_reference(a, b, c, None, causal)[0]
    out, kernel_vjp = jax.vjp(kernel, q, k, v)
    expected, reference_vjp = jax.vjp(reference, q, k, v)
    tol = tolerance(dtype, matmuls=True)
    assert out.dtype == dtype
    assert_close(out, expected, tol, "output vs JAX reference")
    for name, g, r in zip("qkv", kernel_vjp(dout), reference_vjp(dout)):
        assert g.dtype == dtype
        assert_close(g, r, tol, f"d{name} vs JAX reference")

    tq, tk, tv = (to_torch(t.astype(jnp.float32), requires_grad=True) for t in (q, k, v))
    torch_out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=heads != kv_heads)
    assert_close(out, torch_out, max(tol, 2e-5), "output vs PyTorch SDPA")


@slow_when_interpreted
def test_causal_gqa_ragged():
    check_case(heads=4, kv_heads=2, length=40, kv_length=40, head_dim=32, dtype=jnp.float32, causal=True)


@slow_when_interpreted
@pytest.mark.parametrize(
    "heads, kv_heads, length, kv_length, head_dim, dtype, causal",
    [
        (2, 2, 24, 40, 32, jnp.float32, False),  # cross attention, Lq < Lk
        (2, 1, 48, 48, 64, jnp.float32, True),  # MQA
        (2, 2, 33, 33, 128, jnp.bfloat16, True),
        (4, 2, 40, 24, 64, jnp.bfloat16, False),  # Lq > Lk
    ],
)
def test_grid(heads, kv_heads, length, kv_length, head_dim, dtype, causal):
    check_case(heads, kv_heads, length, kv_length, head_dim, dtype, causal)


def test_rejects_what_it_does_not_cover():
    q = jnp.zeros((1, 2, 16, 32))
    with pytest.raises(ValueError, match="head dim 48"):
        flash_attention_triton(jnp.zeros((1, 2, 16, 48)), jnp.zeros((1, 2, 16, 48)), jnp.zeros((1, 2, 16, 48)))
    with pytest.raises(ValueError, match="not a multiple of kv heads"):
        flash_attention_triton(q, jnp.zeros((1, 3, 16, 32)), jnp.zeros((1, 3, 16, 32)))
    with pytest.raises(ValueError, match="powers of two"):
        flash_attention_triton(q, q, q, block_q=24, interpret=True)
