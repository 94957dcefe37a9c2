"""Generative export: decoder-only LMs with an explicit KV cache, and greedy generation
running in LiteRT.

    from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate
    edge = export_generative(model, prefill_len=32, cache_len=128)
    new_ids = generate(edge, prompt_ids, max_new_tokens=20)

Diffusion (a Stable-Diffusion-shaped diffusers pipeline as three signatures, a NumPy
scheduler): `litert_torch.generative.diffusion` (export_diffusion, LiteRTDiffusionPipeline).
"""

from litert_torch.generative.diffusion import DiffusionExportError, LiteRTDiffusionPipeline, export_diffusion
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

__all__ = [
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
