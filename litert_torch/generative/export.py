"""Export a decoder-only LM with an explicit KV cache as LiteRT signatures sharing weights.

    edge = export_generative(model, prefill_len=32, cache_len=128)
    tokens = generate(edge, prompt_ids, max_new_tokens=20)     # runs in LiteRT

Every signature takes and returns the whole cache, one tensor per layer and role:

    prefill(tokens int32[1, prefill_len], input_pos int32[prefill_len], kv_cache_0..2L-1)
    decode (tokens int32[1, 1],           input_pos int32[1],           kv_cache_0..2L-1)
      -> (logits float32[1, n, vocab], kv_cache_0..2L-1 updated, same names)

`prefill_len` may be a list: one signature `prefill_<n>` per length (`prefill_32`,
`prefill_128`, ...), all sharing the weights. Prefill returns the logits of the chunk's
last position by default (`prefill_logits="last"`, n = 1; "all": every position;
"none": no logits output); decode returns its token's. `input_pos` of a chunk must be
consecutive from input_pos[0] >= 0, with padding (-1) only at the end, and the chunk must
fit the cache (input_pos[0] + prefill_len <= cache_len): the cache is written as one block
(DYNAMIC_UPDATE_SLICE) at input_pos[0] (`kv_cache.check_positions` says what is wrong).

`kv_cache_{2i}` holds layer i's keys, `kv_cache_{2i+1}` its values, each
`float32[1, kv_heads, cache_len, head_dim]`; a sliding-window layer (window < cache_len)
returns `kv_ring_{2i}`, `kv_ring_{2i+1}` instead (inputs keep `kv_cache_*` names): ring buffers of `window` slots, so that
its cache costs what the window needs. A model whose layers are all sliding has no
context limit from its cache. Models: `TinyLlama` (this package) and
transformers' decoder-only causal LMs (see `transformers_lm` and docs/llm_families.md);
what would not be exact is refused, and `verify=True` checks the cached model against
the model's own forward in PyTorch before converting.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from converter.pipeline import cpu_view
from litert_torch.edge_model import EdgeModel
from litert_torch.generative.llama import TinyLlama
from litert_torch.generative.transformers_lm import (
    TransformersCachedLM,
    UnsupportedModelError,
    attention_through_litert,
    text_config,
)
from litert_torch.signatures import signature

LOGITS_CHOICES = ("last", "all", "none")


class CachedLM(nn.Module):
    """A decoder-only LM as `forward(tokens, input_pos, kv_cache) -> (logits, *new_cache)`
    with `kv_cache` a flat list [keys_0, values_0, keys_1, ...]."""

    def __init__(self, cache_len: int, logits: str = "last"):
        super().__init__()
        if cache_len < 1:
            raise ValueError(f"cache_len must be positive, got {cache_len}")
        if logits not in LOGITS_CHOICES:
            raise ValueError(f"logits must be one of {LOGITS_CHOICES}, got {logits!r}")
        self.cache_len = cache_len
        self.logits = logits

    def cache_shape(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def cache_shapes(self) -> list[tuple[int, ...]]:
        """One shape per cache tensor (keys_0, values_0, keys_1, ...)."""
        return [self.cache_shape()] * (2 * self.num_layers())

    def num_layers(self) -> int:
        raise NotImplementedError

    def empty_cache(self) -> list[torch.Tensor]:
        return [torch.zeros(shape) for shape in self.cache_shapes()]

    def keep_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.logits == "none":
            return ()
        return (logits[:, -1:] if self.logits == "last" else logits,)


class CachedTinyLlama(CachedLM):
    """`TinyLlama` with its cache flattened into a list of tensors."""

    def __init__(self, model: TinyLlama, cache_len: int, logits: str = "last"):
        super().__init__(cache_len, logits)
        if cache_len > model.config.max_seq_len:
            raise ValueError(
                f"cache_len ({cache_len}) exceeds the model's max_seq_len "
                f"({model.config.max_seq_len}): its rotary tables stop there"
            )
        self.model = model

    def cache_shape(self):
        cfg = self.model.config
        return (1, cfg.n_kv_heads, self.cache_len, cfg.head_dim)

    def num_layers(self):
        return self.model.config.n_layers

    def forward(self, tokens, input_pos, kv_cache):
        pairs = [(kv_cache[2 * i], kv_cache[2 * i + 1]) for i in range(self.num_layers())]
        logits, new_cache = self.model(tokens, input_pos, pairs, last_only=self.logits == "last")
        return (*self.keep_logits(logits), *[t for pair in new_cache for t in pair])


class CachedHFCausalLM(CachedLM):
    """A transformers causal LM run through its own forward with an explicit cache
    (`transformers_lm.TransformersCachedLM`)."""

    def __init__(self, model: nn.Module, cache_len: int, logits: str = "last", experts: str = "gather"):
        super().__init__(cache_len, logits)
        self.inner = TransformersCachedLM(model, cache_len, logits, experts)
        self.model = model

    def cache_shapes(self):
        return self.inner.cache_shapes()

    def num_layers(self):
        return text_config(self.model).num_hidden_layers

    def forward(self, tokens, input_pos, kv_cache):
        return self.inner(tokens, input_pos, kv_cache)


def attention_for_export(lm: CachedLM):
    """transformers models attend through `litert_attention` while exported."""
    if isinstance(lm, CachedHFCausalLM):
        return attention_through_litert(lm.model, lm.inner.experts)
    return contextlib.nullcontext()


def with_kv_cache(model: nn.Module, cache_len: int, logits: str = "last", experts: str = "gather") -> CachedLM:
    """Wrap `model` (TinyLlama, a transformers causal LM, or already a CachedLM).
    `experts`: how mixture-of-experts blocks run ("gather" or "dense", see
    `transformers_lm.EXPERTS_FORMS`)."""
    if isinstance(model, CachedLM):
        if model.cache_len != cache_len:
            raise ValueError(f"the CachedLM was built for cache_len={model.cache_len}, asked for {cache_len}")
        return model
    if isinstance(model, TinyLlama):
        return CachedTinyLlama(model, cache_len, logits)
    return CachedHFCausalLM(model, cache_len, logits, experts)


@torch.no_grad()
def verify_cached_lm(
    model: nn.Module,
    cache_len: int,
    prefill_len: int,
    steps: int = 40,
    tolerance: float = 1e-4,
    experts: str = "gather",
) -> float:
    """Prefill chunks then decode steps through the explicit cache, in PyTorch, against
    the model's own forward over the whole sequence: max relative error of the logits at
    every position (raises UnsupportedModelError above `tolerance`)."""
    from runtimes.litert import max_relative_error

    lm = with_kv_cache(model, cache_len, logits="all", experts=experts)
    device = next(model.parameters()).device
    total = min(cache_len, max(steps, 2 * prefill_len + 1))
    if total < 2:
        raise ValueError(f"verify needs a cache of at least 2 slots, got cache_len={cache_len}")
    ids = torch.randint(0, _vocab_size(model), (1, total), generator=torch.Generator().manual_seed(0))
    out = model(ids.to(device))
    expected = getattr(out, "logits", out).float().cpu()
    cache = [c.to(device) for c in lm.empty_cache()]
    # Up to two prefill chunks (the last one padded; each within the cache), then one decode step per position.
    starts = [s for s in range(0, min(2 * prefill_len, total - 1), prefill_len) if s + prefill_len <= cache_len]
    chunks = [(s, min(s + prefill_len, total - 1)) for s in starts]
    got = []
    with attention_for_export(lm):
        for start, stop in chunks:
            positions = torch.full((prefill_len,), -1, dtype=torch.int32)
            positions[: stop - start] = torch.arange(start, stop, dtype=torch.int32)
            tokens = torch.zeros(1, prefill_len, dtype=torch.int32)
            tokens[0, : stop - start] = ids[0, start:stop]
            logits, *cache = lm(tokens.to(device), positions.to(device), cache)
            got.append(logits[:, : stop - start].float().cpu())
        for pos in range(chunks[-1][1], total):
            logits, *cache = lm(
                ids[:, pos : pos + 1].int().to(device), torch.tensor([pos], dtype=torch.int32, device=device), cache
            )
            got.append(logits.float().cpu())
    error = max_relative_error(torch.cat(got, dim=1).numpy(), expected.numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{type(model).__name__}: the cached model's logits differ from the model's "
            f"own forward by {error:.3g} (max relative, over {total} positions); "
            "refusing to export a different model"
        )
    return error


def cache_tensor_names(lm: CachedLM) -> list[str]:
    """`kv_cache_<i>` for a tensor of `cache_len` slots, `kv_ring_<i>` for a sliding
    layer's ring buffer (how `generate` tells the context limit from the file)."""
    shapes = lm.cache_shapes()
    return [f"kv_{'cache' if shape[2] == lm.cache_len else 'ring'}_{i}" for i, shape in enumerate(shapes)]


def _vocab_size(model: nn.Module) -> int:
    cfg = text_config(model)  # a multimodal config's own vocab_size may not be its decoder's (PaliGemma)
    return cfg.vocab_size if hasattr(cfg, "vocab_size") else cfg.get_text_config().vocab_size


def _prefill_lengths(prefill_len, cache_len: int) -> list[int]:
    lengths = [prefill_len] if isinstance(prefill_len, int) else list(prefill_len)
    if not lengths or len(set(lengths)) != len(lengths):
        raise ValueError(f"prefill_len must be an int or a list of distinct ints, got {prefill_len!r}")
    for n in lengths:
        if not 1 <= n <= cache_len:
            raise ValueError(f"prefill_len ({n}) must be between 1 and cache_len ({cache_len})")
    return sorted(lengths)


def export_generative(
    model: nn.Module,
    *,
    prefill_len: int | list[int] = 32,
    cache_len: int = 128,
    prefill_logits: str = "last",
    verify: bool = True,
    experts: str = "auto",
    **convert_options,
) -> EdgeModel:
    """Convert `model` into a LiteRT model with prefill and `decode` signatures sharing
    its weights (see the module docstring for the tensors). `model` may live on any
    device. `verify`: check the cached model against the model's own forward in PyTorch
    first (transformers models; refuses on a difference). `experts`: the form of
    mixture-of-experts blocks, "gather", "dense", or "auto" (dense in prefill, where
    gathering every token's experts' weights costs 10x, gather in decode).
    `convert_options` go to
    `convert` (quant_config, target, progress...)."""
    lengths = _prefill_lengths(prefill_len, cache_len)
    if prefill_logits not in LOGITS_CHOICES:
        raise ValueError(f"prefill_logits must be one of {LOGITS_CHOICES}, got {prefill_logits!r}")
    if isinstance(model, CachedLM):
        prefill_lm = decode_lm = with_kv_cache(model, cache_len)
    else:
        model = cpu_view(model)  # a model on "tpu" is probed, verified and converted from a CPU copy
        prefill_experts, decode_experts = ("dense", "gather") if experts == "auto" else (experts, experts)
        prefill_lm = with_kv_cache(model, cache_len, prefill_logits, prefill_experts)
        decode_lm = with_kv_cache(model, cache_len, "last", decode_experts)
        if verify and isinstance(prefill_lm, CachedHFCausalLM):
            for form in {prefill_experts, decode_experts}:
                verify_cached_lm(model, cache_len, lengths[0], experts=form)
    cache_names = cache_tensor_names(decode_lm)
    prefill_outputs = ([] if prefill_lm.logits == "none" else ["logits"]) + cache_names
    builder = None
    for n in lengths:
        name = "prefill" if isinstance(prefill_len, int) else f"prefill_{n}"
        args = (torch.zeros(1, n, dtype=torch.int32), torch.arange(n, dtype=torch.int32), prefill_lm.empty_cache())
        builder = (signature if builder is None else builder.signature)(
            name, prefill_lm, args, output_names=prefill_outputs
        )
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), decode_lm.empty_cache())
    builder = builder.signature("decode", decode_lm, decode_args, output_names=["logits"] + cache_names)
    return builder.convert(**convert_options)
