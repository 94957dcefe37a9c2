"""Chunked softmax cross-entropy (interpret mode) against the JAX reference and
`F.cross_entropy` on CPU: loss and d logits, every reduction, ignored rows, a
vocabulary that is not a multiple of the chunk and a row count that is not a multiple
of the row block."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
import torch.nn.functional as F

from kernels.cross_entropy import cross_entropy
from tests.kernels._util import KERNEL_IMPL, assert_close, normal, to_torch, tolerance


def check_case(rows, vocab, dtype, reduction, block_rows=8, block_vocab=128):
    logits = normal(1, (rows, vocab), dtype) * 3
    targets = jax.random.randint(jax.random.PRNGKey(2), (rows,), 0, vocab).at[1].set(-100)
    kernel = lambda x: cross_entropy(
        x, targets, reduction=reduction, impl=KERNEL_IMPL, block_rows=block_rows, block_vocab=block_vocab
    )
    reference = lambda x: cross_entropy(x, targets, reduction=reduction, impl="reference")
    loss, kernel_vjp = jax.vjp(kernel, logits)
    expected, reference_vjp = jax.vjp(reference, logits)
    cotangent = normal(3, loss.shape, dtype)
    tol = tolerance(dtype)
    assert_close(loss, expected, tol, "loss vs JAX reference")
    assert_close(kernel_vjp(cotangent)[0], reference_vjp(cotangent)[0], tol, "d logits vs JAX reference")

    torch_logits = to_torch(logits.astype(jnp.float32), True)
    torch_loss = F.cross_entropy(torch_logits, to_torch(targets).long(), reduction=reduction)
    torch_loss.backward(to_torch(cotangent.astype(jnp.float32)))
    assert_close(loss, torch_loss, tol, "loss vs PyTorch CPU")
    assert_close(kernel_vjp(cotangent)[0], torch_logits.grad, tol, "d logits vs PyTorch CPU")


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy(reduction):
    check_case(21, 1000, jnp.float32, reduction)


@pytest.mark.slow
@pytest.mark.parametrize(
    "rows,vocab,dtype,reduction",
    list(itertools.product((16, 37), (512, 5003), (jnp.float32, jnp.bfloat16), ("mean", "sum", "none"))),
)
def test_cross_entropy_grid(rows, vocab, dtype, reduction):
    check_case(rows, vocab, dtype, reduction, block_rows=16, block_vocab=1024)


def test_cross_entropy_rejects_bad_input():
    with pytest.raises(ValueError, match="logits \\(N, V\\) and targets \\(N,\\)"):
        cross_entropy(jnp.zeros((2, 3, 4)), jnp.zeros((2,), jnp.int32), impl="interpret")
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(jnp.zeros((2, 4)), jnp.zeros((2,), jnp.int32), reduction="avg", impl="interpret")
