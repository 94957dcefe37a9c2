"""Tiny random-weight sentence embedders from transformers configs (BERT, ModernBERT,
EmbeddingGemma 1 and 2), with what a user computes from them with transformers: each
sentence alone, pooled, L2-normalised. Shared by the embedder tests and
`benchmarks.generative.embedder_vlm_families`."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

VOCAB = 96
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
)


def _build(config_name: str, model_name: str, **kwargs) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).eval()


def bert():
    return _build("BertConfig", "BertModel", **SMALL)


def modernbert():  # local attention (window 8) on every other layer
    return _build(
        "ModernBertConfig",
        "ModernBertModel",
        **SMALL,
        global_attn_every_n_layers=2,
        local_attention=8,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )


def embedding_gemma():
    """EmbeddingGemma's layout: Gemma 3 text with bidirectional attention (a sliding and a
    global layer, GQA), mean pooling, then two dense projections."""
    return _build(
        "Gemma3TextConfig",
        "Gemma3TextModel",
        **SMALL,
        num_key_value_heads=2,
        head_dim=16,
        use_bidirectional_attention=True,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )


def embedding_gemma2():
    """EmbeddingGemma 2's text tower: bidirectional Gemma with per-layer inputs and an output projection."""
    return _build(
        "EmbeddingGemma2TextConfig",
        "EmbeddingGemma2TextModel",
        **SMALL,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        hidden_size_per_layer_input=16,
        embedding_dim=32,
        layer_types=["sliding_attention", "full_attention"],
    )


def gemma_head():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 48, bias=False))


def reference(model, sequences, pooling="mean", head=None) -> np.ndarray:
    """What a user computes with transformers: each sentence alone, pooled, normalised."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            kwargs = {"use_cache": False} if "Gemma3" in type(model).__name__ else {}
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).last_hidden_state[0]
            pooled = hidden.mean(0) if pooling == "mean" else hidden[0]
            if head is not None:
                pooled = head(pooled)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.stack(out)


def sentences(lengths, seed=0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]


# batches: one token; two rows padded; three rows beyond the local/sliding window (8)
BATCHES = [[1], [3, 9], [17, 4, 30]]

CASES = {
    "bert mean": (bert, "mean", None),
    "modernbert cls": (modernbert, "cls", None),
    "embedding-gemma mean + dense": (embedding_gemma, "mean", gemma_head),
    "embedding-gemma2 mean": (embedding_gemma2, "mean", None),
}
