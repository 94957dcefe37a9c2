"""Small training models shared by the device's parity tests and `benchmarks/device/backend_bench.py`.

Three models cover the op mix of ordinary training: an MLP (linear, ReLU), a small CNN
(convolution, batch norm, max pooling, adaptive average pooling; no dropout so runs are
deterministic) and a GPT-style transformer (token and position embeddings,
`nn.MultiheadAttention` with a causal mask, layer norm, GELU, cross-entropy). The same
`TinyGPT` class at minGPT size (6 layers, 384 wide, 6 heads, context 128, vocabulary 512)
is the benchmark's larger model.

Each `ModelCase` knows how to build its model, draw a batch from a `torch.Generator` (on
CPU: callers move it) and compute the loss, so a training loop is the same for all:

    case = MODEL_CASES["transformer"]
    model = case.build()
    inputs, target = case.batch(torch.Generator().manual_seed(0))
    loss = case.loss(model(inputs), target)

Depends on torch only (`functional_train_step` takes its optimizer update from `tpu_backend.aot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """Three linear layers with ReLU: the smallest model that trains."""

    def __init__(self, in_features: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class SmallCNN(nn.Module):
    """Two conv-batchnorm-ReLU stages with max pooling, global average pooling, a classifier."""

    def __init__(self, channels: int = 3, width: int = 8, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 64
    context: int = 16
    width: int = 32
    heads: int = 4
    layers: int = 2


MINGPT = GPTConfig(vocab=512, context=128, width=384, heads=6, layers=6)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a GELU MLP, both residual."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attention = nn.MultiheadAttention(config.width, config.heads, batch_first=True)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width), nn.GELU(), nn.Linear(4 * config.width, config.width)
        )

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal_mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """A GPT-style language model; `GPTConfig()` is test size, `MINGPT` the benchmark's."""

    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)
        # True above the diagonal = "may not attend" (nn.MultiheadAttention's bool mask).
        mask = torch.ones(config.context, config.context, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder: RMSNorm, rotary positions, SwiGLU MLP, causal SDPA, untied head
    (the shapes of `../shared/tpu-vm/jax_llama_reference.py`'s rows). `checkpoint`:
    "full" recomputes each block in the backward (activation checkpointing around the call);
    "matmuls" keeps the block's matrix products and recomputes the rest (selective,
    `tpu_backend.compile.save_matmuls`, inside the block so that `scan_layers` keeps it);
    "none" keeps everything."""

    vocab: int = 64
    context: int = 16
    width: int = 32
    heads: int = 4
    layers: int = 2
    ffn: int = 64
    checkpoint: str = "none"
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.checkpoint not in CHECKPOINTING:
            raise ValueError(f"LlamaConfig.checkpoint={self.checkpoint!r}: expected one of {', '.join(CHECKPOINTING)}")


CHECKPOINTING = ("none", "full", "matmuls")


# The JAX reference's 374M shape (d 1024, 24 layers, FFN 2816) and 0.95B shape (d 2048, 16 layers).
LLAMA_374M = LlamaConfig(vocab=32000, context=2048, width=1024, heads=8, layers=24, ffn=2816, dtype=torch.bfloat16)
LLAMA_950M = LlamaConfig(vocab=32000, context=2048, width=2048, heads=16, layers=16, ffn=5632, dtype=torch.bfloat16)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the rotate-half form) of (B, H, S, D) `x`."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        width, self.heads = config.width, config.heads
        self.attention_norm = nn.RMSNorm(width, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.mlp_norm = nn.RMSNorm(width, eps=1e-6)
        self.gate = nn.Linear(width, config.ffn, bias=False)
        self.up = nn.Linear(width, config.ffn, bias=False)
        self.down = nn.Linear(config.ffn, width, bias=False)
        self.save_matmuls = None
        if config.checkpoint == "matmuls":
            from tpu_backend.compile.remat import save_matmuls

            self.save_matmuls = save_matmuls

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.save_matmuls is not None:
            checkpoint = torch.utils.checkpoint.checkpoint
            return checkpoint(self.compute, x, cos, sin, use_reentrant=False, context_fn=self.save_matmuls)
        return self.compute(x, cos, sin)

    def compute(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.attention_norm(x)
        split = lambda t: t.view(batch, length, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        attended = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, width))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaLM(nn.Module):
    def __init__(self, config: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.width, eps=1e-6)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        head_dim = config.width // config.heads
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(config.context, dtype=torch.float32), inverse).repeat(1, 2)
        self.register_buffer("cos", angles.cos().to(config.dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(config.dtype), persistent=False)
        self.to(config.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        cos, sin = self.cos[:length], self.sin[:length]
        x = self.tokens(tokens)
        for block in self.blocks:
            if self.config.checkpoint == "full":
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.head(self.norm(x))


def sequence_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position (in float32 for half-precision logits)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


@dataclass(frozen=True)
class ModelCase:
    """A model, its batches and its loss. `batch` draws on CPU from the given generator."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def training_batches(case: ModelCase, steps: int, distinct: int = 4) -> list:
    """`steps` batches cycling through `distinct` fixed ones drawn from seed 1: with
    random labels a model can only learn by memorising, so the loss must fall."""
    generator = torch.Generator().manual_seed(1)
    pool = [case.batch(generator) for _ in range(distinct)]
    return [pool[step % distinct] for step in range(steps)]


def _class_batch(shape: tuple[int, ...], classes: int = 10):
    def draw(generator: torch.Generator):
        inputs = torch.randn(shape, generator=generator)
        target = torch.randint(0, classes, (shape[0],), generator=generator)
        return inputs, target

    return draw


def _token_batch(config: GPTConfig, batch_size: int):
    def draw(generator: torch.Generator):
        tokens = torch.randint(0, config.vocab, (batch_size, config.context + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    draw.batch_size = batch_size
    return draw


MODEL_CASES: dict[str, ModelCase] = {
    "mlp": ModelCase("mlp", MLP, _class_batch((16, 32)), F.cross_entropy),
    "cnn": ModelCase("cnn", SmallCNN, _class_batch((8, 3, 16, 16)), F.cross_entropy),
    "transformer": ModelCase("transformer", TinyGPT, _token_batch(GPTConfig(), 4), sequence_loss),
    "mingpt": ModelCase("mingpt", lambda: TinyGPT(MINGPT), _token_batch(MINGPT, 8), sequence_loss),
    "llama": ModelCase("llama", LlamaLM, _token_batch(LlamaConfig(), 4), sequence_loss),
    "llama-374m": ModelCase("llama-374m", lambda: LlamaLM(LLAMA_374M), _token_batch(LLAMA_374M, 4), sequence_loss),
    "llama-950m": ModelCase("llama-950m", lambda: LlamaLM(LLAMA_950M), _token_batch(LLAMA_950M, 4), sequence_loss),
}


def make_optimizer(name: str, parameters, fused: bool = False, foreach: bool | None = None) -> torch.optim.Optimizer:
    """ "sgd" (momentum 0.9) or "adamw", with learning rates that move these models visibly
    in 20 steps. PyTorch's default implementation choice (foreach or not) is kept, unless
    `fused`: the one-op-per-step implementation (`_fused_sgd_`, `_fused_adamw_`), or `foreach`."""
    options = dict(fused=True) if fused else {} if foreach is None else dict(foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, **options)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01, **options)
    raise ValueError(f"unknown optimizer {name!r}: use 'sgd' or 'adamw'")


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, case: ModelCase, inputs, target) -> torch.Tensor:
    """One forward, backward and optimizer step; returns the loss (not synchronised)."""
    optimizer.zero_grad(set_to_none=True)
    loss = case.loss(model(inputs), target)
    loss.backward()
    optimizer.step()
    return loss.detach()


def functional_train_step(model: nn.Module, case: ModelCase, optimizer: str) -> Callable:
    """`train_step` with `make_optimizer(optimizer)`'s update, in the form that
    `torch.compile(step, backend="tpu")` compiles into ONE program per step (docs/design/device.md,
    "One program per training step"): gradients by `torch.func.grad_and_value` of a
    `functional_call`, and PyTorch's own foreach optimizer update (`torch.optim.sgd.sgd`,
    `torch.optim.adamw.adamw` with `capturable=True`: step counts stay tensors) writing the
    parameters and optimizer state in place. Returns `step(inputs, target) -> loss`, not
    yet compiled; the state starts as `torch.optim` starts it."""
    from torch.func import functional_call, grad_and_value

    from tpu_backend.aot.capture import functional_update  # the same update the planner traces

    params = dict(model.named_parameters())
    tensors = list(params.values())
    zeros = lambda: [torch.zeros_like(p) for p in tensors]  # noqa: E731
    momenta, exp_avgs, exp_avg_sqs = zeros(), zeros(), zeros()
    step_counts = [torch.zeros((), device=p.device) for p in tensors]
    if optimizer not in ("sgd", "adamw"):
        raise ValueError(f"unknown optimizer {optimizer!r}: use 'sgd' or 'adamw'")

    def loss_of(params, inputs, target):
        return case.loss(functional_call(model, params, (inputs,)), target)

    # momentum buffers start at zero: 0.9 * 0 + g is torch's clone(g)
    lr = torch.tensor(0.05 if optimizer == "sgd" else 1e-3, device=tensors[0].device)
    state = (momenta if optimizer == "sgd" else exp_avgs + exp_avg_sqs + step_counts) + [lr]
    update = functional_update(optimizer, len(tensors))

    def step(inputs, target):
        grads, loss = grad_and_value(loss_of)(params, inputs, target)
        update(*tensors, *grads.values(), *state)
        return loss.detach()

    step.state = {"momentum_buffer": momenta, "exp_avg": exp_avgs, "exp_avg_sq": exp_avg_sqs}
    return step


class TinyLM(nn.Module):
    """Embedding, one self-attention, layer norm, a vocabulary head: a sequence model whose
    Linear layers flatten `[batch, seq, width]` to `[batch*seq, width]` (padding of seq
    then sits between the batch's rows)."""

    def __init__(self, vocab: int = 20, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(1, 2) / 4, dim=-1)
        return self.head(self.norm(h + attention @ v))


def token_batches(lengths, batch: int = 2, vocab: int = 20):
    generator = torch.Generator().manual_seed(2)
    return [
        (
            torch.randint(0, vocab, (batch, n), generator=generator),
            torch.randint(0, vocab, (batch, n), generator=generator),
        )
        for n in lengths
    ]
