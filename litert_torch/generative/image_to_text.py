"""Image-to-text models (an image encoder, a text decoder reading it) with an explicit
KV cache, exact or refused: transformers' `VisionEncoderDecoderModel` (ViT / DeiT / BEiT /
Swin encoders with GPT-2, BERT, RoBERTa, TrOCR or mBART decoders: TrOCR, Donut), BLIP
captioning, GIT and Florence-2.

    edge = export_image_to_text(model, cache_len=32)     # encode_image + decode signatures
    new_ids = generate_image_to_text(edge, pixel_values, 20, decoder_prompt=image_to_text_prompt(model))

These are encoder-decoders whose source is an image, so they reuse the machinery of
`seq2seq` (the model's own forward, the explicit self-attention cache, the cross cache
recorded by `encode` and reused by `decode`, `seq2seq_attention`), not `export_vlm`'s:
a VLM's decoder reads image embeddings as prompt tokens in `prefill`, these read them
through cross-attention at every step. Signatures (one file, shared weights):

    encode_image(pixel_values float32[1, 3, H, W][, input_ids int32[1, P], source_mask int32[1, P]])
      -> cross_kv_0 ... cross_kv_{2L-1}          float32[1, heads, image_tokens (+ P), head_dim]
    decode(tokens int32[1, 1], input_pos int32[1], kv_cache_0 ... kv_cache_{2L-1},
           cross_kv_0 ... cross_kv_{2L-1}[, source_mask int32[1, P]])
      -> (logits float32[1, 1, vocab], kv_cache_0 ... kv_cache_{2L-1})

`encode_image` is the vision encoder, the encoder-to-decoder projection where the model
has one, and every decoder layer's cross-attention key/value projections: computed once
per image. No mask is needed: every image token is real. Florence-2's BART encoder reads
the image tokens and the task prompt (padded to `prompt_len`, `source_mask` 1 on real
tokens) together, so its `encode_image` and `decode` take the prompt's mask too. GIT has
no cross-attention: its image tokens lead one causal stream but attend only to each
other, so their keys/values in every layer are the per-image cache (`CachedGit`).

Decoders that compute attention themselves (TrOCR's and BLIP's, not through transformers'
`AttentionInterface`) run with their attention module's forward swapped for one that
projects as theirs does and then calls `seq2seq_attention`; position lookups whose
length depends on the position input get a static-shape forward (`_OWN_FORWARDS`).

`verify_image_to_text` (on by default in `export_image_to_text`) runs `encode_image` and
`decode` steps in PyTorch against the model's own forward on the whole decoder sequence
and refuses the export above 1e-4 (max relative error of the logits at any step).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from converter.pipeline import cpu_view
from litert_torch.edge_model import EdgeModel
from litert_torch.generative.errors import UnsupportedModelError
from litert_torch.generative.generate import _sampler
from litert_torch.generative.image_families import FAMILIES, REFUSED, redirect_image_to_text  # noqa: F401
from litert_torch.generative.seq2seq import (
    CachedSeq2SeqLM,
    Seq2SeqSession,
    _CallState,
    _cross_cache,
    _Decode,
    _decoder_prompt,
    _self_cache,
    _source_bias,
    _text_source,
    generate_in_session,
)
from litert_torch.signatures import signature

TOLERANCE = 1e-4


def _name(model: nn.Module) -> str:
    return type(model).__name__


def _decoder(model: nn.Module) -> nn.Module:
    """The module holding the text decoder's config (GIT: the whole model)."""
    name = _name(model)
    if name == "BlipForConditionalGeneration":
        return model.text_decoder
    if name == "Florence2ForConditionalGeneration":  # BART: its encoder reads the image tokens and the prompt
        return model.model.language_model
    return model if name == "GitForCausalLM" else model.decoder


def _layer_count(decoder_config) -> int:
    for key in ("decoder_layers", "num_decoder_layers", "n_layer", "num_hidden_layers"):
        if getattr(decoder_config, key, None):
            return int(getattr(decoder_config, key))
    raise UnsupportedModelError(f"{type(decoder_config).__name__}: no decoder layer count in the decoder's config")


def check_image_to_text(model: nn.Module) -> None:
    """Refuse, by name and reason, what the image-to-text adapter does not reproduce."""
    name = _name(model)
    if name in REFUSED:
        raise UnsupportedModelError(f"{name}: {REFUSED[name]}")
    if name not in FAMILIES:
        raise UnsupportedModelError(
            f"{name}: not an image-to-text model (supported: {', '.join(FAMILIES)}); text encoder-decoders go "
            "through export_seq2seq, vision-language models that read image embeddings as prompt tokens through "
            "export_vlm"
        )


def image_to_text_prompt(model: nn.Module) -> list[int]:
    """The decoder prompt transformers' `generate` starts from for a bare image: the
    `decoder_start_token_id` (VisionEncoderDecoderModel) or BLIP's `[bos]`."""
    if _name(model) == "BlipForConditionalGeneration":
        return [int(model.decoder_input_ids)]
    if _name(model) == "GitForCausalLM":
        return [int(model.config.bos_token_id)]
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None and _name(model) == "Florence2ForConditionalGeneration":
        start = model.config.text_config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{_name(model)}: config.decoder_start_token_id is not set; pass decoder_prompt=[...]")
    return [int(start)]


class CachedImageToText(CachedSeq2SeqLM):
    """An image-to-text model as two forwards, `encode` (pixel values -> cross cache) and
    `decode` (see the module docstring). `cache_len`: decoder tokens."""

    def __init__(self, model: nn.Module, cache_len: int, image_size=None, prompt_len: int | None = None):
        nn.Module.__init__(self)
        check_image_to_text(model)
        self.model, self.cache_len, self.audio = model, int(cache_len), False
        if self.cache_len < 1:
            raise ValueError(f"cache_len must be positive, got {cache_len}")
        decoder_config = _decoder(model).config
        limit = getattr(decoder_config, "max_position_embeddings", None) or getattr(decoder_config, "n_positions", None)
        if limit is not None and self.cache_len > limit:
            raise ValueError(f"cache_len ({cache_len}) exceeds the decoder's position table ({limit} positions)")
        self.source_shape = self.image_shape(model, image_size)
        self.prompted = _name(model) == "Florence2ForConditionalGeneration"
        self.prompt_len = self.image_tokens = 0
        if self.prompted:  # the encoder's input: the image tokens, then the (padded) task prompt
            if prompt_len is None or int(prompt_len) < 1:
                raise ValueError(f"{_name(model)}: pass prompt_len, the padded length of the task prompt")
            self.prompt_len = int(prompt_len)
            with torch.no_grad():
                self.image_tokens = model.model.get_image_features(torch.zeros(self.source_shape)).pooler_output.shape[
                    1
                ]
            self.encoder_width = decoder_config.d_model
        else:
            vision = model.config.encoder if hasattr(model.config, "encoder") else model.config.vision_config
            self.encoder_width = vision.hidden_size
        self.n_layers = _layer_count(decoder_config)
        self._cache_arg = "cache"
        self.encoder_len = 1  # the probe's placeholder; the cross cache's shape says the real one
        self.self_shapes, self.cross_shapes = self._probe_shapes()
        self.encoder_len = self.cross_shapes[0][2]

    @staticmethod
    def image_shape(model: nn.Module, image_size=None) -> tuple[int, int, int, int]:
        """(1, channels, height, width): `image_size` (an int or (height, width)), else the
        vision encoder config's image size (a convolutional tower without one needs it)."""
        vision = model.config.encoder if hasattr(model.config, "encoder") else model.config.vision_config
        size = image_size if image_size is not None else getattr(vision, "image_size", None)
        if size is None:
            raise ValueError(f"{_name(model)}: its vision config has no image size; pass image_size=(height, width)")
        size = tuple(size) if isinstance(size, (list, tuple)) else (int(size),) * 2
        return (1, getattr(vision, "num_channels", None) or getattr(vision, "in_channels", 3), *size)

    def sample_source(self) -> tuple[torch.Tensor, ...]:
        if self.prompted:
            prompt = torch.zeros(1, self.prompt_len, dtype=torch.int32)
            return torch.zeros(self.source_shape), prompt, torch.ones_like(prompt)
        return (torch.zeros(self.source_shape),)

    def _encoder_bias(self, prompt_mask) -> torch.Tensor | None:
        """The additive mask over the encoder's tokens: none for an image alone; for
        Florence-2, the image tokens (all real) then the prompt's padding mask."""
        if not self.prompted:
            return None
        image = torch.ones(1, self.image_tokens, dtype=prompt_mask.dtype, device=prompt_mask.device)
        return _source_bias(torch.cat([image, prompt_mask], 1), self.encoder_len, prompt_mask.device)

    def _call(self, state: _CallState, tokens, source, encoder_states):
        """The model's own forward on decoder `tokens`, from `source` (the pixel values) or,
        when `encoder_states` (a placeholder) is given, from the cached cross keys."""
        from transformers.modeling_outputs import BaseModelOutput

        from litert_torch.generative.seq2seq import _attention_through_litert, _encoder_decoder_cache

        cache = _encoder_decoder_cache(state.self_cache, state.cross)
        with _attention_through_litert(_decoder(self.model), state), _own_forwards(_decoder(self.model)):
            if _name(self.model) == "BlipForConditionalGeneration":
                if encoder_states is None:
                    encoder_states = self.model.vision_model(pixel_values=source[0])[0]
                out = self.model.text_decoder(
                    input_ids=tokens, encoder_hidden_states=encoder_states, cache=cache, use_cache=True
                )
            else:
                kwargs = {"cache": cache, "decoder_input_ids": tokens, "use_cache": True}
                if encoder_states is None and self.prompted:  # the processor's layout: image tokens first
                    pixels, prompt, mask = source
                    image = self.model.model.get_image_features(pixels).pooler_output
                    embeds = self.model.get_input_embeddings()(prompt)
                    kwargs["inputs_embeds"] = torch.cat([image.to(embeds.dtype), embeds], 1)
                    kwargs["attention_mask"] = torch.cat(
                        [torch.ones_like(mask[:, :1]).expand(1, image.shape[1]), mask], 1
                    )
                elif encoder_states is None:
                    kwargs["pixel_values"] = source[0]
                else:
                    kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoder_states)
                out = self.model(**kwargs)
        return out.logits

    def encode(self, pixel_values, prompt=None, prompt_mask=None) -> tuple[torch.Tensor, ...]:
        """pixel_values (1, 3, H, W)[, Florence-2's prompt and its mask (1, P)] -> every
        decoder layer's cross keys/values."""
        positions = torch.zeros(1, dtype=torch.int32)
        self_cache = _self_cache(
            [torch.zeros(s[:2] + (1,) + s[3:]) for s in self.self_shapes], positions, 1, self.n_layers
        )
        cross = _cross_cache(self.n_layers, None)
        state = _CallState("encode", self_cache, cross, self._encoder_bias(prompt_mask))
        source = (pixel_values, prompt, prompt_mask) if self.prompted else (pixel_values,)
        self._call(state, torch.zeros(1, 1, dtype=torch.int32), source, encoder_states=None)
        self._check_attended(state, "encode")
        return tuple(t for i in range(self.n_layers) for t in cross.recorded[i])

    def decode(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        """-> (logits of the last token (1, 1, vocab), *updated self cache)."""
        self_cache = _self_cache(kv_cache, input_pos, self.cache_len, self.n_layers)
        cross = _cross_cache(self.n_layers, list(cross_kv))
        bias = self._encoder_bias(source_mask) if self.prompted else _source_bias(None, self.encoder_len, tokens.device)
        state = _CallState("decode", self_cache, cross, bias)
        # the decoder runs cross-attention only when given encoder states; their keys come from the cache
        placeholder = torch.zeros((), device=tokens.device).expand(1, self.encoder_len, self.encoder_width)
        logits = self._call(state, tokens, None, encoder_states=placeholder)
        self._check_attended(state, "decode")
        return (logits[:, -1:], *self_cache.tensors)

    def _check_attended(self, state: _CallState, phase: str):
        if not self.prompted:  # an image has no padding: the encoder needs no mask
            state.attended["encoder"].add(None)
        super()._check_attended(state, phase)


# ---- GIT: image tokens as a prefix of one causal stream --------------------------------


class CachedGit(nn.Module):
    """GIT (`GitForCausalLM`) in the same two signatures. GIT puts the projected image
    tokens in front of the text in one transformer; they attend to each other both ways
    and never to the text, so each layer's image keys/values depend on the image alone:
    `encode` computes them (GIT's own forward on the image and a placeholder token, whose
    keys are dropped) and `decode` attends over [image keys, self cache] with the image
    part unmasked. Text positions are the decoder's own (0, 1, ...), as in GIT's forward."""

    def __init__(self, model: nn.Module, cache_len: int):
        super().__init__()
        self.model, self.cache_len = model, int(cache_len)
        cfg = model.config
        if self.cache_len < 1:
            raise ValueError(f"cache_len must be positive, got {cache_len}")
        if self.cache_len > cfg.max_position_embeddings:
            raise ValueError(
                f"cache_len ({cache_len}) exceeds the decoder's position table ({cfg.max_position_embeddings} positions)"
            )
        if getattr(cfg, "num_image_with_embedding", None):
            raise UnsupportedModelError(
                "GitForCausalLM: video (num_image_with_embedding frames with temporal embeddings) is not supported; "
                "one image per encode_image call is"
            )
        self.source_shape = CachedImageToText.image_shape(model)
        self.n_layers = cfg.num_hidden_layers
        self.image_tokens = model.git.encoder.layer[0].attention.self.image_patch_tokens
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        self.self_shapes = [(1, heads, self.cache_len, head_dim)] * (2 * self.n_layers)
        self.cross_shapes = [(1, heads, self.image_tokens, head_dim)] * (2 * self.n_layers)

    def sample_source(self):
        return (torch.zeros(self.source_shape),)

    def empty_cache(self) -> list[torch.Tensor]:
        return [torch.zeros(s) for s in self.self_shapes]

    def encode(self, pixel_values, prompt=None, prompt_mask=None) -> tuple[torch.Tensor, ...]:
        recorded: dict[int, tuple] = {}
        placeholder = torch.zeros(1, 1, dtype=torch.int32)
        with _git_attention(self.model, ("encode", recorded, self.image_tokens)):
            self.model(input_ids=placeholder, pixel_values=pixel_values, use_cache=False)
        return tuple(t for i in range(self.n_layers) for t in recorded[i])

    def decode(self, tokens, input_pos, kv_cache, cross_kv, source_mask=None):
        self_cache = _self_cache(kv_cache, input_pos, self.cache_len, self.n_layers)
        # positions are given; a length of 0 keeps GIT from widening a padding mask (there is none)
        self_cache.get_seq_length = lambda layer_idx=0: 0
        with _git_attention(self.model, ("decode", self_cache, list(cross_kv))):
            logits = self.model(
                input_ids=tokens, position_ids=input_pos[None].long(), cache=self_cache, use_cache=True
            ).logits
        return (logits[:, -1:], *self_cache.tensors)


def _git_self_attention(self, hidden_states, attention_mask=None, cache=None, **kwargs):
    """GitSelfAttention.forward with the image keys of `encode` (see CachedGit)."""
    import torch.nn.functional as F

    mode = _GIT[-1]
    batch, tokens, _ = hidden_states.shape
    shape = (batch, tokens, -1, self.attention_head_size)
    query, key, value = (proj(hidden_states).view(shape).transpose(1, 2) for proj in (self.query, self.key, self.value))
    scale = self.attention_head_size**-0.5
    if mode[0] == "encode":  # GIT's own mask (image block both ways, then causal)
        _, recorded, image_tokens = mode
        recorded[self.layer_idx] = (key[:, :, :image_tokens], value[:, :, :image_tokens])
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scale)
    else:
        _, self_cache, cross = mode
        key, value = self_cache.update(key, value, self.layer_idx)
        image_k, image_v = cross[2 * self.layer_idx], cross[2 * self.layer_idx + 1]
        mask = self_cache.masks[self.layer_idx]
        bias = torch.cat([torch.zeros(mask.shape[0], image_k.shape[2], dtype=mask.dtype, device=mask.device), mask], 1)
        keys, values = torch.cat([image_k, key], 2), torch.cat([image_v, value], 2)
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=bias, scale=scale)
    return out.transpose(1, 2).reshape(batch, tokens, -1), None


_GIT: list = []


@contextlib.contextmanager
def _git_attention(model: nn.Module, mode: tuple):
    """Run GIT's text transformer with `_git_self_attention` in `mode` ("encode", recorded,
    image tokens) or ("decode", self cache, image keys/values)."""
    swapped = [m for m in model.git.encoder.modules() if type(m).__name__ == "GitSelfAttention"]
    for m in swapped:
        m.forward = _git_self_attention.__get__(m)
    _GIT.append(mode)
    try:
        yield
    finally:
        _GIT.pop()
        for m in swapped:
            del m.forward


# ---- decoders that compute attention themselves ------------------------------------------


def _project_and_attend(module, hidden, kv_states, cache, q_proj, k_proj, v_proj, heads, scaling):
    """q/k/v projections with the cross keys reused from an updated EncoderDecoderCache, as
    transformers' own attention modules do; -> (B, T, H * D) before the output projection."""
    from transformers import EncoderDecoderCache

    from litert_torch.generative.seq2seq import seq2seq_attention

    batch, tokens, _ = hidden.shape
    is_cross = kv_states is not None
    layer = module.layer_idx
    sub = cache
    if isinstance(cache, EncoderDecoderCache):
        sub = cache.cross_attention_cache if is_cross else cache.self_attention_cache
    query = q_proj(hidden).view(batch, tokens, heads, -1).transpose(1, 2)
    if is_cross and isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(layer):
        key, value = sub.layers[layer].keys, sub.layers[layer].values
    else:
        source = kv_states if is_cross else hidden
        key = k_proj(source).view(batch, -1, heads, query.shape[-1]).transpose(1, 2)
        value = v_proj(source).view(batch, -1, heads, query.shape[-1]).transpose(1, 2)
        if sub is not None:
            key, value = sub.update(key, value, layer)
            if is_cross and isinstance(cache, EncoderDecoderCache):
                cache.is_updated[layer] = True
    out, _ = seq2seq_attention(module, query, key, value, None, scaling=scaling)
    return out.reshape(batch, tokens, -1)


def _trocr_forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
    out = _project_and_attend(
        self,
        hidden_states,
        key_value_states,
        cache,
        self.q_proj,
        self.k_proj,
        self.v_proj,
        self.num_heads,
        self.scaling,
    )
    return self.out_proj(out), None


def _blip_text_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, cache=None, **kwargs):
    out = _project_and_attend(
        self,
        hidden_states,
        encoder_hidden_states,
        cache,
        self.query,
        self.key,
        self.value,
        self.num_attention_heads,
        self.attention_head_size**-0.5,
    )
    return out, None


def _trocr_learned_positions(self, input_ids, cache_length=0, position_ids=None):
    """TrOCR's arange(cache_length, cache_length + T) has a data-dependent size when
    cache_length is the position input; arange(T) + cache_length is the same numbers."""
    positions = torch.arange(input_ids.shape[1], device=self.weight.device) + cache_length
    return nn.Embedding.forward(self, positions[None] + self.offset)


def _positions_from_cache_length(self, input_ids=None, *args, cache_length=0, position_ids=None, **kwargs):
    """BERT's and BLIP's `position_ids[:, cache_length : cache_length + T]` slices by the
    position input (a data-dependent slice): the same ids as arange(T) + cache_length."""
    if position_ids is None:
        tokens = (input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[1]
        position_ids = (torch.arange(tokens, device=self.position_ids.device) + cache_length)[None]
    return type(self).forward(self, input_ids, *args, cache_length=cache_length, position_ids=position_ids, **kwargs)


# modules whose forward an export cannot take as it is -> a forward that it can: attention
# computed without transformers' AttentionInterface, positions of a data-dependent length
_OWN_FORWARDS = {
    "TrOCRAttention": _trocr_forward,
    "BlipTextSelfAttention": _blip_text_forward,
    "TrOCRLearnedPositionalEmbedding": _trocr_learned_positions,
    "BertEmbeddings": _positions_from_cache_length,
    "BlipTextEmbeddings": _positions_from_cache_length,
}


@contextlib.contextmanager
def _own_forwards(model: nn.Module):
    swapped = [m for m in model.modules() if type(m).__name__ in _OWN_FORWARDS]
    for m in swapped:
        m.forward = _OWN_FORWARDS[type(m).__name__].__get__(m)
    try:
        yield
    finally:
        for m in swapped:
            del m.forward


def cached_image_to_text(model: nn.Module, cache_len: int, image_size=None, prompt_len: int | None = None) -> nn.Module:
    """The two-signature adapter of `model`: CachedGit for GIT, else CachedImageToText."""
    check_image_to_text(model)
    if _name(model) == "GitForCausalLM":
        return CachedGit(model, cache_len)
    return CachedImageToText(model, cache_len, image_size, prompt_len)


# ---- verification, export, generation ------------------------------------------------------


def _pixels(pixel_values, shape) -> torch.Tensor:
    x = (
        pixel_values.detach().cpu().float()
        if isinstance(pixel_values, torch.Tensor)
        else torch.as_tensor(np.asarray(pixel_values, dtype=np.float32))
    )
    if x.ndim == len(shape) - 1:
        x = x[None]
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"pixel_values must have shape {tuple(shape)} (one image, channels first), got {tuple(x.shape)}"
        )
    return x


def florence_input_ids(model: nn.Module, pixel_values: torch.Tensor, prompt) -> torch.Tensor:
    """Florence-2's encoder input ids as its processor makes them: one image token per image
    feature, then the prompt (bos, task prompt, eos)."""
    if prompt is None:
        raise ValueError(f"{_name(model)}: pass prompt, the task prompt's token ids (bos, prompt, eos)")
    with torch.no_grad():
        image_tokens = model.model.get_image_features(pixel_values).pooler_output.shape[1]
    prompt = torch.as_tensor(np.asarray(prompt).reshape(1, -1), dtype=torch.long)
    return torch.cat([torch.full((1, image_tokens), int(model.config.image_token_id)), prompt], 1)


@torch.no_grad()
def _reference_logits(model: nn.Module, pixel_values: torch.Tensor, decoder_ids: torch.Tensor, prompt=None):
    """The model's own forward (no cache) on the whole decoder sequence: (1, T, vocab).
    Florence-2: `prompt` (the task prompt's ids) after the image tokens, as its processor
    lays them out."""
    if _name(model) == "Florence2ForConditionalGeneration":
        return model(
            input_ids=florence_input_ids(model, pixel_values, prompt),
            pixel_values=pixel_values,
            decoder_input_ids=decoder_ids,
            use_cache=False,
        ).logits
    if _name(model) == "GitForCausalLM":
        logits = model(pixel_values=pixel_values, input_ids=decoder_ids, use_cache=False).logits
        return logits[:, -decoder_ids.shape[1] :]
    if _name(model) == "BlipForConditionalGeneration":
        image = model.vision_model(pixel_values=pixel_values)[0]
        return model.text_decoder(input_ids=decoder_ids, encoder_hidden_states=image, use_cache=False).logits
    return model(pixel_values=pixel_values, decoder_input_ids=decoder_ids, use_cache=False).logits


@torch.no_grad()
def verify_image_to_text(model: nn.Module, cache_len: int, steps: int = 24, tolerance: float = TOLERANCE) -> float:
    """Encode a random image and decode `steps` random tokens through the explicit caches in
    PyTorch against the model's own forward: max relative error of the logits at every step
    (raises UnsupportedModelError above `tolerance`)."""
    from runtimes.litert import max_relative_error

    lm = (
        model if isinstance(model, (CachedImageToText, CachedGit)) else cached_image_to_text(cpu_view(model), cache_len)
    )
    gen = torch.Generator().manual_seed(0)
    total = min(steps, lm.cache_len)
    decoder_ids = torch.randint(0, _decoder(lm.model).config.vocab_size, (1, total), generator=gen)
    pixels = torch.randn(lm.source_shape, generator=gen)
    prompt, source, mask = None, (pixels,), ()
    if getattr(lm, "prompted", False):  # a prompt shorter than the padded length: padding is exercised
        prompt = torch.randint(0, int(lm.model.config.image_token_id), (max(1, lm.prompt_len * 3 // 4),), generator=gen)
        source = (pixels, *_text_source(prompt, lm.prompt_len))
        mask = (source[2],)
    expected = _reference_logits(lm.model, pixels, decoder_ids, prompt)
    cross, cache, got = lm.encode(*source), lm.empty_cache(), []
    for pos in range(total):
        logits, *cache = lm.decode(
            decoder_ids[:, pos : pos + 1].int(), torch.tensor([pos], dtype=torch.int32), cache, cross, *mask
        )
        got.append(logits)
    error = max_relative_error(torch.cat(got, dim=1).numpy(), expected.float().numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{_name(lm.model)}: the cached image-to-text model's logits differ from the model's own forward by "
            f"{error:.3g} (max relative, over {total} decoder steps); refusing to export a different model"
        )
    return error


class _EncodeImage(nn.Module):
    def __init__(self, lm: CachedImageToText):
        super().__init__()
        self.lm = lm

    def forward(self, pixel_values, input_ids=None, source_mask=None):  # the prompt: Florence-2's only
        return self.lm.encode(pixel_values, input_ids, source_mask)


def export_image_to_text(
    model: nn.Module,
    *,
    cache_len: int = 64,
    image_size=None,
    prompt_len: int | None = None,
    verify: bool = True,
    **convert_options,
) -> EdgeModel:
    """Convert an image-to-text model into a LiteRT model with `encode_image` and `decode`
    signatures sharing its weights (see the module docstring). `cache_len`: the most decoder
    tokens (prompt + generated). `image_size`: the exported image size where the vision
    config has none (Florence-2's DaViT). `prompt_len`: Florence-2's padded task prompt
    length. `verify`: check the cached model against the model's own forward in PyTorch
    first (refuses on a difference). `convert_options` go to `convert`."""
    model = cpu_view(model)
    lm = cached_image_to_text(model, cache_len, image_size, prompt_len)
    if verify:
        verify_image_to_text(lm, cache_len, steps=min(24, cache_len))
    n = 2 * lm.n_layers
    cross_names = [f"cross_kv_{i}" for i in range(n)]
    builder = signature("encode_image", _EncodeImage(lm), lm.sample_source(), output_names=cross_names)
    cross = [torch.zeros(s) for s in lm.cross_shapes]
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), lm.empty_cache(), cross)
    if getattr(lm, "prompted", False):
        decode_args += (torch.ones(1, lm.prompt_len, dtype=torch.int32),)
    names = ["logits"] + [f"kv_cache_{i}" for i in range(n)]
    return builder.signature("decode", _Decode(lm), decode_args, output_names=names).convert(**convert_options)


class ImageToTextSession(Seq2SeqSession):
    """One image in LiteRT: `encode_image` runs once when made; `step(token)` runs `decode`."""

    def __init__(self, edge_model: EdgeModel, pixel_values, prompt=None):
        self.runtime = runtime = edge_model.runtime
        encode, decode = runtime.signature("encode_image"), runtime.signature("decode")
        caches = [spec for spec in decode.inputs if spec.name.startswith("kv_cache")]
        self.cache_len = caches[0].shape[2]
        self.cache = [np.zeros(spec.shape, spec.dtype) for spec in caches]
        self.vocab = decode.outputs[0].shape[-1]
        source, self.mask = [_pixels(pixel_values, encode.inputs[0].shape).numpy()], []
        if len(encode.inputs) > 1:  # Florence-2: the task prompt, padded, and its mask
            if prompt is None:
                raise ValueError("this model reads a task prompt with the image: pass prompt=[bos, ..., eos] ids")
            ids, mask = _text_source(prompt, encode.inputs[1].shape[1])
            source, self.mask = [*source, ids.numpy(), mask.numpy()], [mask.numpy()]
        self.cross = runtime.run(source, "encode_image")
        self.position = 0


def generate_image_to_text(
    edge_model: EdgeModel,
    pixel_values,
    max_new_tokens: int,
    *,
    decoder_prompt,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
    prompt=None,
    sampler=None,
):
    """Generate with a model from `export_image_to_text`, in LiteRT: `encode_image` once,
    then `decode` once per decoder prompt token and per new token (arguments and result as
    `generate_seq2seq`'s; `prompt`: Florence-2's task prompt ids)."""
    session = ImageToTextSession(edge_model, pixel_values, prompt)
    sampler = sampler or _sampler(temperature, top_k, top_p, seed)
    return generate_in_session(
        session, _decoder_prompt(decoder_prompt), max_new_tokens, sampler, stop_tokens, return_logits
    )


@torch.no_grad()
def reference_generate_image_to_text(
    model: nn.Module,
    pixel_values,
    max_new_tokens: int,
    *,
    decoder_prompt,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
    prompt=None,
):
    """The same generation in PyTorch with the model's own forward and no decoder cache
    (the whole decoder sequence every step), with the same sampler: the reference that
    `generate_image_to_text` must match token for token."""
    sampler = _sampler(temperature, top_k, top_p, seed)
    pixels = _pixels(pixel_values, (1, *np.asarray(pixel_values).shape[-3:]))
    ids = torch.tensor([_decoder_prompt(decoder_prompt)])
    stop, rng, out, rows = {int(t) for t in stop_tokens}, sampler.rng(), [], []
    for _ in range(max_new_tokens):
        rows.append(_reference_logits(model, pixels, ids, prompt)[0, -1].float().numpy())
        out.append(sampler(rows[-1], rng))
        if out[-1] in stop:
            break
        ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
    return (out, rows) if return_logits else out
