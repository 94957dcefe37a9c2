"""Generative export. One call for every family (`model.py`, the records in `families/`):

    edge = convert(model, inputs)                    # inputs: the tokenizer's or processor's outputs
    ids = edge.generate(**inputs, max_new_tokens=20)  # in LiteRT: what model.generate(**inputs) returns
    vectors = embedder.embed(**inputs)               # sentence and image embedders
    edge.export("model.tflite"); edge = load("model.tflite")  # the file carries its generation config

Beneath it, one entry point per family, for your own runtime loop: decoder-only LMs with an
explicit KV cache (`export_generative`, `generate`), encoder-decoders (`export_seq2seq`,
`generate_seq2seq`: T5, BART, Whisper, ...), image-to-text (`export_image_to_text`:
TrOCR, BLIP, GIT, Florence-2), vision-language models (`export_vlm`, `generate_vlm`),
sentence embedders (`export_embedder`) and Stable-Diffusion-shaped pipelines
(`export_diffusion`, `LiteRTDiffusionPipeline`: three signatures and a NumPy scheduler).

    edge = export_generative(model, prefill_len=32, cache_len=128)
    new_ids = generate(edge, prompt_ids, max_new_tokens=20)
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
from litert_torch.generative.model import GenerativeModel, convert, load
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
    "load",
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
