"""`_foreach_*` and fused attention lowerings agree with PyTorch on CPU."""

import pytest
import torch
import torch.nn.functional as F
from ops_parity import assert_same, check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-5, rtol=1e-4)


def tensors():
    return [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]


def positive():
    return [t.abs() + 0.1 for t in tensors()]


def test_foreach_unary():
    for name in ("abs", "exp", "sqrt", "neg", "reciprocal", "sigmoid", "tanh", "sign", "log", "zero", "clone", "round"):
        check(getattr(aten, f"_foreach_{name}").default, positive() if name in ("sqrt", "log") else tensors(), **TOL)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max"])
def test_foreach_binary(name):
    packet = getattr(aten, f"_foreach_{name}")
    check(packet.Scalar, tensors(), 0.5, **TOL)
    check(packet.List, tensors(), positive(), **TOL)
    check(packet.ScalarList, tensors(), [1.5, -2.0, 3.0], **TOL)
    if "Tensor" in packet.overloads():
        check(packet.Tensor, tensors(), torch.tensor(2.0), **TOL)


def test_foreach_alpha_pow_and_optimizer_ops():
    check(aten._foreach_add.List, tensors(), tensors(), alpha=-0.1, **TOL)
    check(aten._foreach_sub.List, tensors(), tensors(), alpha=3, **TOL)
    check(aten._foreach_add.Tensor, tensors(), torch.tensor(1.0), alpha=2, **TOL)
    check(aten._foreach_pow.Scalar, positive(), 2.0, **TOL)
    check(aten._foreach_pow.List, positive(), tensors(), **TOL)
    check(aten._foreach_pow.ScalarList, positive(), [2, 0.5, 3], **TOL)
    check(aten._foreach_pow.ScalarAndTensor, 2.0, tensors(), **TOL)
    check(aten._foreach_addcmul.Scalar, tensors(), tensors(), tensors(), 0.3, **TOL)
    check(aten._foreach_addcmul.ScalarList, tensors(), tensors(), tensors(), [0.3, 1.0, -2.0], **TOL)
    check(aten._foreach_addcdiv.Scalar, tensors(), tensors(), positive(), -0.01, **TOL)
    check(aten._foreach_addcdiv.ScalarList, tensors(), tensors(), positive(), [0.1, 0.2, 0.3], **TOL)
    check(aten._foreach_addcdiv.Tensor, tensors(), tensors(), positive(), torch.tensor([0.1, 0.2, 0.3]), **TOL)
    check(aten._foreach_lerp.Scalar, tensors(), tensors(), 0.1, **TOL)
    check(aten._foreach_lerp.List, tensors(), tensors(), [torch.rand(3, 4), torch.rand(5), torch.rand(2, 2, 2)], **TOL)
    check(aten._foreach_lerp.ScalarList, tensors(), tensors(), [0.1, 0.9, 0.5], **TOL)
    check(aten._foreach_norm.Scalar, tensors(), **TOL)
    check(aten._foreach_norm.Scalar, tensors(), float("inf"), **TOL)
    check(aten._foreach_powsum.Scalar, tensors(), 2, **TOL)
    check(aten._foreach_max.default, tensors(), **TOL)
    check(aten._foreach_copy.default, tensors(), tensors(), **TOL)
    check(aten._foreach_mm.default, [torch.randn(2, 3)], [torch.randn(3, 4)], **TOL)


def qkv(heads_kv=2, length=5, source=7):
    return torch.randn(2, 2, length, 8), torch.randn(2, heads_kv, source, 8), torch.randn(2, heads_kv, source, 8)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_for_cpu_forward_and_backward(is_causal):
    q, k, v = qkv(length=6, source=6)
    out, lse = check(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, 0.0, is_causal, **TOL)
    g = torch.randn(out.shape)
    check(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default, g, q, k, v, out, lse, 0.0, is_causal, **TOL
    )
    mask = torch.randn(6, 6)
    check(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, attn_mask=mask, scale=0.3, **TOL)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_overrideable_attention_matches_sdpa(mask_kind):
    q, k, v = qkv()
    mask = {"none": None, "bool": torch.rand(5, 7) > 0.3, "float": torch.randn(2, 1, 5, 7)}[mask_kind]
    outputs = run_lowering(aten._scaled_dot_product_fused_attention_overrideable.default, q, k, v, mask)
    assert_same(outputs[0], F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert outputs[1].shape == (2, 2, 5) and outputs[1].dtype == torch.float32
    # Backward against autograd through PyTorch's math attention.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    bias = mask.clone().requires_grad_() if mask_kind == "float" else mask
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=bias)
    g = torch.randn(expected.shape)
    expected.backward(g)
    grads = run_lowering(
        aten._scaled_dot_product_fused_attention_overrideable_backward.default,
        g,
        q,
        k,
        v,
        mask,
        [True, True, True, mask_kind == "float"],
        outputs[0],
        outputs[1],
        outputs[2],
        outputs[3],
        5,
        7,
        0.0,
        False,
        outputs[6],
        outputs[7],
    )
    for got, leaf in zip(grads, leaves):
        assert_same(got, leaf.grad, **TOL)
    if mask_kind == "float":
        assert_same(grads[3], bias.grad, **TOL)
    else:
        assert grads[3] is None


def test_grouped_query_attention_and_dropout_error():
    q, k, v = qkv(heads_kv=1)
    out = run_lowering(aten._scaled_dot_product_fused_attention_overrideable.default, q, k, v, None, 0.0, True)[0]
    assert_same(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), **TOL)
    with pytest.raises(NotImplementedError, match="dropout"):
        run_lowering(aten._scaled_dot_product_fused_attention_overrideable.default, q, k, v, None, 0.1)
