"""The generative families, one record each, and the one dispatch from a model to its record.

A `Family` says what `litert_torch.generative.convert` needs to know about a kind of model:
which models it takes, the processor outputs it reads, the sizes it converts with (read from
the sample where the sample holds them), how it converts, and how one row of a batch
generates (or embeds) in LiteRT. `family_of(model)` walks `FAMILIES` in order and returns the
first record whose `matches` says yes; a model none takes is refused with the families there
are, and a model refused by name (`image_families.REFUSED`) with the reason.

One file per family: `decoder.py` (causal LMs), `seq2seq.py` (text and speech
encoder-decoders), `image_to_text.py` (an image encoder read by a text decoder), `vlm.py`
(image embeddings as prompt tokens: Gemma 3, SmolVLM, PaliGemma, Qwen2-VL), `embedders.py`
(sentence and image embedders, and CLIP/SigLIP-style dual encoders).
"""

from __future__ import annotations

from torch import nn

from litert_torch.generative.errors import UnsupportedModelError
from litert_torch.generative.families import decoder, embedders, image_to_text, seq2seq, vlm
from litert_torch.generative.families.family import Family
from litert_torch.generative.image_families import REFUSED
from litert_torch.generative.llama import TinyLlama

# Every family, most specific first (the causal LM record takes what is left).
FAMILIES: list[Family] = [
    image_to_text.FAMILY,
    vlm.FAMILY,
    vlm.QWEN_VL,
    seq2seq.FAMILY,
    *embedders.FAMILIES,
    decoder.FAMILY,
]


def family_of(model: nn.Module) -> Family:
    """The record of `model`'s family, or UnsupportedModelError saying why there is none."""
    name = type(model).__name__
    if name in REFUSED:
        raise UnsupportedModelError(f"{name}: {REFUSED[name]}")
    if hasattr(model, "unet") and hasattr(model, "vae"):
        raise UnsupportedModelError(
            f"{name}: a diffusion pipeline, not a model with generate(): export it with "
            "litert_torch.generative.export_diffusion(pipe) and run it with LiteRTDiffusionPipeline"
        )
    if isinstance(model, TinyLlama):
        raise UnsupportedModelError(
            f"{name}: this package's own decoder has no transformers generate() to answer to: export it with "
            "export_generative(model, prefill_len=..., cache_len=...) and generate with generate(edge, ids, n)"
        )
    for family in FAMILIES if hasattr(model, "config") else []:  # transformers models only
        if family.matches(model):
            return family
    raise UnsupportedModelError(
        f"{name}: not a generative model this package converts (families: {', '.join(f.name for f in FAMILIES)}); "
        "other models go through litert_torch.convert(model, sample_args)"
    )
