"""Grouped-query attention written for LiteRT: no key/value head repetition.

The usual GQA code repeats each key/value head `group` times (`repeat_interleave` or
expand + reshape), which lowers to BROADCAST_TO of the whole cache: measured at about
1 ms per call for a (1, 4, 256, 32) cache in LiteRT's reference kernel, per layer and per
role, the largest cost of a decode step. Folding the query heads of a group into the
token axis instead needs only RESHAPEs: queries (B, H, T, D) -> (B, H_kv, G*T, D), one
BATCH_MATMUL against the un-repeated keys, the additive mask tiled G times (small),
softmax, one BATCH_MATMUL with the values, and back to (B, H, T, D). Query head h uses
kv head h // G, as with `repeat_interleave`.

`hf_attention` is the same function under transformers' attention-function signature;
`litert_attention(model)` selects it on a transformers model for the time of an export.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

HF_NAME = "litert_grouped"


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """q (B, H, T, D); k, v (B, H_kv, S, D); bias (T, S) additive -> (B, H, T, D)."""
    batch, heads, tokens, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.reshape(batch, kv_heads, group * tokens, dim)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if group > 1:
        bias = bias.repeat(group, 1)
    weights = torch.softmax(scores + bias, dim=-1)
    return torch.matmul(weights, v).reshape(batch, heads, tokens, dim)


def hf_attention(module: nn.Module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                 **kwargs):
    """transformers' attention-function signature; returns ((B, T, H, D), None).
    `attention_mask` is the additive (1, 1, T, S) mask made by CachedHFCausalLM."""
    bias = attention_mask.reshape(attention_mask.shape[-2], attention_mask.shape[-1])
    return grouped_attention(query, key, value, bias, scaling).transpose(1, 2), None


@contextlib.contextmanager
def litert_attention(model: nn.Module):
    """Run a transformers model with `hf_attention`; its own setting is restored after."""
    from transformers import AttentionInterface

    AttentionInterface.register(HF_NAME, hf_attention)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = HF_NAME
    try:
        yield
    finally:
        config._attn_implementation = before
