"""Generative export: decoder-only LMs with an explicit KV cache, and greedy generation
running in LiteRT; vision-language models (`export_vlm`, `generate_vlm`), sentence
embedders (`export_embedder`) and Stable-Diffusion-shaped pipelines (`export_diffusion`,
`LiteRTDiffusionPipeline`: three signatures and a NumPy scheduler).

    from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate
    edge = export_generative(model, prefill_len=32, cache_len=128)
    new_ids = generate(edge, prompt_ids, max_new_tokens=20)

Encoder-decoders (T5, BART, mBART, Marian, Whisper): `encode` and `decode` signatures.

    edge = export_seq2seq(model, source_len=64, cache_len=64)
    new_ids = generate_seq2seq(edge, source_ids, 20, decoder_prompt=decoder_start_ids(model))

Image-to-text (VisionEncoderDecoderModel: TrOCR, Donut, ViT + GPT-2; BLIP; GIT):
`encode_image` and `decode` signatures.

    edge = export_image_to_text(model, cache_len=32)
    new_ids = generate_image_to_text(edge, pixel_values, 20, decoder_prompt=image_to_text_prompt(model))
"""

from litert_torch.generative.diffusion import DiffusionExportError, LiteRTDiffusionPipeline, export_diffusion
from litert_torch.generative.embedder import SentenceEmbedder, embed, export_embedder
from litert_torch.generative.export import (
    CachedHFCausalLM,
    CachedLM,
    CachedTinyLlama,
    export_generative,
    verify_cached_lm,
    with_kv_cache,
)
from litert_torch.generative.generate import Sampler, generate, reference_generate
from litert_torch.generative.image_to_text import (
    export_image_to_text,
    generate_image_to_text,
    image_to_text_prompt,
    reference_generate_image_to_text,
)
from litert_torch.generative.llama import TinyLlama, TinyLlamaConfig
from litert_torch.generative.model import GenerativeModel, convert
from litert_torch.generative.seq2seq import (
    CachedSeq2SeqLM,
    Seq2SeqSession,
    beam_search_seq2seq,
    decoder_start_ids,
    export_seq2seq,
    generate_seq2seq,
    reference_generate_seq2seq,
    score_seq2seq,
    verify_seq2seq,
)
from litert_torch.generative.transformers_lm import UnsupportedModelError
from litert_torch.generative.vlm import export_vlm, generate_vlm, reference_generate_vlm, tile_image

__all__ = [
    "convert",
    "GenerativeModel",
    "export_embedder",
    "embed",
    "SentenceEmbedder",
    "export_vlm",
    "generate_vlm",
    "reference_generate_vlm",
    "tile_image",
    "export_generative",
    "generate",
    "reference_generate",
    "with_kv_cache",
    "verify_cached_lm",
    "CachedLM",
    "CachedTinyLlama",
    "CachedHFCausalLM",
    "TinyLlamaConfig",
    "TinyLlama",
    "Sampler",
    "UnsupportedModelError",
    "export_seq2seq",
    "generate_seq2seq",
    "beam_search_seq2seq",
    "reference_generate_seq2seq",
    "score_seq2seq",
    "verify_seq2seq",
    "decoder_start_ids",
    "CachedSeq2SeqLM",
    "Seq2SeqSession",
    "export_image_to_text",
    "generate_image_to_text",
    "reference_generate_image_to_text",
    "image_to_text_prompt",
    "export_diffusion",
    "LiteRTDiffusionPipeline",
    "DiffusionExportError",
]
