"""Encoder-decoder (seq2seq) models with an explicit KV cache, exact or refused: T5,
BART, mBART, Marian, Whisper (any transformers model whose layers go through
transformers' `Cache` and `AttentionInterface`).

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
      -> cross_kv_0 ... cross_kv_{2L-1}          float32[1, heads, S, head_dim]
    decode(tokens int32[1, 1], input_pos int32[1], kv_cache_0 ... kv_cache_{2L-1},
           cross_kv_0 ... cross_kv_{2L-1}[, source_mask int32[1, S]])
      -> (logits float32[1, 1, vocab], kv_cache_0 ... kv_cache_{2L-1})

The source of a text model is padded to a fixed `source_len` (`source_mask` is 1 on real
tokens, 0 on padding, as transformers' `attention_mask`): padded keys are masked in the
encoder's self-attention and in every cross-attention, so the real positions' results
are those of the unpadded source (T5's relative buckets, BART's learned positions and
Marian's sinusoids all count from the first token). Whisper's encoder always takes
`2 * max_source_positions` mel frames, as transformers requires. `encode` computes the
cross-attention keys/values once per source with the model's own projections (a decoder
step on a placeholder token whose other results are dead code the converter removes).

`verify_seq2seq` (on by default in `export_seq2seq`) runs encode and decode steps in
PyTorch on a padded source against the model's own forward on the unpadded source and
refuses the export above 1e-4 (max relative error of the logits at any step).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from converter.pipeline import cpu_view
from litert_torch.edge_model import EdgeModel
from litert_torch.generative.attention import grouped_attention
from litert_torch.generative.generate import Sampler, _sampler
from litert_torch.generative.kv_cache import MASKED_SCORE, check_positions
from litert_torch.generative.transformers_lm import UnsupportedModelError, _LayerPlan, explicit_cache_class
from litert_torch.signatures import signature

ATTENTION_NAME = "litert_seq2seq"

# How attention is written: "sdpa" (scaled_dot_product_attention, which the converter keeps
# whole and lowers to BATCH_MATMUL with adjY, reading the keys as they are, plus a 3-op
# guard for rows without a key) or "matmul" (`grouped_attention`, whose k^T is a TRANSPOSE
# of the keys at every call: 1500 cross keys per Whisper layer per step). Thread CPU time
# per decode step, sdpa / matmul, three interleaved runs of
# `benchmarks/seq2seq_bench.py --attention-ab`: Whisper-tiny shape 0.80-0.92x, T5-small
# shape (64 keys) 0.85-1.10x (noise); identical logits. Read at export time.
ATTENTION_FORM = "sdpa"

# Attention-function arguments that change the math and have no implementation here.
REFUSED_ATTENTION_ARGUMENTS = {"sliding_window": "sliding windows", "softcap": "soft-capping", "sinks": "sinks"}

# Encoder-decoder families whose attention is not plain softmax attention over the whole
# source, with what is missing.
UNSUPPORTED_FAMILIES = {
    "LEDForConditionalGeneration": "Longformer's local + global attention in the encoder",
    "LongT5ForConditionalGeneration": "local / transient-global attention in the encoder",
    "SwitchTransformersForConditionalGeneration": (
        "mixture-of-experts routing whose forward needs the encoder's router logits next to cached encoder states"
    ),
    "ProphetNetForConditionalGeneration": "n-gram stream self-attention in the decoder",
    "XLMProphetNetForConditionalGeneration": "n-gram stream self-attention in the decoder",
}


def _name(model: nn.Module) -> str:
    return type(model).__name__


def _is_audio(model: nn.Module) -> bool:
    return "input_features" in inspect.signature(model.forward).parameters


def decoder_layers(model: nn.Module) -> int:
    """The number of decoder layers, from every spelling transformers configs use."""
    cfg = model.config
    for name in ("decoder_layers", "num_decoder_layers", "decoder_num_hidden_layers", "num_layers"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise UnsupportedModelError(f"{_name(model)}: its config names no decoder layer count")


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
        if self.audio:
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
        if self.audio:
            return (torch.zeros(self.source_shape),)
        return torch.zeros(self.source_shape, dtype=torch.int32), torch.ones(self.source_shape, dtype=torch.int32)

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
        from transformers.modeling_outputs import BaseModelOutput

        cache = _encoder_decoder_cache(state.self_cache, state.cross)
        kwargs = {self._cache_arg: cache, "decoder_input_ids": tokens}
        if encoder_states is not None:  # use_cache only where no encoder runs (some encoder stacks refuse it)
            kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoder_states)
            kwargs["use_cache"] = True
        elif self.audio:
            kwargs["input_features"] = source[0]
        else:
            kwargs["input_ids"], kwargs["attention_mask"] = source
        with _attention_through_litert(self.model, state):
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
        mask = None if self.audio else source[1]
        state = _CallState("encode", self_cache, cross, _source_bias(mask, self.encoder_len, positions.device))
        placeholder = torch.zeros(1, 1, dtype=torch.int32)
        self._call(state, placeholder, source, encoder_states=None)
        self._check_attended(state, "encode")
        return tuple(t for i in range(self.n_layers) for t in cross.recorded[i])

    def decode(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        """-> (logits of the last token (1, 1, vocab), *updated self cache)."""
        self_cache = _self_cache(kv_cache, input_pos, self.cache_len, self.n_layers)
        cross = _cross_cache(self.n_layers, list(cross_kv))
        state = _CallState("decode", self_cache, cross, _source_bias(source_mask, self.encoder_len, tokens.device))
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
                "AttentionInterface), so the source padding mask cannot be applied"
            )
        for kind in ("self", "cross"):
            missing = sorted(set(range(self.n_layers)) - state.attended[kind])
            if missing:
                raise UnsupportedModelError(
                    f"{_name(self.model)}: decoder layers {missing} did not run their {kind}-attention through "
                    f"transformers' AttentionInterface during {phase} (they compute attention themselves)"
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


class _Decode(nn.Module):
    def __init__(self, lm: CachedSeq2SeqLM):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        return self.lm.decode(tokens, input_pos, kv_cache, cross_kv, source_mask)


def check_supported(model: nn.Module) -> None:
    """Refuse, by name, what the encoder-decoder adapter does not reproduce."""
    from litert_torch.generative.image_to_text import redirect_image_to_text

    redirect_image_to_text(model, "export_seq2seq")
    name = _name(model)
    cfg = getattr(model, "config", None)
    if cfg is None or not getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name}: not a transformers encoder-decoder (config.is_encoder_decoder is not set); "
            "decoder-only LMs go through export_generative"
        )
    if name in UNSUPPORTED_FAMILIES:
        raise UnsupportedModelError(f"{name}: {UNSUPPORTED_FAMILIES[name]} is not supported")
    params = inspect.signature(model.forward).parameters
    if "input_values" in params:
        raise UnsupportedModelError(
            f"{name}: raw-audio input (input_values) is not supported; Whisper-style log-mel is"
        )
    if "input_features" in params and not (hasattr(cfg, "max_source_positions") and hasattr(cfg, "num_mel_bins")):
        raise UnsupportedModelError(
            f"{name}: audio features of a variable length are not supported; only Whisper's fixed "
            "2 * max_source_positions log-mel frames are"
        )
    if not hasattr(model, "get_encoder"):
        raise UnsupportedModelError(f"{name}: has no encoder (get_encoder); not a conditional-generation model")
    for attr in ("attention_window", "local_radius"):
        if getattr(cfg, attr, None):
            raise UnsupportedModelError(
                f"{name}: config.{attr}={getattr(cfg, attr)!r} (local attention) is not supported"
            )
    if getattr(cfg, "attention_type", None) == "block_sparse":
        raise UnsupportedModelError(f"{name}: config.attention_type='block_sparse' is not supported")


# ---- verification, export ------------------------------------------------------------------


def _text_source(ids, source_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.as_tensor(np.asarray(ids).reshape(-1), dtype=torch.int32)
    if ids.numel() == 0:
        raise ValueError("the source is empty: pass at least one token id")
    if int(ids.min()) < 0:
        raise ValueError(f"the source has a negative token id ({int(ids.min())})")
    if ids.numel() > source_len:
        raise ValueError(f"the source has {ids.numel()} tokens; the model was exported for at most {source_len}")
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
    if lm.audio:
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
    mask = () if lm.audio else (source[1],)
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
    encoder = _EncodeAudio(lm) if lm.audio else _EncodeText(lm)
    builder = signature("encode", encoder, lm.sample_source(), output_names=cross_names)
    cross = [torch.zeros(s) for s in lm.cross_shapes]
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), lm.empty_cache(), cross)
    if not lm.audio:
        decode_args += (torch.ones(lm.source_shape, dtype=torch.int32),)
    builder = builder.signature("decode", _Decode(lm), decode_args, output_names=["logits"] + cache_names)
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


def _decoder_prompt(decoder_prompt) -> list[int]:
    if decoder_prompt is None:
        raise ValueError("pass decoder_prompt, e.g. decoder_start_ids(model) (the decoder_start_token_id)")
    prompt = [int(t) for t in np.asarray(decoder_prompt).reshape(-1)]
    if not prompt:
        raise ValueError("decoder_prompt is empty: pass at least the decoder start token")
    return prompt


class Seq2SeqSession:
    """One source in LiteRT: `encode` runs once when made; `step(token)` runs `decode` on
    the next decoder token (positions 0, 1, ...) and returns its logits row."""

    def __init__(self, edge_model: EdgeModel, source):
        self.runtime = runtime = edge_model.runtime
        encode = runtime.signature("encode")  # a KeyError naming the model's signatures otherwise
        decode = runtime.signature("decode")
        if encode.input_names[0] == "input_features":
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
):
    """Generate with a model from `export_seq2seq`, in LiteRT: `encode` once, then `decode`
    once per decoder prompt token and per new token. `source`: token ids (1-D, at most the
    exported source length) or, for Whisper, log-mel features (n_mels, frames).
    `decoder_prompt`: the decoder's first tokens (`decoder_start_ids(model)`, or Whisper's
    start/language/task tokens). Greedy unless `temperature` > 0 (then `top_k`, `top_p`,
    `seed` as for `generate`). Returns the new token ids (up to `max_new_tokens`, ending
    after a stop token); with `return_logits`, also the logits row of every new token."""
    session = Seq2SeqSession(edge_model, source)
    sampler = _sampler(temperature, top_k, top_p, seed)
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
):
    """The same generation in PyTorch with the model's own forward and no decoder cache
    (the unpadded source, encoded once as transformers' `generate` does, and the whole
    decoder sequence every step): the reference that `generate_seq2seq` must match token
    for token."""
    sampler: Sampler = _sampler(temperature, top_k, top_p, seed)
    device = next(model.parameters()).device
    ids = torch.tensor([_decoder_prompt(decoder_prompt)], device=device)
    source = source.detach().cpu() if isinstance(source, torch.Tensor) else source
    if _is_audio(model):
        features = torch.as_tensor(_features(source, (1, *np.asarray(source).shape[-2:])))
        encoded = model.get_encoder()(input_features=features.to(device))
    else:
        source_ids = torch.as_tensor(np.asarray(source).reshape(1, -1), dtype=torch.long)
        encoded = model.get_encoder()(input_ids=source_ids.to(device))
    source_kwargs = {"encoder_outputs": encoded}
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
