"""Grouped-query attention written for LiteRT: no key/value head repetition.

The usual GQA code repeats each key/value head `group` times (`repeat_interleave` or
expand + reshape), which lowers to BROADCAST_TO of the whole cache: measured at about
1 ms per call for a (1, 4, 256, 32) cache in LiteRT's reference kernel, per layer and per
role, the largest cost of a decode step. Here the query heads of a group get an axis of
their own instead, in front: (B, H, T, D) -> (G, B, H_kv, T, D) (a small TRANSPOSE of q),
and each BATCH_MATMUL broadcasts the keys/values (B, H_kv, S, D) over it as they are (no
copy of the cache); the (T, S) mask is broadcast by the ADD. Keeping the token axis apart
(not folded into G*T) lets a prefill that keeps only its last position compute the last
layer's attention for that row alone. Query head h uses kv head h // G, as with
`repeat_interleave`. The scale multiplies q or the scores, whichever is smaller.

`transformers_lm` calls it from transformers' attention-function interface.
"""

from __future__ import annotations

import torch


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float, softcap: float | None = None
) -> torch.Tensor:
    """q (B, H, T, D); k, v (B, H_kv, S, D); bias (T, S) additive -> (B, H, T, Dv).
    `softcap`: scores become softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
    batch, heads, tokens, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    q = q.reshape(batch, kv_heads, heads // kv_heads, tokens, dim).permute(2, 0, 1, 3, 4)
    scale_q = dim < keys and not softcap
    scores = torch.matmul(q * scale if scale_q else q, k.transpose(2, 3))
    if not scale_q:
        scores = scores * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    weights = torch.softmax(scores + bias, dim=-1)
    out = torch.matmul(weights, v)  # (G, B, H_kv, T, Dv)
    return out.permute(1, 2, 0, 3, 4).reshape(batch, heads, tokens, v.shape[-1])
