"""Generative export: decoder-only LMs with an explicit KV cache, and greedy generation
running in LiteRT; vision-language models (`export_vlm`, `generate_vlm`), sentence
embedders (`export_embedder`) and Stable-Diffusion-shaped pipelines (`export_diffusion`,
`LiteRTDiffusionPipeline`: three signatures and a NumPy scheduler).

    from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate
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
from litert_torch.generative.llama import TinyLlama, TinyLlamaConfig
from litert_torch.generative.transformers_lm import UnsupportedModelError
from litert_torch.generative.vlm import export_vlm, generate_vlm, reference_generate_vlm, tile_image

__all__ = [
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
    "export_diffusion",
    "LiteRTDiffusionPipeline",
    "DiffusionExportError",
]
