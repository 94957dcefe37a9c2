"""KV-cache building blocks written so that they lower to plain LiteRT ops.

A cache is one tensor per layer and per role (keys, values) of shape
`(batch, kv_heads, cache_len, head_dim)`, passed to the exported model as an input and
returned, updated, as an output. Positions are int32 tensors of shape `(tokens,)`.

Writing new entries at data-dependent positions: torch's `index_copy`/`index_put` would
need SCATTER_ND plus a select in LiteRT. Instead:

- one token (decode): `where(arange(cache_len) == position, new, cache)`, i.e. EQUAL,
  SELECT_V2 (broadcasting the new entry along the cache axis);
- several tokens (prefill): a one-hot matrix `(cache_len, tokens)` times the new entries
  (BATCH_MATMUL) plus the old cache where no token lands (MUL, ADD). With 0/1 weights the
  result is exact for finite values.

Attention over the cache masks every slot after the query's own position (slots not
written yet), so stale values are never read. A padding token carries position -1: it
writes nothing and sees nothing.

Sliding-window layers keep a ring buffer of `window` slots instead (position p lives in
slot p % window). A chunk attends over the ring followed by its own new keys (the ring
holds the positions before the chunk, so early queries of a long chunk still see keys
that later tokens of the same chunk evict), then the last `window` positions of the
chunk are written into the ring.
"""

from __future__ import annotations

import torch

# How a single token is written: "select" (EQUAL + SELECT_V2) or "one_hot" (the prefill
# path, BATCH_MATMUL). benchmarks/generative_bench.py --decode-write compares them.
DECODE_WRITE = "select"

# Added to the scores of masked slots: large enough to vanish in softmax, finite so that
# no NaN appears (a row always has at least its own position unmasked).
MASKED_SCORE = -1e30


def write_cache(cache: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`cache` with `new[:, :, t]` written at slot `positions[t]` along dim 2.

    cache: (batch, heads, cache_len, head_dim); new: (batch, heads, tokens, head_dim);
    positions: int (tokens,), distinct, each in [0, cache_len) or -1 (padding: not written).
    """
    cache_len, tokens = cache.shape[2], new.shape[2]
    slots = torch.arange(cache_len, dtype=positions.dtype, device=cache.device)
    if tokens == 1 and DECODE_WRITE == "select":
        hit = (slots == positions).reshape(1, 1, cache_len, 1)
        return torch.where(hit, new, cache)
    one_hot = (slots[:, None] == positions[None, :]).to(cache.dtype)  # (cache_len, tokens)
    keep = 1.0 - one_hot.sum(dim=1).reshape(1, 1, cache_len, 1)
    return cache * keep + torch.matmul(one_hot, new)


def attention_bias(positions: torch.Tensor, cache_len: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask (tokens, cache_len): 0 where slot <= the token's position, else
    MASKED_SCORE. Causal within a chunk and blind to unwritten or padded slots."""
    slots = torch.arange(cache_len, dtype=positions.dtype, device=positions.device)
    visible = slots[None, :] <= positions[:, None]
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    return torch.where(visible, zero, torch.full((), MASKED_SCORE, dtype=dtype, device=positions.device))


def ring_slot_positions(first: torch.Tensor, window: int) -> torch.Tensor:
    """Position held by each ring slot (window,) when the next token is at `first` (a
    0-d int tensor): the latest p < first with p % window == slot; negative when empty."""
    slots = torch.arange(window, dtype=first.dtype, device=first.device)
    before = first - 1
    return before - torch.remainder(before - slots, window)


def write_ring(ring: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`ring` (batch, heads, window, dim) with the chunk's last `window` real tokens of
    `new` (batch, heads, tokens, dim) written at slot position % window."""
    window, tokens = ring.shape[2], new.shape[2]
    slots = torch.arange(window, dtype=positions.dtype, device=ring.device)
    target = torch.remainder(positions, window)
    if tokens == 1:
        hit = ((slots == target) & (positions >= 0)).reshape(1, 1, window, 1)
        return torch.where(hit, new, ring)
    kept = (positions >= 0) & (positions > positions.max() - window)  # later tokens evict earlier ones
    one_hot = ((slots[:, None] == target[None, :]) & kept[None, :]).to(ring.dtype)  # (window, tokens)
    keep = 1.0 - one_hot.sum(dim=1).reshape(1, 1, window, 1)
    return ring * keep + torch.matmul(one_hot, new)


def ring_attention_bias(positions: torch.Tensor, window: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask (tokens, window + tokens) over [ring slots, the chunk's own keys]:
    a key is visible when it is real, not after the query, and within its window."""
    keys = torch.cat([ring_slot_positions(positions[0], window), positions])
    q = positions[:, None]
    visible = (keys[None, :] >= 0) & (keys[None, :] <= q) & (keys[None, :] > q - window)
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    return torch.where(visible, zero, torch.full((), MASKED_SCORE, dtype=dtype, device=positions.device))


def windowed_attention_bias(
    positions: torch.Tensor, cache_len: int, window: int | None, dtype=torch.float32
) -> torch.Tensor:
    """`attention_bias` over a linear cache, also hiding keys `window` or more positions back."""
    if window is None:
        return attention_bias(positions, cache_len, dtype)
    slots = torch.arange(cache_len, dtype=positions.dtype, device=positions.device)
    q = positions[:, None]
    visible = (slots[None, :] <= q) & (slots[None, :] > q - window)
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    return torch.where(visible, zero, torch.full((), MASKED_SCORE, dtype=dtype, device=positions.device))
