"""A small Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU) defined in plain PyTorch: trainable on any device, exportable with a KV cache.

    model = TinyLlama(TinyLlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2))
    logits = model(tokens)                                   # training: (batch, seq, vocab)
    logits, cache = model(tokens, positions, cache)          # inference with a KV cache

The cache is a list with one `(keys, values)` pair per layer, each of shape
`(batch, n_kv_heads, cache_len, head_dim)`; `model.empty_cache(cache_len)` makes one.
Rotary tables are non-persistent buffers sized `max_seq_len`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from litert_torch.generative.attention import grouped_attention
from litert_torch.generative.kv_cache import attention_bias, write_cache


@dataclass
class TinyLlamaConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden_dim: int = 128  # SwiGLU inner width
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim ({self.dim // self.n_heads}) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, bias, cache=None, positions=None):
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        new_cache = None
        if cache is not None:
            k = write_cache(cache[0], k, positions)
            v = write_cache(cache[1], v, positions)
            new_cache = (k, v)
        # Grouped-query attention: each kv head serves n_heads // n_kv_heads query heads.
        out = grouped_attention(q, k, v, bias, self.head_dim**-0.5)
        out = out.transpose(1, 2).reshape(batch, tokens, self.n_heads * self.head_dim)
        return self.o_proj(out), new_cache


class FeedForward(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x, cos, sin, bias, cache=None, positions=None):
        h, new_cache = self.attn(self.attn_norm(x), cos, sin, bias, cache, positions)
        x = x + h
        return x + self.ffn(self.ffn_norm(x)), new_cache


def rope_tables(cfg: TinyLlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (max_seq_len, head_dim), in the rotate-half layout."""
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class TinyLlama(nn.Module):
    """Decoder-only LM: token embedding, `n_layers` pre-norm blocks, final norm, LM head."""

    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def empty_cache(self, cache_len: int, batch: int = 1, device=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.config
        shape = (batch, cfg.n_kv_heads, cache_len, cfg.head_dim)
        device = device if device is not None else self.embed.weight.device
        return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in range(cfg.n_layers)]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None, last_only: bool = False):
        """tokens: (batch, seq) ids. Without `cache`: causal self-attention over `tokens`,
        returns logits (batch, seq, vocab). With `cache` (see `empty_cache`) and
        `positions` (seq,; -1 marks padding): writes this chunk's keys/values at
        `positions`, attends over the cache, returns (logits, new_cache). `last_only`:
        logits of the last position only (batch, 1, vocab)."""
        if positions is None:
            if cache is not None:
                raise ValueError("pass positions= (the cache slots of these tokens) together with cache=")
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        rows = positions.clamp(min=0)  # padding (-1) takes any row: it writes nothing
        cos = self.rope_cos.index_select(0, rows)
        sin = self.rope_sin.index_select(0, rows)
        keys_len = tokens.shape[1] if cache is None else cache[0][0].shape[2]
        bias = attention_bias(positions, keys_len)
        x = self.embed(tokens)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, bias, None if cache is None else cache[i], positions)
            new_cache.append(layer_cache)
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(self.norm(x))
        return logits if cache is None else (logits, new_cache)
