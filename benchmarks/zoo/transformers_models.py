"""Transformer families from Hugging Face `transformers` configs, small and randomly initialised.

Nothing is downloaded: each factory builds a model class from a tiny config (2 layers,
hidden size 32-64, vocabulary 128) with seeded random weights. `transformers` is imported
inside the factories, so the zoo package itself still imports with torch only (the
benchmark's anchor script loads it by path in another environment).

Each model is wrapped so that `forward` takes plain tensors and returns plain tensors
(the hidden states or logits a user would ship), not a `ModelOutput`.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import zoo_model

VOCAB = 128
SEQ = 16


def token_ids(*shape):
    """A `make_inputs` for models fed int64 token ids of `shape` (ids 3..VOCAB-1, so the
    special ids 0-2 never appear by chance)."""

    def make(generator: torch.Generator):
        return (torch.randint(3, VOCAB, shape, generator=generator, dtype=torch.int64),)

    return make


class HiddenStates(nn.Module):
    """Calls a transformers model on its positional tensors and returns the named output
    fields (`last_hidden_state`, `logits`...) as a tensor or a tuple of tensors."""

    def __init__(self, model: nn.Module, *fields: str, **call_kwargs):
        super().__init__()
        self.model = model
        self.fields = fields or ("last_hidden_state",)
        self.call_kwargs = call_kwargs

    def forward(self, *inputs):
        out = self.model(*inputs, return_dict=True, **self.call_kwargs)
        values = tuple(getattr(out, f) for f in self.fields)
        return values[0] if len(values) == 1 else values


def _eval(model: nn.Module) -> nn.Module:
    return model.eval()


@zoo_model("hf_bert", [(1, SEQ)], "transformers", fast=True, make_inputs=token_ids(1, SEQ))
def hf_bert():
    """BERT encoder (2 layers, hidden 32, 2 heads): embeddings + LayerNorm, SDPA attention, GELU (erf), pooler."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return HiddenStates(_eval(BertModel(config)), "last_hidden_state", "pooler_output")


@zoo_model("hf_distilbert", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_distilbert():
    """DistilBERT encoder (2 layers, dim 32, 2 heads): learned positions, SDPA attention, GELU."""
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64
    )
    return HiddenStates(_eval(DistilBertModel(config)))


@zoo_model("hf_gpt2", [(1, SEQ)], "transformers", fast=True, make_inputs=token_ids(1, SEQ))
def hf_gpt2():
    """GPT-2 LM (2 layers, 32 wide, 2 heads): causal SDPA, Conv1D (addmm) projections, GELU (tanh), tied head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=2
    )
    return HiddenStates(_eval(GPT2LMHeadModel(config)), "logits", use_cache=False)


@zoo_model("hf_llama", [(1, SEQ)], "transformers", fast=True, make_inputs=token_ids(1, SEQ))
def hf_llama():
    """Llama LM (2 layers, hidden 64, 4 heads, 2 KV heads): RMSNorm, RoPE, GQA causal SDPA, SwiGLU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return HiddenStates(_eval(LlamaForCausalLM(config)), "logits", use_cache=False)


@zoo_model("hf_qwen3", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_qwen3():
    """Qwen3 LM (2 layers, hidden 64, 4 heads of 16, 2 KV heads): per-head q/k RMSNorm, RoPE, GQA, SwiGLU."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    return HiddenStates(_eval(Qwen3ForCausalLM(config)), "logits", use_cache=False)


@zoo_model("hf_t5_encoder", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_t5_encoder():
    """T5 encoder (2 layers, d_model 32, 4 heads): relative position buckets (log, int casts), RMS-style norm."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return HiddenStates(_eval(T5EncoderModel(config)))


@zoo_model("hf_vit", [(1, 3, 32, 32)], "transformers", fast=True)
def hf_vit():
    """ViT (32x32 image, patch 8, 2 layers, hidden 32, 2 heads): patch conv, CLS token, SDPA, GELU."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return HiddenStates(_eval(ViTModel(config, add_pooling_layer=False)))


@zoo_model("hf_whisper_encoder", [(1, 16, 64)], "transformers")
def hf_whisper_encoder():
    """Whisper encoder (16 mel bins, 64 frames, 2 layers, d_model 32): conv1d stem, GELU, sinusoid positions, SDPA."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        max_source_positions=32,
        vocab_size=VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return HiddenStates(_eval(WhisperEncoder(config)))


@zoo_model("hf_clip_text", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_clip_text():
    """CLIP text tower (2 layers, hidden 32, 2 heads): causal mask, quick GELU, pooled at the argmax token id."""
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
    )
    return HiddenStates(_eval(CLIPTextModel(config)), "last_hidden_state", "pooler_output")


@zoo_model("hf_mobilevit", [(1, 3, 64, 64)], "transformers")
def hf_mobilevit():
    """MobileViT (64x64 image, small widths): inverted residuals, unfold-to-patches transformer blocks, SiLU."""
    from transformers import MobileViTConfig, MobileViTModel

    config = MobileViTConfig(
        image_size=64,
        patch_size=2,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
        num_attention_heads=2,
        expand_ratio=2.0,
    )
    return HiddenStates(_eval(MobileViTModel(config)), "last_hidden_state", "pooler_output")


@zoo_model("hf_segformer", [(1, 3, 64, 64)], "transformers")
def hf_segformer():
    """SegFormer (64x64 image, 4 stages of widths 8-32): overlapping patch convs, reduced-KV attention, MLP decoder."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(
        num_encoder_blocks=4,
        depths=[1, 1, 1, 1],
        sr_ratios=[8, 4, 2, 1],
        hidden_sizes=[8, 16, 24, 32],
        num_attention_heads=[1, 1, 2, 2],
        decoder_hidden_size=32,
        num_labels=4,
    )
    return HiddenStates(_eval(SegformerForSemanticSegmentation(config)), "logits")


@zoo_model("hf_wav2vec2", [(1, 1600)], "transformers")
def hf_wav2vec2():
    """Wav2Vec2 (0.1 s at 16 kHz, 2 layers, hidden 32): conv feature extractor with group norm, conv positions."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        vocab_size=VOCAB,
    )
    return HiddenStates(_eval(Wav2Vec2Model(config)))
