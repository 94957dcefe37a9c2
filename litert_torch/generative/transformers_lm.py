"""Any transformers decoder-only causal LM with an explicit KV cache, exact or refused.

The model runs its own `forward` (embeddings, norms, rotary tables, soft-capping, tied
heads, q/k norms: all transformers' code), with two things swapped for the time of a call:

- the cache: an `ExplicitCache` (a transformers `Cache`) whose `update` writes into the
  tensors passed to the exported signature and returns them; full-attention layers hold
  `cache_len` slots, sliding-window layers a ring buffer of `window` slots;
- the attention function: `litert_attention` (registered in transformers'
  `AttentionInterface`) attends with the mask the cache made for the layer it just
  updated, so each layer gets its own causal, windowed or ring mask whatever the model's
  mask code would have built. transformers passes the layer's `sliding_window`,
  `softcap` and `scaling` here, and they are checked against the plan.

The model's own mask builders get `litert_mask` (registered in `AttentionMaskInterface`),
which returns the additive mask of a full-attention layer (slot index = position); a
family that computes attention itself (no `AttentionInterface`: Bloom, Falcon, MPT) uses
that mask, which is right for full-attention layers only; a sliding layer there is refused.
No attention mask is passed in, so ALiBi families build their biases from key positions
0..cache_len-1, which are the slots' positions.

Anything that would change the math and is not handled above is refused before export
(`check_supported`), and `verify_cached_lm` compares the cached model with the model's own
forward in PyTorch so that what is not caught by name is caught by number.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from litert_torch.generative.attention import grouped_attention
from litert_torch.generative.errors import UnsupportedModelError
from litert_torch.generative.image_families import redirect_image_to_text
from litert_torch.generative.kv_cache import ring_attention_bias, windowed_attention_bias, write_cache, write_ring

ATTENTION_NAME = "litert_explicit_cache"

# Attention-function arguments that change the math and have no implementation here.
REFUSED_ATTENTION_ARGUMENTS = {
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "head_mask": "head masks",
    "alibi": "ALiBi biases",
}

# Families whose forward counts positions from a number other than 0 (what it adds to
# arange when no position_ids are given, and what its generate passes): PaliGemma's are 1-indexed.
POSITION_OFFSETS = {"PaliGemmaForConditionalGeneration": 1}

# Families that do not route attention or their cache through transformers' interfaces
# in a way this adapter can use, with what is missing.
UNSUPPORTED_FAMILIES: dict[str, str] = {}


def _model_name(model: nn.Module) -> str:
    return type(model).__name__


def text_config(model: nn.Module):
    """The decoder's config: the model's own, or a multimodal model's text config."""
    cfg = model.config
    if hasattr(cfg, "num_hidden_layers") or not hasattr(cfg, "get_text_config"):
        return cfg
    return cfg.get_text_config()


def _rope_types(params) -> set[str]:
    if not isinstance(params, dict):
        return set()
    if "rope_type" in params or "type" in params:
        return {str(params.get("rope_type", params.get("type")))}
    return set().union(*(_rope_types(v) for v in params.values())) if params else set()


def layer_windows(config, n_layers: int, model_name: str = "model") -> list[int | None]:
    """The attention window of each layer (None: full attention), from every spelling
    transformers configs use; a layer kind that is neither is refused by name."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        out = []
        for i, kind in enumerate(layer_types[:n_layers]):
            if kind == "full_attention":
                out.append(None)
            elif kind == "sliding_attention":
                if not window:
                    raise UnsupportedModelError(
                        f"{model_name}: layer {i} is 'sliding_attention' but config.sliding_window is {window!r}"
                    )
                out.append(int(window))
            else:
                raise UnsupportedModelError(
                    f"{model_name}: layer {i} has attention type {kind!r}; "
                    "supported: 'full_attention', 'sliding_attention'"
                )
        return out
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    for name in ("attention_chunk_size", "attention_window"):
        if getattr(config, name, None):
            raise UnsupportedModelError(
                f"{model_name}: config.{name}={getattr(config, name)!r} (chunked/local attention) is not supported"
            )
    attention_layers = getattr(config, "attention_layers", None)  # GPT-Neo: "global" / "local"
    if attention_layers and any(kind != "global" for kind in attention_layers):
        raise UnsupportedModelError(
            f"{model_name}: local attention layers (config.attention_layers with "
            f"window_size={getattr(config, 'window_size', None)}) are not supported"
        )
    return [int(window) if window else None] * n_layers


def check_supported(model: nn.Module) -> None:
    """Refuse, by name, config fields whose math the adapter does not reproduce."""
    if _model_name(model) != "GitForCausalLM":  # GIT without an image is a plain causal LM
        redirect_image_to_text(model, "export_generative")
    cfg, name = text_config(model), _model_name(model)
    if name in UNSUPPORTED_FAMILIES:
        raise UnsupportedModelError(f"{name}: {UNSUPPORTED_FAMILIES[name]}")
    if name.startswith("Falcon") and getattr(cfg, "alibi", False):
        raise UnsupportedModelError(
            f"{name}: config.alibi=True (Falcon's ALiBi path computes attention itself, "
            "with biases rounded to bfloat16 from a padding mask; not reproduced)"
        )
    if getattr(cfg, "is_encoder_decoder", False) or getattr(model.config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name}: only decoder-only causal LMs are supported")
    rope = _rope_types(getattr(cfg, "rope_parameters", None)) | _rope_types(getattr(cfg, "rope_scaling", None))
    data_dependent = sorted(rope & {"dynamic", "longrope"})
    if data_dependent:
        raise UnsupportedModelError(
            f"{name}: rope_type {data_dependent[0]!r} switches its frequencies on the "
            "sequence length at run time; only static rope types are supported"
        )
    experts = next(
        (getattr(cfg, n) for n in ("num_local_experts", "num_experts", "n_routed_experts") if getattr(cfg, n, None)),
        None,
    )
    if experts and not any(_routes_through_experts_interface(m) for m in model.modules()):
        raise UnsupportedModelError(
            f"{name}: mixture-of-experts routing (num_experts={experts}, "
            f"top-k={getattr(cfg, 'num_experts_per_tok', None)}) whose experts do not go "
            "through transformers' ExpertsInterface"
        )


def _routes_through_experts_interface(module: nn.Module) -> bool:
    return hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "down_proj")


# How mixture-of-experts blocks run in the exported model (transformers' ExpertsInterface):
# "gather": transformers' own batched_mm form, which gathers the selected experts' weights
# per token (GATHER + BATCH_MATMUL; compute grows with top-k); "dense": every expert on
# every token, weighted by the routing weights (zero for experts not selected).
EXPERTS_FORMS = {"gather": "batched_mm", "dense": "litert_dense_experts"}


def dense_experts_forward(
    self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """All experts on all tokens (T, D) -> (T, D), combined with the top-k routing weights."""
    experts = torch.arange(self.num_experts, device=hidden_states.device)
    routing = ((top_k_index[..., None] == experts).to(top_k_weights.dtype) * top_k_weights[..., None]).sum(1)
    x = hidden_states[None]  # (1, T, D) against (E, ...) weights

    def linear(inputs, weight, bias):
        out = torch.matmul(inputs, weight if self.is_transposed else weight.transpose(1, 2))
        return out if bias is None else out + bias[:, None, :]

    if self.has_gate:
        h = self._apply_gate(
            linear(x, self.gate_up_proj, getattr(self, "gate_up_proj_bias", None) if self.has_bias else None)
        )
    else:
        h = self.act_fn(linear(x, self.up_proj, getattr(self, "up_proj_bias", None) if self.has_bias else None))
    out = linear(h, self.down_proj, getattr(self, "down_proj_bias", None) if self.has_bias else None)  # (E, T, D)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * routing.transpose(0, 1)[..., None].to(out.dtype)).sum(0).to(hidden_states.dtype)


@dataclass
class _LayerPlan:
    window: int | None  # None: full attention over cache_len slots
    ring: bool  # a ring buffer of `window` slots


def explicit_cache_class():
    """The transformers `Cache` subclass for one call (made lazily: importing this module
    needs no transformers). With `shapes` given, it only records the shapes written."""
    from transformers import Cache

    class _ExplicitCache(Cache):
        def __init__(self, tensors, positions, plans, cache_len, shapes: dict | None = None, overlay=None):
            super().__init__(layers=[])
            self.overlay = overlay
            self.shapes = shapes
            self.tensors = list(tensors)
            self.positions = positions
            self.plans = plans
            self.cache_len = cache_len
            self.masks: dict[int, torch.Tensor] = {}
            self.current_layer: int | None = None
            self.attended: set[int] = set()
            tokens = positions.shape[0]
            self.full_bias = (
                torch.zeros(tokens, tokens, device=positions.device)
                if shapes is not None
                else windowed_attention_bias(positions, cache_len, None)
            )

        def __len__(self):
            return len(self.plans)

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if self.shapes is not None:
                self.shapes[layer_idx] = (key_states.shape, value_states.shape)
                self.current_layer = layer_idx
                return key_states, value_states
            plan, pos = self.plans[layer_idx], self.positions
            k_old, v_old = self.tensors[2 * layer_idx], self.tensors[2 * layer_idx + 1]
            if plan.ring:
                self.tensors[2 * layer_idx] = write_ring(k_old, key_states, pos)
                self.tensors[2 * layer_idx + 1] = write_ring(v_old, value_states, pos)
                self.masks[layer_idx] = ring_attention_bias(pos, plan.window, key_states.dtype)
                keys, values = torch.cat([k_old, key_states], dim=2), torch.cat([v_old, value_states], dim=2)
                if self.overlay is not None:  # keys: [ring, the chunk's own]
                    shown = torch.cat([torch.zeros_like(self.overlay[:, :1]).expand(-1, plan.window), self.overlay], 1)
                    self.masks[layer_idx] = self.masks[layer_idx].masked_fill(shown, 0.0)
            else:
                keys = self.tensors[2 * layer_idx] = write_cache(k_old, key_states, pos)
                values = self.tensors[2 * layer_idx + 1] = write_cache(v_old, value_states, pos)
                self.masks[layer_idx] = windowed_attention_bias(pos, self.cache_len, plan.window, key_states.dtype)
                if self.overlay is not None:  # keys: slot = position
                    slots = torch.arange(self.cache_len, dtype=pos.dtype, device=pos.device)
                    at_slot = (pos[:, None] == slots[None, :]).to(key_states.dtype)  # (chunk, slots)
                    shown = torch.matmul(self.overlay.to(key_states.dtype), at_slot) > 0
                    self.masks[layer_idx] = self.masks[layer_idx].masked_fill(shown, 0.0)
            self.current_layer = layer_idx
            return keys, values

        def get_seq_length(self, layer_idx: int = 0) -> int:
            # Families that size a padding mask as past + new tokens see the whole cache.
            return 0 if self.shapes is not None else self.cache_len - self.positions.shape[0]

        def get_mask_sizes(self, query_length: int, layer_idx: int = 0):
            return (query_length if self.shapes is not None else self.cache_len), 0

        def get_query_offset(self, layer_idx: int = 0) -> int:
            return 0

        @property
        def is_compileable(self) -> bool:
            return True

        @property
        def is_sliding(self):
            return [p.window is not None for p in self.plans]

    return _ExplicitCache


_ACTIVE: list = []  # the cache of the call in progress (a stack: calls do not nest, but stay safe)


def litert_attention(
    module: nn.Module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """transformers' attention-function signature; returns ((B, T, H, D), None)."""
    cache = _ACTIVE[-1]
    if cache.shapes is not None:  # the shape probe
        return torch.zeros(
            query.shape[0], query.shape[2], query.shape[1], value.shape[-1], dtype=query.dtype, device=query.device
        ), None
    layer = cache.current_layer
    if layer is None:
        raise UnsupportedModelError(
            "attention ran before the layer wrote its cache: the model does not use transformers' Cache.update"
        )
    for arg, what in REFUSED_ATTENTION_ARGUMENTS.items():
        if kwargs.get(arg) is not None:
            raise UnsupportedModelError(f"layer {layer}: {what} (attention argument {arg!r}) are not supported")
    planned = cache.plans[layer].window
    window = sliding_window or None
    if window is not None and window >= cache.cache_len:
        window = None  # a window covering the whole cache is full attention, as the plan says
    if window != planned:
        raise UnsupportedModelError(
            f"layer {layer}: the model attends with sliding_window={sliding_window!r}, its config says {planned!r}"
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    cache.attended.add(layer)
    out = grouped_attention(query, key, value, cache.masks[layer], scaling, softcap)
    return out.transpose(1, 2).contiguous(), None


def litert_mask(*args, **kwargs) -> torch.Tensor:
    """transformers' mask-function interface: the full-attention mask (1, 1, T, slots)."""
    return _ACTIVE[-1].full_bias[None, None]


@contextlib.contextmanager
def attention_through_litert(model: nn.Module, experts: str = "gather"):
    """Run a transformers model with `litert_attention`, `litert_mask` and the experts
    form `experts` (see EXPERTS_FORMS); its own settings are restored after."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if experts not in EXPERTS_FORMS:
        raise ValueError(f"experts must be one of {sorted(EXPERTS_FORMS)}, got {experts!r}")
    AttentionInterface.register(ATTENTION_NAME, litert_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, litert_mask)
    switches = [("_attn_implementation", ATTENTION_NAME), ("_experts_implementation", EXPERTS_FORMS[experts])]
    if experts == "dense":
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_FORMS["dense"], dense_experts_forward)
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values()
    before = [(c, attr, getattr(c, attr)) for c in configs for attr, _ in switches if hasattr(c, attr)]
    for c, attr, _ in before:
        setattr(c, attr, dict(switches)[attr])
    try:
        yield
    finally:
        for c, attr, value in before:
            setattr(c, attr, value)


def _forward_parameters(model: nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


class TransformersCachedLM(nn.Module):
    """`forward(tokens, input_pos, kv_cache) -> (logits?, *new_cache)` for a transformers
    causal LM. `logits`: "last" (the chunk's last position), "all", or "none"."""

    def __init__(self, model: nn.Module, cache_len: int, logits: str = "last", experts: str = "gather"):
        super().__init__()
        if not hasattr(model, "config") or not hasattr(text_config(model), "num_hidden_layers"):
            raise TypeError(
                f"{_model_name(model)} is not a transformers causal LM (no config.num_hidden_layers); "
                "wrap it in a CachedLM subclass"
            )
        if logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        check_supported(model)
        cfg = text_config(model)
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if limit is not None and cache_len > limit:
            raise ValueError(f"cache_len ({cache_len}) exceeds max_position_embeddings ({limit})")
        self.model, self.cache_len, self.logits, self.experts = model, cache_len, logits, experts
        self.windows = layer_windows(cfg, cfg.num_hidden_layers, _model_name(model))
        self.plans = [
            _LayerPlan(w if w is not None and w < cache_len else None, w is not None and w < cache_len)
            for w in self.windows
        ]
        params = _forward_parameters(model)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params
        self.position_offset = POSITION_OFFSETS.get(_model_name(model), 0)
        self._shapes = self._probe_shapes()

    def _probe_shapes(self) -> list[tuple[int, ...]]:
        """Cache tensor shapes read from the keys/values the model writes (head counts and
        dims differ between families and even between layers)."""
        from converter.pipeline import cpu_view

        shapes: dict[int, tuple] = {}
        model, self.model = self.model, cpu_view(self.model)  # the probe runs on CPU
        try:
            with torch.no_grad():
                self._run(torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), [], shapes)
        finally:
            self.model = model
        n = text_config(self.model).num_hidden_layers
        if sorted(shapes) != list(range(n)):
            raise UnsupportedModelError(
                f"{_model_name(self.model)}: its layers did not write their keys and values "
                f"through transformers' Cache.update (layers seen: {sorted(shapes)} of {n})"
            )
        out = []
        for i in range(n):
            for s in shapes[i]:
                slots = self.plans[i].window if self.plans[i].ring else self.cache_len
                out.append((1, s[1], slots, s[3]))
        return out

    def cache_shapes(self) -> list[tuple[int, ...]]:
        return list(self._shapes)

    def forward(self, tokens, input_pos, kv_cache, inputs_embeds=None, overlay=None, rope_pos=None):
        """`inputs_embeds` (1, T, hidden): the model's input embeddings for the chunk
        instead of looking up `tokens` (multimodal prefill); `overlay` (T, T) bool: keys of
        the chunk a query sees beyond the causal ones, within its window (bidirectional
        blocks: a Gemma 3 image); `rope_pos` (3, T): the model's rotary positions when they
        are not the tokens' indices (Qwen2-VL's M-RoPE; `input_pos` still picks the slots)."""
        cache, out = self._run(
            tokens, input_pos, kv_cache, inputs_embeds=inputs_embeds, overlay=overlay, rope_pos=rope_pos
        )
        logits = out.logits if hasattr(out, "logits") else out[0]
        if self.logits == "none":
            return tuple(cache.tensors)
        if self.logits == "last":
            logits = logits[:, -1:]
        return (logits, *cache.tensors)

    def _run(self, tokens, input_pos, kv_cache, shapes=None, inputs_embeds=None, overlay=None, rope_pos=None):
        cache = explicit_cache_class()(kv_cache, input_pos, self.plans, self.cache_len, shapes, overlay)
        # Padding (-1) takes position 0 in the model (learned position tables are gathered
        # with it); the cache and the masks see -1 and ignore it.
        position_ids = input_pos.clamp(min=0)[None, :].long() + self.position_offset
        if rope_pos is not None:
            position_ids = rope_pos[:, None, :].long()
        extra = {"input_ids": tokens} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        if self._keeps_logits and self.logits == "last":
            extra["logits_to_keep"] = 1
        _ACTIVE.append(cache)
        try:
            with attention_through_litert(self.model, self.experts):
                out = self.model(position_ids=position_ids, **{self._cache_arg: cache}, use_cache=True, **extra)
        finally:
            _ACTIVE.pop()
        for i, plan in enumerate(self.plans):
            if shapes is None and plan.window is not None and i not in cache.attended:
                raise UnsupportedModelError(
                    f"{_model_name(self.model)}: layer {i} has a sliding window but computes "
                    "attention itself (not through transformers' AttentionInterface)"
                )
        return cache, out
