"""Export a decoder-only LM with an explicit KV cache as two LiteRT signatures.

    edge = export_generative(model, prefill_len=32, cache_len=128)
    tokens = generate(edge, prompt_ids, max_new_tokens=20)     # runs in LiteRT

Both signatures take and return the whole cache, one tensor per layer and role:

    prefill(tokens int32[1, prefill_len], input_pos int32[prefill_len], kv_cache_0..2L-1)
    decode (tokens int32[1, 1],           input_pos int32[1],           kv_cache_0..2L-1)
      -> (logits float32[1, tokens, vocab], kv_cache_0..2L-1 updated, same names)

`kv_cache_{2i}` holds layer i's keys, `kv_cache_{2i+1}` its values, each
`float32[1, kv_heads, cache_len, head_dim]`. The two signatures share one copy of the
weights. Models: `TinyLlama` (this package) and transformers' decoder-only causal LMs
whose layers follow the Llama layout (`LlamaForCausalLM`, `Qwen3ForCausalLM`, ...).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from litert_torch.edge_model import EdgeModel
from litert_torch.generative.attention import litert_attention
from litert_torch.generative.kv_cache import attention_bias, write_cache
from litert_torch.generative.llama import TinyLlama
from litert_torch.signatures import signature


class CachedLM(nn.Module):
    """A decoder-only LM as `forward(tokens, input_pos, kv_cache) -> (logits, *new_cache)`
    with `kv_cache` a flat list [keys_0, values_0, keys_1, ...]."""

    def __init__(self, cache_len: int):
        super().__init__()
        if cache_len < 1:
            raise ValueError(f"cache_len must be positive, got {cache_len}")
        self.cache_len = cache_len

    def cache_shape(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def num_layers(self) -> int:
        raise NotImplementedError

    def empty_cache(self) -> list[torch.Tensor]:
        return [torch.zeros(self.cache_shape()) for _ in range(2 * self.num_layers())]


class CachedTinyLlama(CachedLM):
    """`TinyLlama` with its cache flattened into a list of tensors."""

    def __init__(self, model: TinyLlama, cache_len: int):
        super().__init__(cache_len)
        if cache_len > model.config.max_seq_len:
            raise ValueError(f"cache_len ({cache_len}) exceeds the model's max_seq_len "
                             f"({model.config.max_seq_len}): its rotary tables stop there")
        self.model = model

    def cache_shape(self):
        cfg = self.model.config
        return (1, cfg.n_kv_heads, self.cache_len, cfg.head_dim)

    def num_layers(self):
        return self.model.config.n_layers

    def forward(self, tokens, input_pos, kv_cache):
        pairs = [(kv_cache[2 * i], kv_cache[2 * i + 1]) for i in range(self.num_layers())]
        logits, new_cache = self.model(tokens, input_pos, pairs)
        return (logits, *[t for pair in new_cache for t in pair])


class _ExplicitCache:
    """What a transformers attention layer sees as its cache: `update` writes the new
    keys/values at `positions` and returns the layer's whole updated cache."""

    def __init__(self, tensors: list[torch.Tensor], positions: torch.Tensor):
        self.tensors = list(tensors)
        self.positions = positions

    def update(self, keys, values, layer_idx, *args, **kwargs):
        k = write_cache(self.tensors[2 * layer_idx], keys, self.positions)
        v = write_cache(self.tensors[2 * layer_idx + 1], values, self.positions)
        self.tensors[2 * layer_idx], self.tensors[2 * layer_idx + 1] = k, v
        return k, v


class CachedHFCausalLM(CachedLM):
    """A transformers causal LM (`model.model.embed_tokens/layers/norm/rotary_emb`,
    `model.lm_head`) run layer by layer with an explicit cache and an additive mask."""

    def __init__(self, model: nn.Module, cache_len: int):
        super().__init__(cache_len)
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
            raise TypeError(f"{type(model).__name__} does not have the Llama layout (model.model.{{"
                            f"{', '.join(needed)}}}, model.lm_head); wrap it in a CachedLM subclass")
        cfg = model.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise NotImplementedError(f"{type(model).__name__}: layer types {sorted(kinds)}; only full "
                                      "attention layers are supported (no sliding window)")
        limit = getattr(cfg, "max_position_embeddings", None)
        if limit is not None and cache_len > limit:
            raise ValueError(f"cache_len ({cache_len}) exceeds max_position_embeddings ({limit})")
        self.model = model

    def cache_shape(self):
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return (1, cfg.num_key_value_heads, self.cache_len, head_dim)

    def num_layers(self):
        return self.model.config.num_hidden_layers

    def forward(self, tokens, input_pos, kv_cache):
        inner = self.model.model
        hidden = inner.embed_tokens(tokens)
        position_ids = input_pos[None, :]
        rope = inner.rotary_emb(hidden, position_ids=position_ids)
        mask = attention_bias(input_pos, self.cache_len, hidden.dtype)[None, None]
        cache = _ExplicitCache(kv_cache, input_pos)
        for layer in inner.layers[: self.num_layers()]:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, cache=cache,
                           position_embeddings=rope)
            if isinstance(hidden, tuple):  # older layers return (hidden, ...)
                hidden = hidden[0]
        logits = self.model.lm_head(inner.norm(hidden))
        return (logits, *cache.tensors)


def attention_for_export(lm: CachedLM):
    """transformers models attend with `hf_attention` (plain LiteRT ops, no repeated
    kv heads) while exported; other models as they are."""
    if isinstance(lm, CachedHFCausalLM):
        return litert_attention(lm.model)
    return contextlib.nullcontext()


def with_kv_cache(model: nn.Module, cache_len: int) -> CachedLM:
    """Wrap `model` (TinyLlama, a transformers causal LM, or already a CachedLM)."""
    if isinstance(model, CachedLM):
        if model.cache_len != cache_len:
            raise ValueError(f"the CachedLM was built for cache_len={model.cache_len}, asked for {cache_len}")
        return model
    if isinstance(model, TinyLlama):
        return CachedTinyLlama(model, cache_len)
    return CachedHFCausalLM(model, cache_len)


def export_generative(model: nn.Module, *, prefill_len: int = 32, cache_len: int = 128,
                      **convert_options) -> EdgeModel:
    """Convert `model` into a LiteRT model with `prefill` and `decode` signatures sharing
    its weights (see the module docstring for the tensors). `model` may live on any
    device. `convert_options` go to `convert` (quant_config, target, progress...)."""
    if not 1 <= prefill_len <= cache_len:
        raise ValueError(f"prefill_len ({prefill_len}) must be between 1 and cache_len ({cache_len})")
    lm = with_kv_cache(model, cache_len)
    prefill_args = (torch.zeros(1, prefill_len, dtype=torch.int32),
                    torch.arange(prefill_len, dtype=torch.int32), lm.empty_cache())
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), lm.empty_cache())
    outputs = ["logits"] + [f"kv_cache_{i}" for i in range(len(prefill_args[2]))]
    with attention_for_export(lm):
        return (signature("prefill", lm, prefill_args, output_names=outputs)
                .signature("decode", lm, decode_args, output_names=outputs)
                .convert(**convert_options))
