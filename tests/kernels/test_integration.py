"""The kernels on "tpu" tensors through PyTorch's own API: mode switching, routing,
training parity (kernels forced on in interpret mode vs off, step for step) and
`torch.compile(backend="tpu")` graphs that contain the custom ops."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tpu_backend  # noqa: F401  (registers the device)
import tpu_backend.compile as tpu_compile
from benchmarks.models import (
    GPTConfig,
    ModelCase,
    TinyGPT,
    make_optimizer,
    sequence_loss,
    train_step,
    training_batches,
)
from tpu_backend import kernels


@pytest.fixture(autouse=True)
def restore_mode():
    previous = kernels.mode()
    kernels.reset_stats()
    yield
    kernels.set_mode(previous)


def test_modes_and_context_manager():
    kernels.set_mode("off")
    assert kernels.implementation() == "reference"
    with kernels.use("interpret"):
        assert kernels.mode() == "interpret" and kernels.implementation() == "interpret"
    assert kernels.mode() == "off"
    kernels.use("on")  # a plain call sets the mode
    assert kernels.implementation() in ("interpret", "pallas")
    with pytest.raises(ValueError, match="not one of auto, on, off, interpret"):
        kernels.use("fast")


def test_uncovered_calls_fall_back_and_say_why():
    q, logits, x = torch.randn(1, 2, 8, 16), torch.randn(4, 5), torch.randn(2, 8)
    target = torch.tensor([0, 1, 2, 3])
    with kernels.use("interpret"):
        out = F.scaled_dot_product_attention(q.to("tpu"), q.to("tpu"), q.to("tpu"))  # head dim 16: not a kernel shape
        loss = F.cross_entropy(logits.to("tpu"), target.to("tpu"), label_smoothing=0.1)
    with kernels.use("off"):
        normed = F.layer_norm(x.to("tpu"), (8,))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(logits, target, label_smoothing=0.1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(normed.cpu(), F.layer_norm(x, (8,)), rtol=1e-5, atol=1e-5)
    assert kernels.stats() == {
        "scaled_dot_product_attention: xla (head dim 16)": 1,
        "cross_entropy: xla (label smoothing)": 1,
        "layer_norm: xla (mode off)": 1,
    }


def test_calls_no_tpu_kernel_can_take_fall_back_with_counted_reason():
    """With the compiled TPU kernels selected (lowering for a v5e), a row too wide for
    VMEM and a float16 SDPA go to XLA, with the reason `kernels.check_lowering` gives;
    nothing raises and the values are PyTorch's."""
    from kernels import tpu

    wide = torch.randn(8, 131072, device="tpu")  # backward: dy, h, dx tiles of 4 MiB, double-buffered
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16, device="tpu")
    with tpu.lowering_for("v5e"):
        assert kernels.implementation() == "pallas"
        y = F.rms_norm(wide, (131072,), eps=1e-6)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.allclose(y.cpu(), F.rms_norm(wide.cpu(), (131072,), eps=1e-6), atol=1e-5)
    expected = F.scaled_dot_product_attention(q.cpu().float(), q.cpu().float(), q.cpu().float(), is_causal=True)
    assert torch.allclose(out.cpu().float(), expected, atol=2e-3)
    assert kernels.stats() == {
        "rms_norm: xla (VMEM 24.0 MiB > 16 MiB scoped on v5e)": 1,
        "scaled_dot_product_attention: xla (dtype float16 (TPU kernels take bfloat16, float32))": 1,
    }


def test_auto_leaves_shapes_where_xla_was_measured_faster(monkeypatch):
    """A size listed in `XLA_FASTER_BELOW` goes to XLA in mode "auto", with the measurement
    as the counted reason; a larger one and mode "on" take the compiled kernel."""
    from kernels import tpu

    evidence = "v5e, 8 rows x 1000: kernel 0.2 ms, XLA 0.1 ms"
    monkeypatch.setitem(kernels.XLA_FASTER_BELOW, "cross_entropy", (4096, "vocabulary", evidence))
    small, target = torch.randn(8, 1000, device="tpu"), torch.zeros(8, dtype=torch.long, device="tpu")
    with tpu.lowering_for("v5e"):
        loss = F.cross_entropy(small, target)
        assert kernels.stats() == {f"cross_entropy: xla (XLA measured faster for vocabulary < 4096: {evidence})": 1}
        kernels.reset_stats()
        with kernels.use("on"):  # `on` is the user's choice: the kernel (its program is only traced here)
            assert kernels._route("cross_entropy", lambda: None, lambda chip: None, 1000) == "pallas"
        assert kernels._route("cross_entropy", lambda: None, lambda chip: None, 8192) == "pallas"
    assert torch.allclose(loss.cpu(), F.cross_entropy(small.cpu(), target.cpu()), atol=1e-6)
    assert kernels.stats() == {"cross_entropy: kernel": 2}


def test_custom_ops_on_tpu_tensors_match_cpu():
    """torch.ops.tpu_kernels.* run on tpu tensors (device table) and CPU tensors (host copies)."""
    torch.manual_seed(0)
    x, residual, weight = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64)
    with kernels.use("interpret"):
        y, h = kernels.rms_norm(x.to("tpu"), weight.to("tpu"), eps=1e-6, residual=residual.to("tpu"))
        y_cpu, h_cpu = kernels.rms_norm(x, weight, eps=1e-6, residual=residual)
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), y_cpu)
    torch.testing.assert_close(h.cpu(), x + residual)
    torch.testing.assert_close(y_cpu, F.rms_norm(x + residual, (64,), weight, 1e-6), rtol=2e-5, atol=2e-5)


TINY_GPT = GPTConfig(vocab=64, context=16, width=64, heads=2, layers=1)  # head dim 32
TINY_CASE = ModelCase(
    "tiny_gpt",
    lambda: TinyGPT(TINY_GPT),
    lambda g: (lambda t: (t[:, :-1].contiguous(), t[:, 1:].contiguous()))(torch.randint(0, 64, (2, 17), generator=g)),
    sequence_loss,
)
STEPS = 5


def _train(model, mode, optimizer_name="adamw"):
    optimizer = make_optimizer(optimizer_name, model.parameters())  # SGD passes a gradient's scale through
    losses = []
    with kernels.use(mode):
        for inputs, target in training_batches(TINY_CASE, STEPS):
            losses.append(train_step(model, optimizer, TINY_CASE, inputs.to("tpu"), target.to("tpu")).item())
    return losses


# SGD passes a gradient's scale into the weights (Adam divides it out): it is the default case
@pytest.mark.parametrize("optimizer_name", ["sgd", pytest.param("adamw", marks=pytest.mark.slow)])
def test_tiny_gpt_trains_the_same_with_kernels_on(optimizer_name):
    """Attention (nn.MultiheadAttention -> SDPA with an additive causal mask), both
    LayerNorms and the loss run as kernels; every step's loss matches kernels off."""
    torch.manual_seed(0)
    model = TinyGPT(TINY_GPT)
    reference = _train(copy.deepcopy(model).to("tpu"), "off", optimizer_name)
    kernels.reset_stats()
    with_kernels = _train(copy.deepcopy(model).to("tpu"), "interpret", optimizer_name)
    routed = kernels.stats()
    assert routed == {
        "scaled_dot_product_attention: kernel": STEPS,
        "layer_norm: kernel": 3 * STEPS,
        "cross_entropy: kernel": STEPS,
    }
    for step, (a, b) in enumerate(zip(with_kernels, reference)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: loss {a} with kernels vs {b} without"
    assert with_kernels[-1] < with_kernels[0]


class _AttentionHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(32)
        self.head = torch.nn.Linear(32, 300)

    def forward(self, q, k, v, target):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.cross_entropy(self.head(self.norm(out.reshape(-1, 32))), target)


@pytest.mark.slow
def test_compiled_graph_uses_the_custom_ops(tmp_path: Path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _AttentionHead().to("tpu")
    inputs = [torch.randn(1, 2, 24, 32, device="tpu", requires_grad=True) for _ in range(3)]
    target = torch.randint(0, 300, (48,), device="tpu")
    with kernels.use("interpret"), tpu_compile.dump(tmp_path):
        loss = torch.compile(model, backend="tpu")(*inputs, target)
        loss.backward()
    compiled_grads = [t.grad.cpu() for t in inputs]
    graphs = "".join(p.read_text() for p in tmp_path.glob("*.fx.py"))
    for op in ("tpu_kernels.flash_attention", "tpu_kernels.norm", "tpu_kernels.cross_entropy"):
        assert op in graphs, f"{op} missing from the compiled graphs"
    assert "flash_attention_backward" in graphs and "norm_backward" in graphs

    for t in inputs:
        t.grad = None
    with kernels.use("off"):
        eager = model(*inputs, target)
        eager.backward()
    torch._dynamo.reset()
    assert abs(loss.item() - eager.item()) <= 1e-5 * abs(eager.item())
    for a, t in zip(compiled_grads, inputs):
        torch.testing.assert_close(a, t.grad.cpu(), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_gqa_on_tpu_matches_pytorch_cpu(dtype):
    """F.scaled_dot_product_attention(enable_gqa=True) on tpu tensors, routed to the kernel,
    against PyTorch CPU: output and gradients (2e-5 float32, 2e-2 bfloat16 relative)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 40, 64), torch.randn(2, 2, 40, 64), torch.randn(2, 2, 40, 64)
    cpu = [t.to(dtype).float().clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to(dtype).to("tpu").detach().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*cpu, is_causal=True, enable_gqa=True)
    with kernels.use("interpret"):
        out = F.scaled_dot_product_attention(*dev, is_causal=True, enable_gqa=True)
    assert kernels.stats() == {"scaled_dot_product_attention: kernel": 1}
    grad = torch.randn(out.shape)
    expected.backward(grad)
    out.backward(grad.to(dtype).to("tpu"))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for actual, reference in [(out, expected)] + [(d.grad, c.grad) for d, c in zip(dev, cpu)]:
        actual = actual.detach().cpu().float()
        assert actual.dtype == torch.float32 and actual.shape == reference.shape
        error = ((actual - reference).abs().max() / reference.abs().max()).item()
        assert error <= tol, f"relative error {error:.3g} > {tol}"


class _PreNormBlock(torch.nn.Module):
    """x + r feeds a norm and continues as the residual stream (a pre-norm block)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(64)
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x, r):
        h = x + r
        return h + self.proj(self.norm(h))


@pytest.mark.slow
def test_compile_fuses_the_residual_add_into_the_norm(tmp_path: Path):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _PreNormBlock().to("tpu")
    x, r = (torch.randn(3, 10, 64, device="tpu", requires_grad=True) for _ in range(2))
    with kernels.use("interpret"), tpu_compile.dump(tmp_path):
        out = torch.compile(block, backend="tpu")(x, r)
        out.sum().backward()
    compiled = [out.detach().cpu(), x.grad.cpu(), r.grad.cpu()]
    forward = "".join(p.read_text() for p in tmp_path.glob("*forward*.fx.py"))
    assert "tpu_kernels.norm.default(primals_1, primals_2" in forward.replace("torch.ops.", ""), forward
    x.grad = r.grad = None
    with kernels.use("off"):
        eager = block(x, r)
        eager.sum().backward()
    torch._dynamo.reset()
    for a, b in zip(compiled, [eager.detach().cpu(), x.grad.cpu(), r.grad.cpu()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class _HalfHeadLoss(torch.nn.Module):
    """A bfloat16 LM head and the Hugging Face causal-LM loss's shapes of it: `logits.float()`,
    `.view(-1, vocab)`, `F.cross_entropy` (ignored labels included); `shift`: the older form,
    `logits.float()[..., :-1, :].contiguous()` against `labels[..., 1:]`."""

    def __init__(self, upcast_read_twice: bool = False, shift: bool = False):
        super().__init__()
        self.head = torch.nn.Linear(32, 300, dtype=torch.bfloat16)
        self.upcast_read_twice, self.shift = upcast_read_twice, shift

    def forward(self, x, labels):
        logits = self.head(x).float()
        if self.shift:
            scores, labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
        else:
            scores = logits
        loss = F.cross_entropy(scores.view(-1, 300), labels.view(-1), ignore_index=-100)
        return loss + logits.mean() if self.upcast_read_twice else loss


@pytest.mark.parametrize("mode,shift", [("interpret", False), ("interpret", True), ("off", False)])
def test_compile_hands_16bit_logits_to_the_cross_entropy_kernel_whole(mode, shift, tmp_path: Path):
    """`cross_entropy(logits.float())` of bfloat16 logits keeps no float32 copy of the
    logits for the backward (the kernel upcasts itself), with the loss and gradients of
    PyTorch's float32 loss on CPU; with the kernels off the call is the one it replaces."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _HalfHeadLoss(shift=shift)
    x = torch.randn(2, 24, 32, dtype=torch.bfloat16)
    labels = torch.randint(0, 300, (2, 24))
    labels[0, :5] = -100
    x_cpu = x.clone().requires_grad_()
    expected = model(x_cpu, labels)
    expected.backward()
    device_model = copy.deepcopy(model).to("tpu")
    x_tpu = x.to("tpu").requires_grad_()
    with kernels.use(mode), tpu_compile.dump(tmp_path):
        loss = torch.compile(device_model, backend="tpu")(x_tpu, labels.to("tpu"))
        loss.backward()
    torch._dynamo.reset()
    forward = "".join(p.read_text() for p in tmp_path.glob("*forward.fx.py"))
    assert loss.dtype == torch.float32
    # Off the kernel XLA folds the upcast into the head's matmul (the logits are not rounded
    # to bfloat16 first): 1.1e-5 relative on the loss, the same without the rewrite.
    tolerance = 1e-6 if mode == "interpret" else 3e-5
    torch.testing.assert_close(loss.cpu(), expected.detach(), rtol=tolerance, atol=0)
    for actual, reference in [(x_tpu.grad, x_cpu.grad), (device_model.head.weight.grad, model.head.weight.grad)]:
        assert actual.dtype == torch.bfloat16
        if mode == "interpret":  # rounded once to bfloat16, as the cast's backward rounds
            torch.testing.assert_close(actual.cpu(), reference, rtol=0, atol=0)
        else:
            error = ((actual.cpu().float() - reference.float()).abs().max() / reference.float().abs().max()).item()
            assert error <= 1e-2, f"relative error {error:.3g}"
    if mode == "interpret":
        assert "tpu_kernels.cross_entropy.default" in forward
        assert not re.search(r"f32\[[\d, ]*300\]", forward), "a float32 copy of the logits in the forward"
        assert kernels.stats().get("cross_entropy: kernel")


@pytest.mark.parametrize("read_twice", [False, True])
def test_the_upcast_rewrite_keeps_the_graph_cacheable_and_leaves_a_shared_upcast(read_twice):
    from torch._functorch._aot_autograd.autograd_cache import check_node_safe

    graphs = []

    def rewrite_only(gm, example_inputs):
        graphs.append((kernels.upcast_inside_cross_entropy(gm), gm))
        return gm

    torch._dynamo.reset()
    model = _HalfHeadLoss(upcast_read_twice=read_twice).to("tpu")
    x, labels = torch.randn(2, 24, 32, dtype=torch.bfloat16), torch.randint(0, 300, (2, 24))
    expected = model.cpu()(x, labels)
    loss = torch.compile(model.to("tpu"), backend=rewrite_only)(x.to("tpu"), labels.to("tpu"))
    torch._dynamo.reset()
    [(rewritten, gm)] = graphs
    assert rewritten == (0 if read_twice else 1)  # the float32 logits the mean reads stay
    for node in gm.graph.nodes:
        check_node_safe(node)  # AOTAutograd's cache takes the graph (raises otherwise)
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-6, atol=1e-6)
