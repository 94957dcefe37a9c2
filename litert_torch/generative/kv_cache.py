"""KV-cache building blocks written so that they lower to plain LiteRT ops.

A cache is one tensor per layer and per role (keys, values) of shape
`(batch, kv_heads, cache_len, head_dim)`, passed to the exported model as an input and
returned, updated, as an output. Positions are int32 tensors of shape `(tokens,)`.

The position contract (what on-device LLM runtimes feed): a chunk's positions are
consecutive from `positions[0]` >= 0; padding comes only at the end and carries -1
(`check_positions` says what is wrong otherwise). A linear cache is written as one block:
DYNAMIC_UPDATE_SLICE of the chunk's keys/values at slot `positions[0]` (a builtin copy; a
scatter at arbitrary positions would cost a one-hot BATCH_MATMUL over the whole cache).
The chunk must fit: `positions[0] + tokens <= cache_len` (LiteRT would clamp the offset
and shift the block). Padding tokens' entries land in the slots after the prompt, which
no query sees (the mask hides every slot after a query's own position) and which the
next decode step or chunk overwrites before attending; a padding token sees nothing.
Decode writes its one token the same way (measured 3-6% faster per decode step than
`where(arange(cache_len) == position, new, cache)`, EQUAL + SELECT_V2, which
`DECODE_WRITE = "select"` keeps for comparison).

Sliding-window layers keep a ring buffer of `window` slots instead (position p lives in
slot p % window): a one-hot write (BATCH_MATMUL) of the chunk's last `window` real
tokens, which wraps around the ring, and skips padding (-1). A chunk attends over the
ring followed by its own new keys (the ring holds the positions before the chunk, so
early queries of a long chunk still see keys that later tokens of the same chunk evict).
"""

from __future__ import annotations

import torch

from converter.lowering.litert_ops import dynamic_update_slice

# How a single token is written into a linear cache: "update_slice" (DYNAMIC_UPDATE_SLICE,
# as prefill) or "select" (EQUAL + SELECT_V2). Read at export time;
# benchmarks/generative/generative_bench.py --decode-write both compares them.
DECODE_WRITE = "update_slice"

# Added to the scores of masked slots: large enough to vanish in softmax, finite so that
# no NaN appears (a row always has at least its own position unmasked).
MASKED_SCORE = -1e30


def check_positions(positions, cache_len: int | None, name: str = "input_pos") -> None:
    """Raise ValueError naming `name` unless `positions` (a sequence of ints) follows the
    contract: consecutive from positions[0] >= 0, then only -1 (padding), and the chunk
    fits a linear cache of `cache_len` slots (None: ring buffers only, no bound)."""
    positions = [int(p) for p in positions]
    real = next((i for i, p in enumerate(positions) if p < 0), len(positions))
    first = positions[0]
    if first < 0:
        raise ValueError(f"{name} must start with a real position (>= 0), got {positions}: a chunk of padding only")
    if positions[:real] != list(range(first, first + real)) or any(p != -1 for p in positions[real:]):
        raise ValueError(
            f"{name} must be consecutive from {name}[0] with padding (-1) only at the end, got {positions}"
        )
    if cache_len is not None and first + len(positions) > cache_len:
        raise ValueError(
            f"{name}: a chunk of {len(positions)} tokens from position {first} runs past the cache "
            f"({cache_len} slots); start it at most at {cache_len - len(positions)}"
        )


def write_cache(cache: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`cache` with `new[:, :, t]` written at slot `positions[0] + t` along dim 2.

    cache: (batch, heads, cache_len, head_dim); new: (batch, heads, tokens, head_dim);
    positions: int (tokens,) following the contract above (checked when run eagerly)."""
    cache_len, tokens = cache.shape[2], new.shape[2]
    if not torch.compiler.is_compiling():
        check_positions(positions.tolist(), cache_len)
    if tokens == 1 and DECODE_WRITE == "select":
        slots = torch.arange(cache_len, dtype=positions.dtype, device=cache.device)
        hit = (slots == positions).reshape(1, 1, cache_len, 1)
        return torch.where(hit, new, cache)
    zero = torch.zeros(1, dtype=torch.int32, device=positions.device)
    start = torch.cat([zero, zero, positions[:1].to(torch.int32), zero])
    return dynamic_update_slice(cache, new, start)


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
