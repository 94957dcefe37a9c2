"""Tiny random-weight transformers encoder-decoders, one per family, for the seq2seq tests
and the family table (docs/generative_families.md). T5's relative position buckets are
small (8 buckets, max distance 16) so that a short source and a short generation cross
every bucket boundary, the logarithmic ones and the last (beyond max_distance)."""

from __future__ import annotations

import torch

VOCAB = 96
SOURCE_LEN = 20  # padded text source, or Speech2Text's feature frames
AUDIO_SAMPLES = 2000  # Moonshine's fixed clip (its front end subsamples by 384: 4 encoder positions)
CACHE = 32  # decoder tokens

_bart_like = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
)

_t5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    decoder_start_token_id=0,
)

# family -> (config class, model class, config kwargs)
FAMILIES = {
    "t5": ("T5Config", "T5ForConditionalGeneration", _t5),
    "t5 v1.1 (gated-gelu, untied head)": (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(_t5, feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3),
    ),
    "bart": ("BartConfig", "BartForConditionalGeneration", _bart_like),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", dict(_bart_like, scale_embedding=True)),
    "marian": (
        "MarianConfig",
        "MarianMTModel",
        dict(_bart_like, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=0),
    ),
    "whisper": (
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        dict(
            {k: v for k, v in _bart_like.items() if k not in ("max_position_embeddings", "forced_eos_token_id")},
            num_mel_bins=8,
            max_source_positions=16,
            max_target_positions=48,
            decoder_start_token_id=3,
        ),
    ),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", _bart_like),
    "blenderbot": ("BlenderbotConfig", "BlenderbotForConditionalGeneration", _bart_like),
    "blenderbot_small": ("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", _bart_like),
    "m2m100 / nllb": ("M2M100Config", "M2M100ForConditionalGeneration", _bart_like),
    "plbart": ("PLBartConfig", "PLBartForConditionalGeneration", _bart_like),
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", _t5),
    "umt5 (relative bias per layer)": ("UMT5Config", "UMT5ForConditionalGeneration", _t5),
    "led (local attention)": (
        "LEDConfig",
        "LEDForConditionalGeneration",
        dict(
            {k: v for k, v in _bart_like.items() if k != "max_position_embeddings"},
            max_encoder_position_embeddings=64,
            max_decoder_position_embeddings=64,
            attention_window=8,
        ),
    ),
    "longt5 (local attention)": ("LongT5Config", "LongT5ForConditionalGeneration", _t5),
    "bigbird_pegasus (full attention)": (
        "BigBirdPegasusConfig",
        "BigBirdPegasusForConditionalGeneration",
        dict(_bart_like, attention_type="original_full"),
    ),
    "fsmt": (
        "FSMTConfig",
        "FSMTForConditionalGeneration",
        dict(
            src_vocab_size=VOCAB,
            tgt_vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            decoder_start_token_id=2,
        ),
    ),
    "switch_transformers (MoE)": (
        "SwitchTransformersConfig",
        "SwitchTransformersForConditionalGeneration",
        dict(_t5, num_experts=4, encoder_sparse_step=1, decoder_sparse_step=1),
    ),
    "nllb_moe (MoE)": (
        "NllbMoeConfig",
        "NllbMoeForConditionalGeneration",
        dict(_bart_like, num_experts=4, encoder_sparse_step=1, decoder_sparse_step=1),
    ),
    "prophetnet": (
        "ProphetNetConfig",
        "ProphetNetForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_encoder_layers=2,
            num_decoder_layers=2,
            num_encoder_attention_heads=4,
            num_decoder_attention_heads=4,
        ),
    ),
    "speech_to_text": (
        "Speech2TextConfig",
        "Speech2TextForConditionalGeneration",
        dict(_bart_like, input_feat_per_channel=8, max_source_positions=64, max_target_positions=64, conv_channels=16),
    ),
    "moonshine (raw audio)": (
        "MoonshineConfig",
        "MoonshineForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            encoder_num_hidden_layers=2,
            decoder_num_hidden_layers=2,
            encoder_num_attention_heads=4,
            decoder_num_attention_heads=4,
            max_position_embeddings=64,
            decoder_start_token_id=1,
        ),
    ),
}


def build(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """The family's tiny model; `overrides`: config keys to change (fewer layers in a test)."""
    import transformers

    config_cls, model_cls, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**dict(kwargs, **overrides))
    return getattr(transformers, model_cls)(config).eval()


def source_for(model, seed: int = 1, length: int = 13):
    """A source of `length` random token ids (or Speech2Text feature frames), Whisper's
    log-mel features, or Moonshine's AUDIO_SAMPLES samples."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    if hasattr(cfg, "num_mel_bins"):
        return torch.randn(cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=gen)
    if hasattr(cfg, "input_feat_per_channel"):
        return torch.randn(length, cfg.input_feat_per_channel * cfg.input_channels, generator=gen)
    if type(model).__name__.startswith("Moonshine"):
        return torch.randn(AUDIO_SAMPLES, generator=gen)
    return torch.randint(3, VOCAB - 1, (length,), generator=gen)


def source_len_for(model) -> int | None:
    """export_seq2seq's source_len: None for Whisper (fixed by its config)."""
    if hasattr(model.config, "num_mel_bins"):
        return None
    return AUDIO_SAMPLES if type(model).__name__.startswith("Moonshine") else SOURCE_LEN


def reference_options(model) -> dict:
    """reference_generate_seq2seq's options: Speech2Text pads its features to source_len."""
    return {"source_len": SOURCE_LEN} if hasattr(model.config, "input_feat_per_channel") else {}
