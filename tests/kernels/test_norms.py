"""RMSNorm and LayerNorm kernels (interpret mode), plain and fused with the residual
add, against the JAX reference and PyTorch CPU: outputs and gradients of x, residual,
weight and bias. Ragged row counts (not a multiple of the block) are the default."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

from kernels import norms
from tests.kernels._util import KERNEL_IMPL, assert_close, normal, to_torch, tolerance

BLOCK_ROWS = 16


def _torch_norm(kind, x, residual, weight, bias, eps):
    tx, tw = to_torch(x, True), to_torch(weight, True)
    tr = None if residual is None else to_torch(residual, True)
    tb = None if bias is None else to_torch(bias, True)
    h = tx if tr is None else tx + tr
    if kind == "rms":
        y = F.rms_norm(h, (x.shape[-1],), tw, eps)
    else:
        y = F.layer_norm(h, (x.shape[-1],), tw, tb, eps)
    return y, h, [t for t in (tx, tr, tw, tb) if t is not None]


def check_case(kind, shape, dtype, fused):
    x, weight = normal(1, shape, dtype), (1 + 0.1 * normal(2, shape[-1:])).astype(dtype)
    residual = normal(3, shape, dtype) if fused else None
    bias = normal(4, shape[-1:], dtype) if kind == "layer" else None
    eps = 1e-5

    def run(impl):
        def fn(x, residual, weight, bias):
            if kind == "rms":
                return norms.rms_norm(x, weight, eps=eps, residual=residual, impl=impl, block_rows=BLOCK_ROWS)
            return norms.layer_norm(x, weight, bias, eps=eps, residual=residual, impl=impl, block_rows=BLOCK_ROWS)

        return jax.vjp(fn, x, residual, weight, bias)

    out, kernel_vjp = run(KERNEL_IMPL)
    expected, reference_vjp = run("reference")
    out, expected = (out, expected) if fused else ((out,), (expected,))
    cotangents = tuple(normal(5 + i, o.shape, dtype) for i, o in enumerate(out))
    cotangent = cotangents if fused else cotangents[0]
    tol = tolerance(dtype)
    names = ("x", "residual", "weight", "bias")
    kernel_grads, reference_grads = kernel_vjp(cotangent), reference_vjp(cotangent)
    for o, e in zip(out, expected):
        assert o.dtype == dtype
        assert_close(o, e, tol, f"{kind} output vs JAX reference")
    for name, g, r in zip(names, kernel_grads, reference_grads):
        if r is not None:
            assert_close(g, r, tol, f"{kind} d{name} vs JAX reference")

    y, h, leaves = _torch_norm(
        kind,
        x.astype(jnp.float32),
        None if residual is None else residual.astype(jnp.float32),
        weight.astype(jnp.float32),
        None if bias is None else bias.astype(jnp.float32),
        eps,
    )
    assert_close(out[0], y, tol, f"{kind} output vs PyTorch CPU")
    torch_outputs = (y, h) if fused else (y,)
    torch.autograd.backward(torch_outputs, [to_torch(c.astype(jnp.float32)) for c in cotangents])
    present = [g for g in kernel_grads if g is not None]
    for g, leaf in zip(present, leaves):
        assert_close(g, leaf.grad, tol, f"{kind} gradient vs PyTorch CPU")


@pytest.mark.parametrize(
    "kind,shape,dtype,fused",
    [
        pytest.param("rms", (3, 13, 64), jnp.float32, True, id="rms-fused-residual-f32"),
        pytest.param("layer", (37, 128), jnp.bfloat16, False, id="layer-bf16"),
    ],
)
def test_norm(kind, shape, dtype, fused):
    check_case(kind, shape, dtype, fused)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,shape,dtype,fused",
    list(
        itertools.product(
            ("rms", "layer"), ((37, 128), (2, 40, 256), (16, 64)), (jnp.float32, jnp.bfloat16), (False, True)
        )
    ),
)
def test_norm_grid(kind, shape, dtype, fused):
    check_case(kind, shape, dtype, fused)


def test_norm_rejects_mismatched_weight():
    with pytest.raises(ValueError, match="weight and bias must have shape"):
        norms.rms_norm(jnp.zeros((4, 8)), jnp.ones((7,)), impl="interpret")
