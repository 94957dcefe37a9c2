"""Encoder-decoder (seq2seq) models with an explicit KV cache, exact or refused: T5,
BART, mBART, Marian, Whisper (any transformers model whose layers go through
transformers' `Cache` and `AttentionInterface`); NLLB-MoE and Switch with their experts
loops written densely (`DENSE_EXPERTS`).

    edge = export_seq2seq(model, source_len=32, cache_len=64)    # encode + decode signatures
    new_ids = generate_seq2seq(edge, source_ids, 20, decoder_prompt=decoder_start_ids(model))

The model runs its own `forward` (embeddings, relative position buckets, learned or
sinusoidal position tables, convolutional audio stem, scaled embeddings, tied heads,
final logits biases: all transformers' code) with two things swapped for the call, as
for decoder-only models (`transformers_lm`):

- the cache: an `EncoderDecoderCache` of the explicit self-attention cache of
  `transformers_lm` (one linear cache of `cache_len` slots per layer, written by
  DYNAMIC_UPDATE_SLICE; its `get_seq_length` is the chunk's first position, which is
  how these families place their decoder tokens) and a cross-attention cache holding the
  per-layer keys/values `encode` computed, marked as already filled so that each layer
  reuses them instead of projecting the encoder states again;
- the attention function: `seq2seq_attention` (registered in transformers'
  `AttentionInterface`) tells which attention it serves by the keys it gets: a self
  cache's keys get the causal mask over the cache, the cross keys the source padding
  mask, anything else (during `encode` only) is the encoder's self-attention with the
  source padding mask. T5's `position_bias` is added to the scores as in its own code.
  No mask function is registered, so transformers' mask builders return None.

Signatures (one file, shared weights):

    encode(input_ids int32[1, S], source_mask int32[1, S])        text models
    encode(input_features float32[1, n_mels, 2 * max_source_positions])   Whisper
    encode(input_features float32[1, F, feat], feature_mask int32[1, F])   Speech2Text
    encode(input_values float32[1, N])                                     Moonshine (raw audio)
      -> cross_kv_0 ... cross_kv_{2L-1}          float32[1, heads, S, head_dim]
    decode(tokens int32[1, 1], input_pos int32[1], kv_cache_0 ... kv_cache_{2L-1},
           cross_kv_0 ... cross_kv_{2L-1}[, source_mask int32[1, S or F]])
      -> (logits float32[1, 1, vocab], kv_cache_0 ... kv_cache_{2L-1})

The source of a text model is padded to a fixed `source_len` (`source_mask` is 1 on real
tokens, 0 on padding, as transformers' `attention_mask`): padded keys are masked in the
encoder's self-attention and in every cross-attention, so the real positions' results
are those of the unpadded source (T5's relative buckets, BART's learned positions and
Marian's sinusoids all count from the first token). Whisper's encoder always takes
`2 * max_source_positions` mel frames, as transformers requires. Speech2Text's F frames
(`source_len`) are padded with zeros and masked as its feature extractor does (the mask
subsampled like its strided convolutions, by the model's own
`_get_feat_extract_output_lengths`): exactly transformers' result on the same padded
features and mask. Moonshine's N samples (`source_len`) are fixed: its group norm spans
the whole clip, so padding would change every frame; the caller pads or trims to N, as
for Whisper's 30 s. `encode` computes the
cross-attention keys/values once per source with the model's own projections (a decoder
step on a placeholder token whose other results are dead code the converter removes).

`verify_seq2seq` (on by default in `export_seq2seq`) runs encode and decode steps in
PyTorch on a padded source against the model's own forward on the unpadded source and
refuses the export above 1e-4 (max relative error of the logits at any step).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from converter.pipeline import cpu_view
from litert_torch.edge_model import EdgeModel
from litert_torch.generative.attention import grouped_attention
from litert_torch.generative.generate import Sampler, _sampler, one_example, one_sequence
from litert_torch.generative.image_families import redirect_image_to_text
from litert_torch.generative.kv_cache import MASKED_SCORE, check_positions
from litert_torch.generative.transformers_lm import UnsupportedModelError, _LayerPlan, explicit_cache_class
from litert_torch.signatures import signature

ATTENTION_NAME = "litert_seq2seq"

# How attention is written: "sdpa" (scaled_dot_product_attention, which the converter keeps
# whole and lowers to BATCH_MATMUL with adjY, reading the keys as they are, plus a 3-op
# guard for rows without a key) or "matmul" (`grouped_attention`, whose k^T is a TRANSPOSE
# of the keys at every call: 1500 cross keys per Whisper layer per step). Thread CPU time
# per decode step, sdpa / matmul, three interleaved runs of
# `benchmarks/generative/seq2seq_bench.py --attention-ab`: Whisper-tiny shape 0.80-0.92x, T5-small
# shape (64 keys) 0.85-1.10x (noise); identical logits. Read at export time.
ATTENTION_FORM = "sdpa"

# Attention-function arguments that change the math and have no implementation here.
REFUSED_ATTENTION_ARGUMENTS = {"sliding_window": "sliding windows", "softcap": "soft-capping", "sinks": "sinks"}

# Encoder-decoder families whose attention is not plain softmax attention over the whole
# source: (what the architecture does, what exporting it would need).
UNSUPPORTED_FAMILIES = {
    "LEDForConditionalGeneration": (
        "its encoder uses Longformer's attention (a sliding band of neighbours plus global tokens)",
        "a banded, global-token source mask in seq2seq_attention",
    ),
    "LongT5ForConditionalGeneration": (
        "its encoder uses local / transient-global attention (blocks of the source, plus block summaries)",
        "a blocked source mask and the transient global summaries in the encode signature",
    ),
    "ProphetNetForConditionalGeneration": (
        "its decoder predicts n future tokens with n-gram self-attention streams",
        "a cache per stream and a decode signature returning n streams' logits",
    ),
    "XLMProphetNetForConditionalGeneration": (
        "its decoder predicts n future tokens with n-gram self-attention streams",
        "a cache per stream and a decode signature returning n streams' logits",
    ),
}


def _name(model: nn.Module) -> str:
    return type(model).__name__


def _is_audio(model: nn.Module) -> bool:
    return "input_features" in inspect.signature(model.forward).parameters


def _is_raw_audio(model: nn.Module) -> bool:
    return "input_values" in inspect.signature(model.forward).parameters


def decoder_layers(model: nn.Module) -> int:
    """The number of decoder layers, from every spelling transformers configs use."""
    cfg = model.config
    for name in ("decoder_layers", "num_decoder_layers", "decoder_num_hidden_layers", "num_layers"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise UnsupportedModelError(
        f"{_name(model)}: its config gives no decoder depth (decoder_layers, num_decoder_layers, ...); export_seq2seq "
        "keeps one self- and one cross-attention cache per decoder layer, so a single encoder-decoder config "
        "with the decoder's layer count is needed (a model pairing two separately configured models is not one)"
    )


def decoder_start_ids(model: nn.Module) -> list[int]:
    """The decoder prompt transformers starts generation from: `[decoder_start_token_id]`."""
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        raise ValueError(
            f"{_name(model)}: config.decoder_start_token_id is not set; pass decoder_prompt=[...] explicitly"
        )
    return [int(start)]


# ---- the call's state, read by the attention function ------------------------------------


@dataclass
class _CallState:
    phase: str  # "probe" (shapes only), "encode", "decode"
    self_cache: object  # the explicit self-attention cache (transformers_lm)
    cross: object  # the cross-attention cache
    source_bias: torch.Tensor  # (1, S) additive: the source padding mask
    attended: dict = field(default_factory=lambda: {"self": set(), "cross": set(), "encoder": set()})


_ACTIVE: list[_CallState] = []


def seq2seq_attention(
    module: nn.Module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **kwargs,
):
    """transformers' attention-function signature; returns ((B, T, H, D), None)."""
    state = _ACTIVE[-1]
    if state.phase == "probe":
        shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        return torch.zeros(shape, dtype=query.dtype, device=query.device), None
    for arg, what in REFUSED_ATTENTION_ARGUMENTS.items():
        if kwargs.get(arg) is not None:
            raise UnsupportedModelError(
                f"{type(module).__name__}: {what} (attention argument {arg!r}) are not supported in encoder-decoders"
            )
    bias = _bias_for(state, key, module)
    if position_bias is not None:  # T5: relative position buckets, added to the scores by its own code
        if query.shape[1] != key.shape[1]:
            raise UnsupportedModelError(
                f"{type(module).__name__}: a position bias with grouped key/value heads is not supported"
            )
        bias = bias + position_bias
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if ATTENTION_FORM == "sdpa":
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scaling)
    else:
        out = grouped_attention(query, key, value, bias, scaling)
    return out.transpose(1, 2).contiguous(), None


def _bias_for(state: _CallState, key: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The additive mask of the attention whose keys are `key`, told by identity."""
    cache = state.self_cache
    layer = cache.current_layer
    if layer is not None and key is cache.tensors[2 * layer]:
        state.attended["self"].add(layer)
        return cache.masks[layer]
    for i, k in enumerate(state.cross.keys()):
        if key is k:
            state.attended["cross"].add(i)
            return state.source_bias
    if state.phase == "encode":  # the encoder's own self-attention
        state.attended["encoder"].add(id(key))
        return state.source_bias
    raise UnsupportedModelError(
        f"{type(module).__name__}: an attention in the decoder got keys that are neither its self-attention cache nor the "
        "precomputed cross-attention cache (the model does not use transformers' EncoderDecoderCache)"
    )


@contextlib.contextmanager
def _attention_through_litert(model: nn.Module, state: _CallState):
    """Run `model` with `seq2seq_attention` and `state`; its own settings are restored after."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, seq2seq_attention)
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values()
    before = [(c, c._attn_implementation) for c in configs if hasattr(c, "_attn_implementation")]
    for c, _ in before:
        c._attn_implementation = ATTENTION_NAME
    _ACTIVE.append(state)
    try:
        yield
    finally:
        _ACTIVE.pop()
        for c, value in before:
            c._attn_implementation = value


# ---- mixture-of-experts layers ----------------------------------------------------------
# NLLB-MoE's and Switch's experts loop over the experts a batch hit (`nonzero`, `where`,
# `index_add_`: shapes that depend on the routing, which LiteRT cannot express). During the
# call their forward is swapped for the same sum written densely: every expert on every
# token, weighted by the routing the model's own router computed (zero for the experts a
# token is not sent to, or that are over capacity). Each function reproduces its class's
# loop exactly, whatever that loop does.


def _experts_sum(experts: nn.Module, hidden_states, expert_mask, weights) -> torch.Tensor:
    """`sum over (expert e, slot k) of expert_mask[e, k, t] * weights[t, k] * expert_e(h[t])`:
    the loop `for e in hit: idx, top_x = where(expert_mask[e]); out.index_add_(0, top_x,
    expert_e(h[top_x]) * weights[top_x, idx])` of both families, densely."""
    coefficients = (expert_mask.to(weights.dtype) * weights.transpose(0, 1)[None]).sum(1)  # (E, T)
    outputs = torch.stack([experts[f"expert_{e}"](hidden_states) for e in range(experts.num_experts)])
    return (outputs * coefficients[..., None].to(outputs.dtype)).sum(0).to(hidden_states.dtype)


def _switch_experts(self, hidden_states, selected_experts, routing_weights):
    """SwitchTransformersExperts: `selected_experts` (T, 1, E) one-hot, `routing_weights` (T, 1)."""
    return _experts_sum(self, hidden_states, selected_experts.permute(2, 1, 0), routing_weights)


def _nllb_moe_experts(self, hidden_states, router_mask, router_probs):
    """NllbMoeExperts: transformers one-hot encodes `router_mask` (T, E) again, so expert c
    takes the (token, column) pairs whose mask value is c, weighted by `router_probs` there."""
    classes = torch.arange(self.num_experts, device=router_mask.device)
    expert_mask = (router_mask[..., None] == classes).permute(2, 1, 0)
    out = _experts_sum(self, hidden_states, expert_mask, router_probs)
    return out * (1 - self.moe_token_dropout) if self.moe_token_dropout > 0 else out  # eval-mode token dropout


DENSE_EXPERTS = {"SwitchTransformersExperts": _switch_experts, "NllbMoeExperts": _nllb_moe_experts}


def _moe_refusal(model: nn.Module) -> str | None:
    """Why the model's mixture-of-experts layers would not be exact, or None."""
    cfg, name = model.config, _name(model)
    loops = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Experts")})
    unknown = [c for c in loops if c not in DENSE_EXPERTS]
    if unknown:
        return (
            f"{name}: its mixture-of-experts layers ({', '.join(unknown)}) run their experts in a loop over the "
            f"experts the routing hit (shapes that depend on the data); a dense form of that loop is needed (one "
            f"exists for {', '.join(sorted(DENSE_EXPERTS))})"
        )
    if "NllbMoeExperts" in loops:
        if getattr(cfg, "second_expert_policy", "all") != "all":
            return (
                f"{name}: second_expert_policy={cfg.second_expert_policy!r} draws random numbers when routing; "
                "only the deterministic 'all' policy can be exported"
            )
        if getattr(cfg, "moe_eval_capacity_token_fraction", 1.0) < 1.0:
            return (
                f"{name}: moe_eval_capacity_token_fraction={cfg.moe_eval_capacity_token_fraction} drops tokens "
                "by a capacity counted over the whole (padded) source, so padding changes which tokens reach an "
                "expert; export with a fraction of 1.0 (no token dropped), or a source of exactly source_len tokens "
                "would be needed"
            )
    return None


def _kept_in_place(linear: nn.Module):
    """`linear.to(dtype)` returning `linear` itself when it already has that dtype: both
    routers cast their classifier on every call (`self.classifier = self.classifier.to(...)`),
    which torch.export cannot trace (it swaps the parameters)."""
    cast = linear.to

    def to(*args, **kwargs):
        dtype = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.dtype)), None)
        return linear if dtype in (None, linear.weight.dtype) else cast(*args, **kwargs)

    return to


@contextlib.contextmanager
def _dense_experts(model: nn.Module):
    """Run `model` with DENSE_EXPERTS' forwards on its experts modules and its routers'
    casts in place; restored after."""
    swapped = []
    for module in model.modules():
        dense = DENSE_EXPERTS.get(type(module).__name__)
        if dense is not None:
            module.forward = dense.__get__(module)
            swapped.append((module, "forward"))
        elif type(module).__name__.endswith("Router") and isinstance(getattr(module, "classifier", None), nn.Linear):
            module.classifier.to = _kept_in_place(module.classifier)
            swapped.append((module.classifier, "to"))
    try:
        yield
    finally:
        for module, attr in swapped:
            delattr(module, attr)


# ---- caches -----------------------------------------------------------------------------


def _self_cache(tensors, positions, cache_len: int, n_layers: int, shapes: dict | None = None):
    """transformers_lm's explicit cache (full attention, `cache_len` slots per layer), whose
    length is the chunk's first position: where these families place decoder tokens
    (BART's and Whisper's position tables, T5's relative buckets)."""

    class _DecoderSelfCache(explicit_cache_class()):
        def get_seq_length(self, layer_idx: int = 0):
            return 0 if self.shapes is not None else self.positions[0]

    return _DecoderSelfCache(tensors, positions, [_LayerPlan(None, False)] * n_layers, cache_len, shapes)


def _cross_cache(n_layers: int, tensors: list | None):
    """The cross-attention half of an `EncoderDecoderCache`: with `tensors` (k_0, v_0, ...)
    it holds them and layers reuse them; without, it records what each layer's own
    projections of the encoder states write (`encode`)."""
    from transformers import Cache

    class _Layer:
        def __init__(self, keys, values):
            self.keys, self.values = keys, values

    class _CrossCache(Cache):
        def __init__(self):
            super().__init__(layers=[])
            self.n_layers = n_layers
            self.recording = tensors is None
            self.layers = (
                [] if tensors is None else [_Layer(tensors[2 * i], tensors[2 * i + 1]) for i in range(n_layers)]
            )
            self.recorded: dict[int, tuple] = {}

        def __len__(self):
            return self.n_layers

        def keys(self):
            if self.recording:
                return [self.recorded[i][0] for i in sorted(self.recorded)]
            return [layer.keys for layer in self.layers]

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if not self.recording:
                raise UnsupportedModelError(
                    f"layer {layer_idx} projected the encoder states again instead of reusing the cross-attention cache"
                )
            self.recorded[layer_idx] = (key_states, value_states)
            return key_states, value_states

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return 0 if self.recording else self.layers[layer_idx].keys.shape[2]

        @property
        def is_sliding(self):
            return [False] * self.n_layers

    return _CrossCache()


@functools.cache
def _encoder_output_class():
    """The encoder output `decode` hands the model: the placeholder states, and None for the
    other fields some families read from it (router_logits: NLLB-MoE, Switch; the source
    mask: Moonshine; masks come from `source_mask` here)."""
    from transformers.modeling_outputs import MoEModelOutput

    @dataclass
    class EncoderStates(MoEModelOutput):
        attention_mask: torch.Tensor | None = None

    return EncoderStates


def _encoder_decoder_cache(self_cache, cross):
    from transformers import EncoderDecoderCache

    cache = EncoderDecoderCache(self_cache, cross)
    cache.is_updated = {i: not cross.recording for i in range(cross.n_layers)}
    return cache


def _source_bias(source_mask: torch.Tensor | None, length: int, device) -> torch.Tensor:
    if source_mask is None:
        return torch.zeros(1, length, device=device)
    zero = torch.zeros((), device=device)
    return torch.where(source_mask[:1] > 0, zero, torch.full((), MASKED_SCORE, device=device))


# ---- the export contract ---------------------------------------------------------------


class CachedSeq2SeqLM(nn.Module):
    """A transformers encoder-decoder as two forwards, `encode` and `decode` (see the
    module docstring). `source_len`: the fixed source length of a text model (None for
    Whisper, whose encoder length is fixed by its config); `cache_len`: decoder tokens."""

    def __init__(self, model: nn.Module, cache_len: int, source_len: int | None = None):
        super().__init__()
        check_supported(model)
        cfg = model.config
        self.model, self.cache_len = model, int(cache_len)
        self.audio = _is_audio(model)
        if self.cache_len < 1:
            raise ValueError(f"cache_len must be positive, got {cache_len}")
        # learned or sinusoidal position tables bound the lengths (T5's relative buckets do not)
        target_limit = getattr(cfg, "max_target_positions", None) or getattr(cfg, "max_position_embeddings", None)
        if target_limit is not None and self.cache_len > target_limit:
            raise ValueError(f"cache_len ({cache_len}) exceeds the decoder's position table ({target_limit} positions)")
        # Speech2Text: features of any length, subsampled by strided convolutions, padding masked
        self.masked_features = self.audio and not hasattr(cfg, "num_mel_bins")
        self.raw_audio = _is_raw_audio(model)
        if self.raw_audio:  # Moonshine: a fixed number of samples, its conv front end in encode
            if source_len is None or int(source_len) < 1:
                raise ValueError(f"{_name(model)}: pass source_len, the number of audio samples encode takes")
            self.source_len = int(source_len)
            self.encoder_len = int(model.get_encoder()._get_feat_extract_output_lengths(self.source_len))
            if self.encoder_len < 1:
                raise ValueError(f"source_len ({source_len}) is shorter than the convolutional front end's window")
            self.source_shape = (1, self.source_len)
        elif self.masked_features:
            if source_len is None or int(source_len) < 1:
                raise ValueError(f"{_name(model)}: pass source_len, the (padded) number of feature frames")
            self.source_len = int(source_len)
            self.encoder_len = int(model.get_encoder()._get_feat_extract_output_lengths(torch.tensor(self.source_len)))
            if self.encoder_len > cfg.max_source_positions:
                raise ValueError(
                    f"source_len ({source_len}) subsamples to {self.encoder_len} encoder positions, beyond "
                    f"max_source_positions ({cfg.max_source_positions})"
                )
            self.source_shape = (1, self.source_len, cfg.input_feat_per_channel * cfg.input_channels)
        elif self.audio:
            frames = 2 * cfg.max_source_positions
            if source_len not in (None, frames):
                raise ValueError(
                    f"{_name(model)} encodes exactly {frames} mel frames (2 * max_source_positions); "
                    f"got source_len={source_len}"
                )
            self.source_len = frames
            self.encoder_len = cfg.max_source_positions
            self.source_shape = (1, cfg.num_mel_bins, frames)
        else:
            if source_len is None or int(source_len) < 1:
                raise ValueError(f"{_name(model)}: pass source_len, the (padded) source length, got {source_len!r}")
            limit = getattr(cfg, "max_position_embeddings", None)
            if limit is not None and source_len > limit:
                raise ValueError(f"source_len ({source_len}) exceeds max_position_embeddings ({limit})")
            self.source_len = self.encoder_len = int(source_len)
            self.source_shape = (1, self.source_len)
        self.n_layers = decoder_layers(model)
        params = set(inspect.signature(model.forward).parameters)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.self_shapes, self.cross_shapes = self._probe_shapes()

    # -- shapes and inputs
    def sample_source(self) -> tuple[torch.Tensor, ...]:
        if self.raw_audio:
            return (torch.zeros(self.source_shape),)
        if self.masked_features:
            return torch.zeros(self.source_shape), torch.ones(self.source_shape[:2], dtype=torch.int32)
        if self.audio:
            return (torch.zeros(self.source_shape),)
        return torch.zeros(self.source_shape, dtype=torch.int32), torch.ones(self.source_shape, dtype=torch.int32)

    def encoder_mask(self, source_mask):
        """The source mask over encoder positions: a feature mask subsampled as the model's
        convolutions subsample the frames (Speech2Text), else the mask itself."""
        if source_mask is None or not self.masked_features:
            return source_mask
        lengths = self.model.get_encoder()._get_feat_extract_output_lengths(source_mask.sum(-1))
        positions = torch.arange(self.encoder_len, device=source_mask.device)
        return (positions[None] < lengths[:, None]).to(source_mask.dtype)

    def empty_cache(self) -> list[torch.Tensor]:
        return [torch.zeros(s) for s in self.self_shapes]

    def _probe_shapes(self):
        """Self- and cross-attention cache shapes read from what the layers write; refuses a
        model whose decoder layers do not write both through transformers' caches."""
        shapes: dict[int, tuple] = {}
        tokens, positions = torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        self_cache = _self_cache([], positions, self.cache_len, self.n_layers, shapes)
        cross = _cross_cache(self.n_layers, None)
        state = _CallState("probe", self_cache, cross, torch.zeros(1, self.encoder_len))
        model, self.model = self.model, cpu_view(self.model)
        try:
            with torch.no_grad():
                self._call(state, tokens, self.sample_source(), encoder_states=None)
        finally:
            self.model = model
        name, n = _name(self.model), self.n_layers
        if sorted(shapes) != list(range(n)) or sorted(cross.recorded) != list(range(n)):
            raise UnsupportedModelError(
                f"{name}: its decoder layers did not write their self- and cross-attention keys through "
                f"transformers' EncoderDecoderCache (self: {sorted(shapes)}, cross: {sorted(cross.recorded)} of {n})"
            )
        self_shapes = [(1, s[1], self.cache_len, s[3]) for i in range(n) for s in shapes[i]]
        cross_shapes = [tuple(t.shape) for i in range(n) for t in cross.recorded[i]]
        return self_shapes, cross_shapes

    def _call(self, state: _CallState, tokens, source, encoder_states):
        """The model's own forward on `tokens` (the decoder's), either from `source`
        (encoder run) or from cached cross keys (`encoder_states` a placeholder)."""
        cache = _encoder_decoder_cache(state.self_cache, state.cross)
        kwargs = {self._cache_arg: cache, "decoder_input_ids": tokens}
        if encoder_states is not None:  # use_cache only where no encoder runs (some encoder stacks refuse it)
            kwargs["encoder_outputs"] = _encoder_output_class()(last_hidden_state=encoder_states)
            kwargs["use_cache"] = True
        elif self.raw_audio:
            kwargs["input_values"] = source[0]
        elif self.masked_features:
            kwargs["input_features"], kwargs["attention_mask"] = source
        elif self.audio:
            kwargs["input_features"] = source[0]
        else:
            kwargs["input_ids"], kwargs["attention_mask"] = source
        with _attention_through_litert(self.model, state), _dense_experts(self.model):
            out = self.model(**kwargs)
        return out.logits

    # -- the two signatures
    def encode(self, *source) -> tuple[torch.Tensor, ...]:
        """source: (input_ids, source_mask) or (input_features,) -> cross keys/values."""
        positions = torch.zeros(1, dtype=torch.int32)
        self_cache = _self_cache(
            [torch.zeros(s[:2] + (1,) + s[3:]) for s in self.self_shapes], positions, 1, self.n_layers
        )
        cross = _cross_cache(self.n_layers, None)
        mask = self.encoder_mask(source[1]) if len(source) > 1 else None
        state = _CallState("encode", self_cache, cross, _source_bias(mask, self.encoder_len, positions.device))
        placeholder = torch.zeros(1, 1, dtype=torch.int32)
        self._call(state, placeholder, source, encoder_states=None)
        self._check_attended(state, "encode")
        return tuple(t for i in range(self.n_layers) for t in cross.recorded[i])

    def decode(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        """-> (logits of the last token (1, 1, vocab), *updated self cache)."""
        self_cache = _self_cache(kv_cache, input_pos, self.cache_len, self.n_layers)
        cross = _cross_cache(self.n_layers, list(cross_kv))
        bias = _source_bias(self.encoder_mask(source_mask), self.encoder_len, tokens.device)
        state = _CallState("decode", self_cache, cross, bias)
        d_model = getattr(self.model.config, "d_model", None) or self.model.config.hidden_size
        # transformers runs cross-attention only when given encoder states; their keys come from the cache
        placeholder = torch.zeros((), device=tokens.device).expand(1, self.cross_shapes[0][2], d_model)
        logits = self._call(state, tokens, None, encoder_states=placeholder)
        self._check_attended(state, "decode")
        return (logits[:, -1:], *self_cache.tensors)

    def _check_attended(self, state: _CallState, phase: str):
        if phase == "encode" and not state.attended["encoder"]:
            raise UnsupportedModelError(
                f"{_name(self.model)}: its encoder computes attention itself (not through transformers' "
                "AttentionInterface), so the source padding mask cannot be applied; its attention would need to "
                "go through AttentionInterface (as BART's does)"
            )
        for kind in ("self", "cross"):
            missing = sorted(set(range(self.n_layers)) - state.attended[kind])
            if missing:
                raise UnsupportedModelError(
                    f"{_name(self.model)}: decoder layers {missing} compute their {kind}-attention themselves during "
                    f"{phase} (not through transformers' AttentionInterface), so the cache's mask cannot be applied; "
                    "their attention would need to go through AttentionInterface"
                )


class _Encode(nn.Module):
    def __init__(self, lm: CachedSeq2SeqLM):
        super().__init__()
        self.lm = lm


class _EncodeText(_Encode):
    def forward(self, input_ids, source_mask):
        return self.lm.encode(input_ids, source_mask)


class _EncodeAudio(_Encode):
    def forward(self, input_features):
        return self.lm.encode(input_features)


class _EncodeRawAudio(_Encode):
    def forward(self, input_values):
        return self.lm.encode(input_values)


class _EncodeFeatures(_Encode):
    def forward(self, input_features, feature_mask):
        return self.lm.encode(input_features, feature_mask)


class _Decode(nn.Module):
    def __init__(self, lm: CachedSeq2SeqLM):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        return self.lm.decode(tokens, input_pos, kv_cache, cross_kv, source_mask)


def check_supported(model: nn.Module) -> None:
    """Refuse, by name, what the encoder-decoder adapter does not reproduce."""
    redirect_image_to_text(model, "export_seq2seq")
    name = _name(model)
    cfg = getattr(model, "config", None)
    if "pixel_values" in inspect.signature(model.forward).parameters:
        raise UnsupportedModelError(
            f"{name}: an image-to-text model (it takes pixel_values): its source is an image, which needs a "
            "vision-encoder signature (encode_image); export_seq2seq encodes token ids or audio features"
        )
    if cfg is None or not getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name}: a decoder-only model (config.is_encoder_decoder is not set): there is no separate source "
            "to encode once, so there is no cross-attention cache; decoder-only LMs go through export_generative"
        )
    if name in UNSUPPORTED_FAMILIES:
        does, needed = UNSUPPORTED_FAMILIES[name]
        raise UnsupportedModelError(f"{name}: {does}; exporting it would need {needed}")
    moe = _moe_refusal(model)
    if moe is not None:
        raise UnsupportedModelError(moe)
    params = inspect.signature(model.forward).parameters
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    if "input_values" in params and not hasattr(encoder, "_get_feat_extract_output_lengths"):
        raise UnsupportedModelError(
            f"{name}: its encoder reads raw audio (input_values) through a front end whose output length export_seq2seq "
            "cannot compute (no _get_feat_extract_output_lengths); that length fixes the cross-attention cache, so "
            "it would be needed"
        )
    whisper_like = hasattr(cfg, "max_source_positions") and hasattr(cfg, "num_mel_bins")
    feature_mask = hasattr(encoder, "_get_feat_extract_output_lengths")
    if "input_features" in params and not (whisper_like or feature_mask):
        raise UnsupportedModelError(
            f"{name}: its encoder takes audio features of any length (a strided convolution subsamples them and "
            "padding is masked by the feature mask); export_seq2seq's encode takes Whisper's fixed "
            "2 * max_source_positions frames, so a feature length chosen at export with the feature mask "
            "subsampled like the convolution would be needed"
        )
    if not hasattr(model, "get_encoder"):
        raise UnsupportedModelError(
            f"{name}: it has no separate encoder (get_encoder), so there is no source to encode once and "
            "cache; a conditional-generation head over an encoder would be needed"
        )
    for attr in ("attention_window", "local_radius"):
        if getattr(cfg, attr, None):
            raise UnsupportedModelError(
                f"{name}: its encoder attends locally (config.{attr}={getattr(cfg, attr)!r}: each token sees a band "
                "of neighbours); exporting it would need a banded source mask in seq2seq_attention"
            )
    if getattr(cfg, "attention_type", None) == "block_sparse":
        raise UnsupportedModelError(
            f"{name}: its encoder uses block-sparse attention (random, window and global blocks, "
            "config.attention_type='block_sparse'); config.attention_type='original_full' exports, block-sparse "
            "would need its block layout as a source mask"
        )


# ---- verification, export ------------------------------------------------------------------


def _feature_source(features, source_len: int, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (frames, dims) padded with zeros to `source_len` frames, and their mask
    (1 on real frames; `mask` (frames,): the feature extractor's, whose padded frames the
    convolutions still read): what Speech2Text's feature extractor gives with padding."""
    x = torch.as_tensor(np.asarray(features.detach().cpu() if isinstance(features, torch.Tensor) else features))
    x = torch.as_tensor(one_example(x.float().numpy(), 2, "input_features"))
    if not 1 <= x.shape[0] <= source_len:
        raise ValueError(
            f"the source has {x.shape[0]} feature frames; the model was exported for 1 to {source_len}: convert with "
            "source_len= (or a sample) of the longest source"
        )
    given = torch.ones(x.shape[0], dtype=torch.int32) if mask is None else torch.as_tensor(np.asarray(mask)).int()
    if given.shape != (x.shape[0],):
        raise ValueError(f"the feature mask has shape {tuple(given.shape)}; the features have {x.shape[0]} frames")
    padded = torch.zeros(1, source_len, x.shape[1])
    padded_mask = torch.zeros(1, source_len, dtype=torch.int32)
    padded[0, : x.shape[0]], padded_mask[0, : x.shape[0]] = x, given
    return padded, padded_mask


def _text_source(ids, source_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.as_tensor(one_sequence(ids, "the source"))
    if ids.numel() > source_len:
        raise ValueError(
            f"the source has {ids.numel()} tokens; the model was exported for at most {source_len}: convert with "
            "source_len= (or a sample) of the longest source"
        )
    padded = torch.zeros(1, source_len, dtype=torch.int32)
    mask = torch.zeros(1, source_len, dtype=torch.int32)
    padded[0, : ids.numel()], mask[0, : ids.numel()] = ids, 1
    return padded, mask


@torch.no_grad()
def verify_seq2seq(
    model: nn.Module, cache_len: int, source_len: int | None = None, steps: int = 24, tolerance: float = 1e-4
) -> float:
    """Encode a random source (a text source shorter than `source_len`, so padding is
    exercised) and decode `steps` tokens through the explicit caches in PyTorch, against the
    model's own forward on the unpadded source and the whole decoder sequence: max relative
    error of the logits at every step (raises UnsupportedModelError above `tolerance`)."""
    from runtimes.litert import max_relative_error

    model = cpu_view(model)
    lm = model if isinstance(model, CachedSeq2SeqLM) else CachedSeq2SeqLM(model, cache_len, source_len)
    model = lm.model
    gen = torch.Generator().manual_seed(0)
    total = min(steps, lm.cache_len)
    vocab = getattr(model.config, "decoder_vocab_size", None) or model.config.vocab_size
    decoder_ids = torch.randint(0, vocab, (1, total), generator=gen)
    if lm.raw_audio:
        source = (torch.randn(lm.source_shape, generator=gen),)
        expected = model(input_values=source[0], decoder_input_ids=decoder_ids).logits
    elif lm.masked_features:  # 3/4 of the frames real, the rest padding (what the feature extractor gives)
        n = max(1, lm.source_len - max(1, lm.source_len // 4))
        source = _feature_source(torch.randn(n, lm.source_shape[2], generator=gen), lm.source_len)
        expected = model(input_features=source[0], attention_mask=source[1], decoder_input_ids=decoder_ids).logits
    elif lm.audio:
        features = torch.randn(lm.source_shape, generator=gen)
        expected = model(input_features=features, decoder_input_ids=decoder_ids).logits
        source = (features,)
    else:
        n = max(1, lm.source_len - max(1, lm.source_len // 4))
        ids = torch.randint(0, vocab, (n,), generator=gen)
        expected = model(input_ids=ids[None].long(), decoder_input_ids=decoder_ids).logits
        source = _text_source(ids, lm.source_len)
    cross = lm.encode(*source)
    cache, got = lm.empty_cache(), []
    mask = source[1:]
    for pos in range(total):
        tokens = decoder_ids[:, pos : pos + 1].int()
        logits, *cache = lm.decode(tokens, torch.tensor([pos], dtype=torch.int32), cache, list(cross), *mask)
        got.append(logits)
    error = max_relative_error(torch.cat(got, dim=1).numpy(), expected.float().numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{_name(model)}: the cached encoder-decoder's logits differ from the model's own forward by "
            f"{error:.3g} (max relative, over {total} decoder steps); refusing to export a different model"
        )
    return error


def export_seq2seq(
    model: nn.Module,
    *,
    source_len: int | None = None,
    cache_len: int = 64,
    verify: bool = True,
    **convert_options,
) -> EdgeModel:
    """Convert a transformers encoder-decoder into a LiteRT model with `encode` and
    `decode` signatures sharing its weights (see the module docstring). `source_len`: the
    padded source length of a text model (Whisper: fixed by its config, leave None);
    `cache_len`: the most decoder tokens (prompt + generated). `verify`: check the cached
    model against the model's own forward in PyTorch first (refuses on a difference).
    `convert_options` go to `convert` (quant_config, progress...)."""
    model = cpu_view(model)
    lm = CachedSeq2SeqLM(model, cache_len, source_len)
    if verify:
        verify_seq2seq(lm, cache_len, source_len, steps=min(24, cache_len))
    n = 2 * lm.n_layers
    cross_names = [f"cross_kv_{i}" for i in range(n)]
    cache_names = [f"kv_cache_{i}" for i in range(n)]
    if lm.raw_audio:
        encoder = _EncodeRawAudio(lm)
    elif lm.masked_features:
        encoder = _EncodeFeatures(lm)
    else:
        encoder = _EncodeAudio(lm) if lm.audio else _EncodeText(lm)
    builder = signature("encode", encoder, lm.sample_source(), output_names=cross_names)
    cross = [torch.zeros(s) for s in lm.cross_shapes]
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), lm.empty_cache(), cross)
    decode_args += tuple(torch.ones_like(mask) for mask in lm.sample_source()[1:])  # the source mask, if any
    builder = builder.signature("decode", _Decode(lm), decode_args, output_names=["logits"] + cache_names)
    with torch.no_grad():  # the model's own no_grad regions (NLLB's positions) then trace flat, not as nested graphs
        return builder.convert(**convert_options)


# ---- generation -------------------------------------------------------------------------


def _features(features, shape) -> np.ndarray:
    x = features.detach().cpu().numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
    x = x.astype(np.float32)
    if x.ndim == len(shape) - 1:
        x = x[None]
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"input_features must have shape {tuple(shape[1:])} (mel bins, frames), got {x.shape}")
    return x


def _samples(audio, length: int | None) -> np.ndarray:
    """Raw audio as float32 (1, samples); exactly `length` samples when given."""
    x = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio)
    x = one_example(x.astype(np.float32), 1, "input_values")[None]
    if length is not None and x.shape[1] != length:
        raise ValueError(
            f"the model was exported for exactly {length} audio samples, got {x.shape[1]}: pad or trim the clip to "
            "that length (Moonshine's group norm spans the whole clip, so padding changes every frame)"
        )
    return x


def _decoder_prompt(decoder_prompt) -> list[int]:
    if decoder_prompt is None:
        raise ValueError("pass decoder_prompt, e.g. decoder_start_ids(model) (the decoder_start_token_id)")
    return one_sequence(decoder_prompt, "decoder_prompt").tolist()


class Seq2SeqSession:
    """One source in LiteRT: `encode` runs once when made; `step(token)` runs `decode` on
    the next decoder token (positions 0, 1, ...) and returns its logits row."""

    def __init__(self, edge_model: EdgeModel, source, source_mask=None):
        self.runtime = runtime = edge_model.runtime
        encode = runtime.signature("encode")  # a KeyError naming the model's signatures otherwise
        decode = runtime.signature("decode")
        if encode.input_names == ["input_values"]:
            source_inputs, self.mask = [_samples(source, encode.inputs[0].shape[1])], []
        elif encode.input_names == ["input_features", "feature_mask"]:
            features, feature_mask = _feature_source(source, encode.inputs[0].shape[1], source_mask)
            source_inputs, self.mask = [features.numpy(), feature_mask.numpy()], [feature_mask.numpy()]
        elif encode.input_names[0] == "input_features":
            source_inputs, self.mask = [_features(source, encode.inputs[0].shape)], []
        else:
            ids, source_mask = _text_source(source, encode.inputs[0].shape[1])
            source_inputs, self.mask = [ids.numpy(), source_mask.numpy()], [source_mask.numpy()]
        caches = [spec for spec in decode.inputs if spec.name.startswith("kv_cache")]
        self.cache_len = caches[0].shape[2]
        self.cache = [np.zeros(spec.shape, spec.dtype) for spec in caches]
        self.vocab = decode.outputs[0].shape[-1]
        self.cross = runtime.run(source_inputs, "encode")
        self.position = 0

    def step(self, token: int) -> np.ndarray:
        if not 0 <= int(token) < self.vocab:
            raise ValueError(f"decoder token {token} is outside the vocabulary [0, {self.vocab})")
        positions = np.array([self.position], np.int32)
        check_positions(positions, self.cache_len)
        inputs = [np.array([[token]], np.int32), positions, *self.cache, *self.cross, *self.mask]
        logits, *self.cache = self.runtime.run(inputs, "decode")
        self.position += 1
        return logits[0, -1]

    def fork(self) -> "Seq2SeqSession":
        """A session continuing from this one's state (the cross cache is shared, the self
        cache is not: each call returns new arrays)."""
        other = object.__new__(Seq2SeqSession)
        other.__dict__.update(self.__dict__)
        other.cache = list(self.cache)
        return other


def score_seq2seq(edge_model: EdgeModel, source, decoder_ids) -> np.ndarray:
    """Logits (T, vocab) of every position of `decoder_ids` (teacher forcing), in LiteRT."""
    session = Seq2SeqSession(edge_model, source)
    return np.stack([session.step(t) for t in _decoder_prompt(decoder_ids)])


def generate_seq2seq(
    edge_model: EdgeModel,
    source,
    max_new_tokens: int,
    *,
    decoder_prompt,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
    sampler=None,
    source_mask=None,
):
    """Generate with a model from `export_seq2seq`, in LiteRT: `encode` once, then `decode`
    once per decoder prompt token and per new token. `source`: token ids (1-D, at most the
    exported source length) or, for Whisper, log-mel features (n_mels, frames); Speech2Text's
    features (frames, dims) with `source_mask` (frames,), the feature extractor's mask, when
    they hold padded frames.
    `decoder_prompt`: the decoder's first tokens (`decoder_start_ids(model)`, or Whisper's
    start/language/task tokens). Greedy unless `temperature` > 0 (then `top_k`, `top_p`,
    `seed` as for `generate`). Returns the new token ids (up to `max_new_tokens`, ending
    after a stop token); with `return_logits`, also the logits row of every new token."""
    session = Seq2SeqSession(edge_model, source, source_mask)
    sampler = sampler or _sampler(temperature, top_k, top_p, seed)
    return generate_in_session(
        session, _decoder_prompt(decoder_prompt), max_new_tokens, sampler, stop_tokens, return_logits
    )


def generate_in_session(
    session: Seq2SeqSession,
    prompt: list[int],
    max_new_tokens: int,
    sampler: Sampler,
    stop_tokens=(),
    return_logits: bool = False,
):
    """The decoder loop of `generate_seq2seq` on a session whose source is encoded."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if len(prompt) + max_new_tokens > session.cache_len:
        raise ValueError(
            f"decoder_prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the exported "
            f"cache length ({session.cache_len}); export with a larger cache_len"
        )
    out, rows = [], []
    if max_new_tokens:
        for token in prompt[:-1]:
            session.step(token)
        stop, rng, token = {int(t) for t in stop_tokens}, sampler.rng(), prompt[-1]
        for _ in range(max_new_tokens):
            rows.append(session.step(token))
            token = sampler(rows[-1], rng)
            out.append(token)
            if token in stop:
                break
    return (out, rows) if return_logits else out


def beam_search_seq2seq(
    edge_model: EdgeModel, source, max_new_tokens: int, *, decoder_prompt, num_beams: int = 4
) -> list[int]:
    """Beam search in LiteRT: at each step every beam is extended by every token (one
    `decode` call per beam), and the `num_beams` sequences of highest total log
    probability (float32 log-softmax, as transformers computes it) are kept; returns the
    best one's `max_new_tokens` new tokens. No stop tokens: every hypothesis has the same
    length, so this is transformers' `generate(num_beams=..., do_sample=False)` with no
    EOS token (its length penalty cannot change the order)."""
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt = _decoder_prompt(decoder_prompt)
    session = Seq2SeqSession(edge_model, source)
    if len(prompt) + max_new_tokens > session.cache_len:
        raise ValueError(
            f"decoder_prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the exported "
            f"cache length ({session.cache_len}); export with a larger cache_len"
        )
    for token in prompt[:-1]:
        session.step(token)
    beams = [(torch.zeros(()), [prompt[-1]], session)]  # (total log probability, tokens, session)
    for _ in range(max_new_tokens):
        children = [s.fork() for _, _, s in beams]
        rows = [torch.from_numpy(child.step(tokens[-1])) for child, (_, tokens, _) in zip(children, beams)]
        totals = torch.stack([torch.log_softmax(r.float(), -1) + score for r, (score, _, _) in zip(rows, beams)])
        best = torch.topk(totals.reshape(-1), min(num_beams, totals.numel())).indices.tolist()
        vocab = totals.shape[1]
        beams = [(totals.reshape(-1)[i], beams[i // vocab][1] + [i % vocab], children[i // vocab]) for i in best]
    return beams[0][1][1:]


@torch.no_grad()
def reference_generate_seq2seq(
    model: nn.Module,
    source,
    max_new_tokens: int,
    *,
    decoder_prompt,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
    source_len: int | None = None,
):
    """The same generation in PyTorch with the model's own forward and no decoder cache
    (the unpadded source, encoded once as transformers' `generate` does, and the whole
    decoder sequence every step): the reference that `generate_seq2seq` must match token
    for token. `source_len`: Speech2Text's exported frame count; its features (frames,
    dims) are then padded to it and masked, as the LiteRT session does."""
    sampler: Sampler = _sampler(temperature, top_k, top_p, seed)
    device = next(model.parameters()).device
    ids = torch.tensor([_decoder_prompt(decoder_prompt)], device=device)
    source = source.detach().cpu() if isinstance(source, torch.Tensor) else source
    source_kwargs = {}
    if _is_raw_audio(model):
        encoded = model.get_encoder()(input_values=torch.as_tensor(_samples(source, None)).to(device))
    elif _is_audio(model) and source_len is not None:
        features, mask = _feature_source(source, source_len)
        encoded = model.get_encoder()(input_features=features.to(device), attention_mask=mask.to(device))
        source_kwargs = {"attention_mask": mask.to(device)}
    elif _is_audio(model):
        features = torch.as_tensor(_features(source, (1, *np.asarray(source).shape[-2:])))
        encoded = model.get_encoder()(input_features=features.to(device))
    else:
        source_ids = torch.as_tensor(np.asarray(source).reshape(1, -1), dtype=torch.long)
        encoded = model.get_encoder()(input_ids=source_ids.to(device))
    source_kwargs["encoder_outputs"] = encoded
    stop = {int(t) for t in stop_tokens}
    rng = sampler.rng()
    out, rows = [], []
    for _ in range(max_new_tokens):
        logits = model(**source_kwargs, decoder_input_ids=ids).logits[0, -1].float().cpu().numpy()
        rows.append(logits)
        out.append(sampler(logits, rng))
        if out[-1] in stop:
            break
        ids = torch.cat([ids, torch.tensor([[out[-1]]], device=device)], dim=1)
    return (out, rows) if return_logits else out
