"""Decoder-only causal LMs (Llama, Qwen, Gemma, Mistral, Phi, GPT-2, MoE ...): prefill and
decode signatures over an explicit KV cache (`export_generative`), rows of a batch padded on
the left as transformers' decoder-only generation wants them."""

from __future__ import annotations

from torch import nn

from litert_torch.generative.export import export_generative
from litert_torch.generative.families.family import Family, unpadded_rows
from litert_torch.generative.generate import generate as generate_tokens


def _matches(model: nn.Module) -> bool:
    return callable(getattr(model, "generate", None)) and not getattr(model.config, "is_encoder_decoder", False)


def _convert(model, sample, sizes, options):
    return export_generative(model, prefill_len=sizes["prefill_len"], cache_len=sizes["cache_len"], **options)


def _rows(inputs, facts):
    return [{"prefix": row, "prompt": prompt} for row, prompt in unpadded_rows(inputs, "left")]


def _generate(edge, row, max_new_tokens, picker, stop, facts):
    return generate_tokens(edge, row["prompt"], max_new_tokens, sampler=picker, stop_tokens=stop)


FAMILY = Family(
    name="causal LM",
    matches=_matches,
    inputs=("input_ids", "attention_mask"),
    convert=_convert,
    sizes={"prefill_len": 32, "cache_len": 128},
    rows=_rows,
    generate=_generate,
)
