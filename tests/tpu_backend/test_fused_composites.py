"""Fused eager mode records composite ops as one op each: `F.scaled_dot_product_attention`
on the XLA path becomes ONE `_scaled_dot_product_efficient_attention` node (with ATen's
own backward node) instead of its ~10-op decomposition. Values and gradients must equal
PyTorch CPU's (float32, atol 1e-5 / rtol 1e-4; on a TPU atol 1e-4, its exp), and the recorded
program must lower for TPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tpu_backend
from tests import chip
from tpu_backend import fused

ATOL = chip.tolerance("transcendentals", cpu=1e-5, tpu=1e-4)  # gradients 5.2e-5 apart seen on a v5e
RTOL = 1e-4


def _inputs(kv_heads: int = 4, mask: str | None = None, mask_grad: bool = False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, 5 if mask != "causal" else 6, 8, generator=g) for _ in range(2))
    m = None
    if mask == "bool":
        m = torch.rand(6, 5, generator=g) > 0.3
        m[:, 0] = True  # every row attends somewhere
    elif mask == "float":
        m = torch.randn(2, 1, 6, 5, generator=g).requires_grad_(mask_grad)
    return [q, k, v], m


CASES = {
    "no mask": dict(),
    "bool mask": dict(mask="bool"),
    "float mask": dict(mask="float"),
    "float mask with grad": dict(mask="float", mask_grad=True),
    "causal": dict(mask="causal"),
    "gqa": dict(kv_heads=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_is_one_recorded_op_with_cpu_values_and_grads(fused_mode, name):
    case = CASES[name]
    (q, k, v), mask = _inputs(**case)
    kwargs = dict(is_causal=case.get("mask") == "causal", enable_gqa=case.get("kv_heads", 4) != 4, scale=0.3)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    cpu_mask = mask.detach().clone().requires_grad_(mask.requires_grad) if mask is not None else None
    want = F.scaled_dot_product_attention(*cpu, attn_mask=cpu_mask, **kwargs)
    (want * torch.arange(want.numel()).reshape(want.shape).cos()).sum().backward()

    dev = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    dev_mask = mask.detach().to("tpu").requires_grad_(mask.requires_grad) if mask is not None else None
    got = F.scaled_dot_product_attention(*dev, attn_mask=dev_mask, **kwargs)
    weights = torch.arange(got.numel()).reshape(got.shape).cos().to("tpu")
    (got * weights).sum().backward()
    tpu_backend.mark_step()

    ops, _ = fused.last_program_text()
    assert ops.count("aten._scaled_dot_product_efficient_attention.default(") == 1, ops
    assert ops.count("aten._scaled_dot_product_efficient_attention_backward.default(") == 1, ops
    assert "_safe_softmax" not in ops and "bmm" not in ops, ops
    torch.testing.assert_close(got.cpu(), want.detach(), atol=ATOL, rtol=RTOL)
    for d, c in zip(dev, cpu):
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=ATOL, rtol=RTOL)
    if cpu_mask is not None and cpu_mask.requires_grad:
        torch.testing.assert_close(dev_mask.grad.cpu(), cpu_mask.grad, atol=ATOL, rtol=RTOL)
    exported = fused._last["compiled"].program.export(platforms=("tpu",))
    assert exported and all("tpu" in e.platforms for e in exported)


def test_dropout_attention_still_decomposes(fused_mode):
    """The one op has no dropout: such calls keep the decomposition (and its randomness)."""
    (q, k, v), _ = _inputs()
    torch.manual_seed(0)
    F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k, v)), dropout_p=0.5)
    tpu_backend.mark_step()
    ops, _ = fused.last_program_text()
    assert "_scaled_dot_product_efficient_attention" not in ops, ops


def test_strict_mode_keeps_the_decomposition():
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("strict")
    try:
        (q, k, v), _ = _inputs()
        from tpu_backend.eager.runner import runner

        efficient = runner(torch.ops.aten._scaled_dot_product_efficient_attention.default)
        calls = efficient.jitted.copy()
        got = F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k, v)))
        torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q, k, v), atol=ATOL, rtol=RTOL)
        assert efficient.jitted == calls
    finally:
        tpu_backend.set_eager_mode(previous)


def test_layer_norm_values_and_grads_match_cpu(fused_mode):
    """layer_norm's XLA path calls native_layer_norm directly (its decomposition)."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 5, 16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g)
    cpu = [t.clone().requires_grad_() for t in (x, w, b)]
    want = F.layer_norm(cpu[0], (16,), cpu[1], cpu[2], eps=1e-4)
    (want * want).sum().backward()
    dev = [t.to("tpu").requires_grad_() for t in (x, w, b)]
    got = F.layer_norm(dev[0], (16,), dev[1], dev[2], eps=1e-4)
    (got * got).sum().backward()
    torch.testing.assert_close(got.cpu(), want.detach(), atol=ATOL, rtol=RTOL)
    for d, c in zip(dev, cpu):
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=ATOL, rtol=RTOL)
