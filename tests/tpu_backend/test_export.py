"""`tpu_backend.export`: every example's training step (forward + backward, gradients for
every parameter) lowers for TPU with the Pallas kernels on, from this CPU machine, and a
Llama-style step with every kernel compiles for a v5e (libtpu's compiler, Mosaic's passes
included: lowering alone missed what the chip refused, #32); the exported program
serializes, and run on CPU it gives PyTorch's loss and gradients."""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn

import tpu_backend
from tests.helpers import compile_for_tpu
from tpu_backend import kernels

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)

import char_lm  # noqa: E402
import digits_cnn  # noqa: E402
import dlrm_clicks  # noqa: E402
import unet_segmentation  # noqa: E402


class TrainStep(nn.Module):
    """model + loss as one module returning the scalar loss (what export(train_step=True) takes)."""

    def __init__(self, model, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *batch):
        *inputs, target = batch
        return self.loss(self.model(*inputs), target)


def on_host():
    """Where a program exported for platforms=("cpu",) runs: JAX's CPU device (on a TPU
    machine the default device is the chip, which such a program refuses)."""
    return jax.default_device(jax.devices("cpu")[0])


def _example(name):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if name == "digits":
        return TrainStep(digits_cnn.DigitsResNet(), nn.functional.cross_entropy), (
            torch.rand(64, 1, 8, 8),
            torch.randint(0, 10, (64,)),
        )
    if name == "unet":
        return TrainStep(unet_segmentation.UNet(), nn.functional.cross_entropy), unet_segmentation.shapes_batch(16, gen)
    if name == "dlrm":
        dense, ids, clicks, _ = dlrm_clicks.ClickRule(0).sample(256, gen)
        return TrainStep(dlrm_clicks.DLRM(), nn.functional.binary_cross_entropy_with_logits), (dense, ids, clicks)
    model = char_lm.build_model(name, 65, 128)
    tokens = torch.randint(0, 65, (16, 65), generator=gen)
    return TrainStep(model, char_lm.NextTokenLoss()), (tokens[:, :-1], tokens[:, 1:])


def _check_gradients_layout(exported, step):
    params = list(step.parameters())
    assert exported.out_avals[0].shape == ()
    assert [tuple(a.shape) for a in exported.out_avals[1:]] == [tuple(p.shape) for p in params]


# cross-entropy on (N, C) logits: the classifiers and LMs (UNet's per-pixel loss and DLRM's
# BCE are not kernel calls; the examples' LMs have head dim 16, outside the flash kernel's)
KERNEL_CALLS = {"digits": 2, "unet": 0, "dlrm": 0, "tinyllama": 2, "llama": 2, "qwen3": 2}


@pytest.mark.parametrize("name", ["digits", "unet", "dlrm", "tinyllama", "llama", "qwen3"])
def test_example_training_step_lowers_for_tpu_with_kernels(name):
    step, batch = _example(name)
    kernels.reset_stats()
    with kernels.use("auto"):
        exported = tpu_backend.export(step, batch, platforms=("tpu",), train_step=True)
    assert exported.platforms == ("tpu",)
    _check_gradients_layout(exported, step)
    text = exported.mlir_module()
    # cross-entropy (classifiers, LMs), flash attention and RMSNorm (transformers): Pallas
    assert text.count("tpu_custom_call") == KERNEL_CALLS[name], kernels.stats()
    again = jax.export.deserialize(exported.serialize())
    assert again.mlir_module() == text


class TinyLlama(nn.Module):
    """A Llama-style decoder whose every hot spot is a kernel call: nn.RMSNorm, causal
    grouped-query SDPA with head dim 128, and F.cross_entropy over the vocabulary."""

    def __init__(self, vocab=512, dim=256, heads=2, kv_heads=1, layers=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "attention_norm": nn.RMSNorm(dim),
                    "qkv": nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False),
                    "out": nn.Linear(dim, dim, bias=False),
                    "ffn_norm": nn.RMSNorm(dim),
                    "gate_up": nn.Linear(dim, 4 * dim, bias=False),
                    "down": nn.Linear(2 * dim, dim, bias=False),
                }
            )
            for _ in range(layers)
        )
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def attention(self, block, x):
        batch, seq, _ = x.shape
        q, k, v = block["qkv"](x).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return block["out"](out.transpose(1, 2).reshape(batch, seq, -1))

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + self.attention(block, block["attention_norm"](x))
            gate, up = block["gate_up"](block["ffn_norm"](x)).chunk(2, dim=-1)
            x = x + block["down"](nn.functional.silu(gate) * up)
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_llama_style_training_step_with_kernels_compiles_for_v5e():
    """Forward and backward of a bf16 Llama-style step through the device, kernels "on"
    (in "auto", RMSNorm at these rows goes to XLA, measured faster on a v5e), exported for TPU (64-bit mode on and matmul precision "highest", as
    `import tpu_backend` sets) and compiled by the v5e's compiler: flash attention
    (forward, dQ, dK/dV), RMSNorm and cross-entropy kernels all pass Mosaic's passes."""
    torch.manual_seed(0)
    step = TinyLlama().to(torch.bfloat16)  # bf16 dots: the device's "highest" precision must not reach them
    tokens = torch.randint(0, 512, (2, 257))
    kernels.reset_stats()
    with kernels.use("on"):
        exported = tpu_backend.export(step, (tokens[:, :-1], tokens[:, 1:]), platforms=("tpu",), train_step=True)
    assert jax.config.jax_enable_x64
    routed = {"scaled_dot_product_attention: kernel", "rms_norm: kernel", "cross_entropy: kernel"}
    assert set(kernels.stats()) == routed, kernels.stats()  # every call took its kernel, none fell back
    text = exported.mlir_module()
    for kernel in ("flash_attention_forward", "flash_attention_dq", "flash_attention_dkv", "norm_forward"):
        assert kernel in text, kernel
    for kernel in ("norm_backward", "cross_entropy_forward", "cross_entropy_backward"):
        assert kernel in text, kernel
    compiled = compile_for_tpu(exported.call, *exported.in_avals, chip="v5e")
    assert compiled.as_text().count("tpu_custom_call") >= 7  # the kernels are in the compiled program


def test_exported_step_runs_on_cpu_with_pytorch_gradients():
    """The same export for CPU, run: loss and every gradient equal PyTorch's autograd."""
    step, batch = _example("tinyllama")
    batch = tuple(b[:2, :32] for b in batch)  # small: the program is compiled and run on CPU
    exported = tpu_backend.export(step, batch, platforms=("cpu",), train_step=True)
    arrays = [t.detach().numpy() for t in (*step.parameters(), *step.buffers(), *batch)]
    with on_host():
        loss, *grads = exported.call(*arrays)
    expected = step(*batch)
    expected.backward()
    assert np.allclose(float(loss), float(expected.detach()), rtol=1e-5)
    for g, p in zip(grads, step.parameters()):
        np.testing.assert_allclose(np.asarray(g), p.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_meta_parameters_and_forward_export():
    """Parameters on the meta device (nothing allocated); a forward export returns the outputs."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 10))
    x = torch.empty(8, 4096, device="meta")
    exported = tpu_backend.export(model, (x,), platforms=("tpu",))
    assert [tuple(a.shape) for a in exported.out_avals] == [(8, 10)]
    assert [tuple(a.shape) for a in exported.in_avals] == [(4096, 4096), (4096,), (10, 4096), (10,), (8, 4096)]


def test_train_step_needs_a_scalar_loss():
    with pytest.raises(ValueError, match="must return a scalar loss, got a tensor of shape \\(2, 3\\)"):
        tpu_backend.export(nn.Linear(4, 3), (torch.zeros(2, 4),), train_step=True)


def _llm_config(name):
    import transformers

    if name == "llama-3-1b":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            torch_dtype=torch.bfloat16,
        )
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype=torch.bfloat16,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-3-1b", "qwen3-0.6b"])
def test_billion_parameter_configs_lower_at_4096(name):
    """Llama-3-1B / Qwen3-0.6B shapes, bf16, sequence 4096: built on meta, never allocated."""
    cls, config = _llm_config(name)
    with torch.device("meta"):
        model = cls(config).to(torch.bfloat16)
    tokens = torch.empty(1, 4096, dtype=torch.long, device="meta")
    step = TrainStep(model, char_lm.NextTokenLoss())
    kernels.reset_stats()
    with kernels.use("auto"):
        exported = tpu_backend.export(step, (tokens, tokens), platforms=("tpu",), train_step=True)
    _check_gradients_layout(exported, step)
    assert kernels.stats()["scaled_dot_product_attention: kernel"] >= config.num_hidden_layers, kernels.stats()
    text = exported.mlir_module()
    # one Mosaic kernel per distinct pallas_call (the layers call the same jitted kernels)
    for kernel in ("flash_attention_forward", "flash_attention_dq", "flash_attention_dkv", "cross_entropy_forward"):
        assert kernel in text, kernel


def test_compiled_programs_lower_for_another_platform():
    """Programs of the compile cache (here a torch.compile graph built on CPU) export for TPU."""
    import tpu_backend.compile as tpu_compile

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
    before = {id(p) for p in tpu_compile.programs()}  # other tests' programs may still be alive
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(8, 16, device="tpu")
    compiled(x)
    mine = [p for p in tpu_compile.programs() if id(p) not in before]
    assert mine, [p.name for p in tpu_compile.programs()]
    exported = [e for program in mine for e in program.export(platforms=("tpu",))]
    assert all(e.platforms == ("tpu",) for e in exported)
    # the forward program: the logits first, then the activations saved for backward
    forward = [e for e in exported if tuple(e.out_avals[0].shape) == (8, 4)]
    assert forward, [tuple(e.out_avals[0].shape) for e in exported]
    assert "stablehlo.dot_general" in forward[0].mlir_module()


def test_fused_eager_programs_lower_for_another_platform():
    """A fused-eager step's program (recorded ops, one jit at the sync point) exports for TPU."""
    import tpu_backend.compile as tpu_compile

    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 4)).to("tpu")
    before = {id(p) for p in tpu_compile.programs()}
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("fused")
    try:
        loss = model(torch.randn(6, 16, device="tpu")).square().mean()
        loss.backward()
        loss.item()  # the sync point: the recorded forward and backward become one program
    finally:
        tpu_backend.set_eager_mode(previous)
    fused = [p for p in tpu_compile.programs() if p.name == "fused" and id(p) not in before]
    assert fused, [p.name for p in tpu_compile.programs()]
    exported = [e for program in fused for e in program.export(platforms=("tpu",))]
    assert all(e.platforms == ("tpu",) for e in exported)
    assert any("stablehlo.dot_general" in e.mlir_module() for e in exported)


def _count_fused_norms(monkeypatch):
    fused = []
    original = kernels.fuse_residual_norms
    monkeypatch.setattr(kernels, "fuse_residual_norms", lambda gm: fused.append(original(gm)) or fused[-1])
    return fused


def _pre_norm_lm(seq):
    torch.manual_seed(0)
    tokens = torch.randint(0, 512, (2, seq + 1), generator=torch.Generator().manual_seed(1))
    return TinyLlama(), tokens[:, :-1], tokens[:, 1:]


@pytest.mark.parametrize("mode", ["interpret", "on"])
def test_pre_norm_lm_step_with_fused_residual_norms_gives_pytorch_gradients(mode, monkeypatch):
    """The residual-norm fusion replaces the forward's saved adds; the exported step still
    pairs them with the backward's inputs ("'add' is not in list" before): loss and every
    gradient as PyTorch's autograd (CPU, the kernels through the Pallas interpreter)."""
    model, ids, targets = _pre_norm_lm(64)
    fused = _count_fused_norms(monkeypatch)
    with kernels.use(mode):
        exported = tpu_backend.export(model, (ids, targets), platforms=("cpu",), train_step=True)
    assert fused[0] == 4, fused  # forward: each block's two adds feed the next norm
    with on_host():
        loss, *grads = exported.call(*[t.detach().numpy() for t in (*model.parameters(), ids, targets)])
    expected = model(ids, targets)
    expected.backward()
    np.testing.assert_allclose(float(loss), float(expected.detach()), rtol=1e-5)
    for (name, p), g in zip(model.named_parameters(), grads):
        np.testing.assert_allclose(np.asarray(g), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", ["on", "interpret"])
def test_pre_norm_lm_step_lowers_for_tpu_at_1024(mode, monkeypatch):
    """Sequence 1024, TPU only: the compiled kernels (on) or the interpreter's plain HLO."""
    model, ids, targets = _pre_norm_lm(1024)
    fused = _count_fused_norms(monkeypatch)
    with kernels.use(mode):
        exported = tpu_backend.export(model, (ids, targets), platforms=("tpu",), train_step=True)
    assert fused[0] == 4, fused
    _check_gradients_layout(exported, model)
    assert ("tpu_custom_call" in exported.mlir_module()) == (mode == "on")


def test_a_cpu_export_on_a_tpu_machine_lowers_no_mosaic_call(monkeypatch):
    """On a TPU machine (JAX's backend "tpu", here pretended) with the kernels on, an export for
    platforms=("cpu",) lowers the kernels as on a CPU: a Mosaic call has no CPU lowering."""
    from kernels import _common

    model, ids, targets = _pre_norm_lm(64)
    monkeypatch.setattr(_common.jax, "default_backend", lambda: "tpu")
    with kernels.use("on"):
        assert kernels.implementation() == "pallas"  # what the device runs on the chip
        exported = tpu_backend.export(model, (ids, targets), platforms=("cpu",), train_step=True)
    assert exported.platforms == ("cpu",) and "tpu_custom_call" not in exported.mlir_module()
