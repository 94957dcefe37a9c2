"""Attention and the transformer building blocks around it: LiteRT vs PyTorch.

scaled_dot_product_attention (masks, causal, GQA), and the ops transformer models are
made of: einsum, masked_fill, triu/tril masks, rotary embeddings, RMSNorm, embedding
lookups at cumsum positions. (bmm, LayerNorm, embedding, cumsum and both GELUs on their
own are in test_linalg / test_norm / test_index / test_reduce / test_activations.)
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import litert_torch
from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)


def op_counts(edge) -> Counter:
    return Counter(op.opcode for op in edge.ir_model.graphs[0].ops)


class Attention(nn.Module):
    """F.scaled_dot_product_attention(q, k, v, [mask], **options)."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.options)


class RepeatedKV(nn.Module):
    """Grouped-query attention as `transformers` writes it: k/v heads repeated with
    expand + reshape (repeat_kv), then plain SDPA with a causal mask."""

    def forward(self, q, k, v):
        groups = q.shape[1] // k.shape[1]

        def repeat(t):
            b, kv_heads, s, e = t.shape
            return t[:, :, None].expand(b, kv_heads, groups, s, e).reshape(b, kv_heads * groups, s, e)

        return F.scaled_dot_product_attention(q, repeat(k), repeat(v), is_causal=True)


def qkv(heads=4, kv_heads=4, length=8, keys=10, features=16, value_features=12, batch=2):
    return (
        torch.randn(batch, heads, length, features),
        torch.randn(batch, kv_heads, keys, features),
        torch.randn(batch, kv_heads, keys, value_features),
    )


def bool_mask(batch=2, heads=1, length=8, keys=10, fully_masked_row=None):
    mask = torch.rand(batch, heads, length, keys) > 0.3
    mask[..., 0] = True
    if fully_masked_row is not None:
        mask[0, :, fully_masked_row] = False
    return mask


def float_mask():
    mask = torch.randn(2, 4, 8, 10)
    mask[1, 2, 5] = float("-inf")  # a fully masked row: PyTorch returns zeros there
    return mask


SDPA_CASES = {
    "plain": (Attention(), qkv()),
    "custom_scale": (Attention(scale=0.3), qkv()),
    "scale_on_scores": (Attention(), qkv(keys=4, features=32)),
    "causal": (Attention(is_causal=True), qkv(keys=8)),
    # PyTorch aligns is_causal top-left: query i sees keys 0..i whatever the lengths
    "causal_more_keys": (Attention(is_causal=True), qkv(length=4, keys=10)),
    "causal_more_queries": (Attention(is_causal=True), qkv(length=10, keys=4)),
    "bool_mask_input": (Attention(), (*qkv(), bool_mask(fully_masked_row=3))),
    "bool_mask_per_head": (Attention(), (*qkv(), bool_mask(heads=4))),
    "float_mask_input": (Attention(), (*qkv(), float_mask())),
    "gqa": (Attention(enable_gqa=True), qkv(kv_heads=2)),
    "mqa_causal": (Attention(enable_gqa=True, is_causal=True), qkv(kv_heads=1, keys=8)),
    "gqa_bool_mask": (Attention(enable_gqa=True), (*qkv(kv_heads=2), bool_mask(fully_masked_row=1))),
    "gqa_per_head_mask": (Attention(enable_gqa=True), (*qkv(kv_heads=2), bool_mask(heads=4))),
    "repeat_kv": (RepeatedKV(), qkv(kv_heads=2, keys=8)),
    "rank3": (Attention(), tuple(t[0] for t in qkv())),
}


@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_scaled_dot_product_attention_matches_pytorch(name):
    module, args = SDPA_CASES[name]
    assert_converts(module, args)


def test_attention_is_two_batch_matmuls_and_one_softmax():
    edge = assert_converts(Attention(), qkv())
    assert op_counts(edge) == Counter({"BATCH_MATMUL": 2, "SOFTMAX": 1, "MUL": 1})


class CachedCausal(nn.Module):
    """Causal attention of new queries over a cache: query i sits at position offset + i
    and sees keys 0..offset + i (the mask aligned bottom-right when offset = keys - length)."""

    def __init__(self, offset: int | None = None):
        super().__init__()
        self.offset = offset  # None: read it from the input, as a decoder reads its cache position

    def forward(self, q, k, v, offset=None):
        offset = self.offset if offset is None else offset
        positions = offset + torch.arange(q.shape[-2])
        visible = torch.arange(k.shape[-2])[None, :] <= positions[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)


@pytest.mark.parametrize(
    "length, keys, offset",
    [(4, 10, 6), (3, 10, 2), (1, 10, 9)],
    ids=["bottom_right", "inside_cache", "one_token_decode"],
)
def test_causal_attention_with_a_cache_offset_matches_pytorch(length, keys, offset):
    assert_converts(CachedCausal(offset), qkv(length=length, keys=keys))
    # the offset as an input: the mask is built at run time; another offset must also match
    args = (*qkv(length=length, keys=keys), torch.tensor(offset))
    assert_converts(
        CachedCausal(), args, check_inputs=[(*args[:3], torch.tensor(other)) for other in (0, keys - length)]
    )


def test_constant_causal_mask_needs_no_row_guard():
    counts = op_counts(assert_converts(Attention(is_causal=True), qkv(keys=8)))
    assert counts["ADD"] == 1 and counts["SOFTMAX"] == 1
    assert not {"SELECT_V2", "REDUCE_ANY", "EQUAL", "LOGICAL_NOT", "TRANSPOSE"} & set(counts)


def test_grouped_query_attention_never_repeats_heads():
    for module, args in (SDPA_CASES["gqa"], SDPA_CASES["repeat_kv"]):
        counts = op_counts(assert_converts(module, args))
        assert counts["BATCH_MATMUL"] == 2
        assert not {"BROADCAST_TO", "TILE", "GATHER", "TRANSPOSE"} & set(counts), counts


def test_attention_dropout_is_refused_with_the_users_line():
    module = Attention(dropout_p=0.1)
    with pytest.raises(litert_torch.UnsupportedOpsError) as caught:
        litert_torch.convert(module, qkv(), progress=False)
    message = str(caught.value)
    assert "scaled_dot_product_attention" in message and "dropout_p" in message
    assert "test_attention.py" in message  # the user's source line


# ---- the building blocks around attention ------------------------------------------------


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotate_interleaved(x):
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


class Rotary(nn.Module):
    """Rotary position embedding with sin/cos computed in the graph from positions."""

    def __init__(self, features=8, interleaved=False):
        super().__init__()
        self.interleaved = interleaved
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, features, 2).float() / features))

    def forward(self, x):  # (batch, heads, length, features)
        positions = torch.arange(x.shape[-2], dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]
        if self.interleaved:
            angles = angles.repeat_interleave(2, dim=-1)
            return x * angles.cos() + rotate_interleaved(x) * angles.sin()
        angles = torch.cat([angles, angles], dim=-1)
        return x * angles.cos() + rotate_half(x) * angles.sin()


class CausalScores(nn.Module):
    """Hand-written causal attention: triu mask, masked_fill, softmax, einsum."""

    def forward(self, q, k, v):
        length = q.shape[-2]
        future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        scores = torch.einsum("bhld,bhsd->bhls", q, k) / q.shape[-1] ** 0.5
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        return torch.einsum("bhls,bhsd->bhld", weights, v)


class PaddingPositions(nn.Module):
    """Position ids from a padding mask with cumsum (int64 arithmetic), then embeddings."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(50, 16)
        self.positions = nn.Embedding(20, 16)

    def forward(self, ids, mask):
        positions = (torch.cumsum(mask, dim=1) - 1).clamp(min=0) * mask
        return self.tokens(ids) + self.positions(positions)


BLOCK_CASES = {
    "einsum_heads": (
        Fn(lambda q, k: torch.einsum("bhld,bhsd->bhls", q, k)),
        (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8)),
    ),
    "masked_fill_from_input": (Fn(lambda x: x.masked_fill(x > 0.5, -1e9)), (torch.randn(2, 5),)),
    "triu_tril": (Fn(lambda x: torch.triu(x, 1) - torch.tril(x, -1)), (torch.randn(5, 5),)),
    "tril_of_input": (Fn(lambda x: torch.tril(x)), (torch.randn(2, 4, 6),)),
    "causal_scores": (CausalScores(), qkv(keys=8, value_features=16)),
    "rotary_half": (Rotary(), (torch.randn(1, 2, 6, 8),)),
    "rotary_interleaved": (Rotary(interleaved=True), (torch.randn(1, 2, 6, 8),)),
    "rms_norm": (nn.RMSNorm(16, eps=1e-6), (torch.randn(2, 5, 16),)),
    "padding_positions": (
        PaddingPositions(),
        (torch.randint(0, 50, (2, 7)), torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])),
    ),
}


@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_transformer_building_block_matches_pytorch(name):
    module, args = BLOCK_CASES[name]
    assert_converts(module, args)
