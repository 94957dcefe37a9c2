"""Encoder-decoders of text (T5, BART, mBART, Marian, Pegasus, NLLB, ...) and of speech
(Whisper's log-mel features, Speech2Text's masked features, Moonshine's raw samples):
`encode` and `decode` signatures with self- and cross-attention caches (`export_seq2seq`).
The source length is read from the sample (its padded length: the longest source the file
takes); a batch's sources are padded on the right, as their tokenizers and feature
extractors pad them."""

from __future__ import annotations

import numpy as np
from torch import nn

from litert_torch.generative import seq2seq
from litert_torch.generative.families.family import Family, as_array, unpadded_rows
from litert_torch.generative.image_families import FAMILIES as IMAGE_TO_TEXT


def _matches(model: nn.Module) -> bool:
    return getattr(model.config, "is_encoder_decoder", False) and type(model).__name__ not in IMAGE_TO_TEXT


def _source_len(model, sample: dict) -> int | None:
    """The padded source the file takes: ids or Speech2Text frames or Moonshine samples in
    the sample; None for Whisper (its config fixes the frames)."""
    if hasattr(model.config, "num_mel_bins"):
        return None
    if "input_values" in sample:
        return as_array(sample["input_values"], "input_values", 2).shape[1]
    if "input_features" in sample:
        return as_array(sample["input_features"], "input_features", 3).shape[1]
    if "input_ids" in sample:
        return as_array(sample["input_ids"], "input_ids", 2).shape[1]
    return None


def _convert(model, sample, sizes, options):
    source_len = sizes["source_len"] or _source_len(model, sample)
    if source_len is None and not hasattr(model.config, "num_mel_bins"):
        raise ValueError(
            f"{type(model).__name__}: pass a sample of the tokenizer's outputs (input_ids of the longest source) "
            "or source_len="
        )
    return seq2seq.export_seq2seq(model, source_len=source_len, cache_len=sizes["cache_len"], **options)


def _facts(model) -> dict:
    # Whisper's generate returns the new tokens only, without its decoder prompt
    return {
        "decoder_start": seq2seq.decoder_start_ids(model),
        "returns_prompt": not hasattr(model.config, "num_mel_bins"),
    }


def _sources(inputs: dict) -> list:
    """Each row's source as `generate_seq2seq` takes it: ids or frames without padding,
    Whisper's features, Moonshine's samples."""
    mask = inputs.get("attention_mask")
    if "input_ids" in inputs:
        return [prompt for _, prompt in unpadded_rows(inputs, "right")]
    if "input_values" in inputs:
        values = as_array(inputs["input_values"], "input_values", 2)
        if mask is not None and not as_array(mask, "attention_mask").all():
            raise ValueError(
                "attention_mask has zeros: the model was converted for clips of exactly its sample's length "
                "(Moonshine's group norm spans the whole clip, so padding changes every frame); pass unpadded clips"
            )
        return list(values)
    features = as_array(inputs["input_features"], "input_features", 3)
    if mask is None:  # Whisper: fixed frames, no mask
        return list(features)
    # Speech2Text: each row's frames with its mask (its convolutions read the padded frames too)
    return list(zip(features, as_array(mask, "attention_mask", 2)))


def _rows(inputs, facts):
    if not {"input_ids", "input_features", "input_values"} & set(inputs):
        raise ValueError("pass the source: input_ids, input_features or input_values")
    sources = _sources(inputs)
    # the padded source rows, as transformers' encoder n-gram blocking reads them
    encoder_ids = (
        list(as_array(inputs["input_ids"], "input_ids", 2)) if "input_ids" in inputs else [None] * len(sources)
    )
    prompts = inputs.get("decoder_input_ids")
    if prompts is None:
        prompts = [facts["decoder_start"]] * len(sources)
    else:
        prompts = as_array(prompts, "decoder_input_ids", 2)
        if len(prompts) != len(sources):
            raise ValueError(f"decoder_input_ids has {len(prompts)} rows for {len(sources)} sources")
    return [{"prefix": np.asarray(p), "source": s, "encoder_ids": e} for p, s, e in zip(prompts, sources, encoder_ids)]


def _generate(edge, row, max_new_tokens, picker, stop, facts):
    source, mask = row["source"] if isinstance(row["source"], tuple) else (row["source"], None)
    return seq2seq.generate_seq2seq(
        edge, source, max_new_tokens, decoder_prompt=row["prefix"], sampler=picker, stop_tokens=stop, source_mask=mask
    )


FAMILY = Family(
    name="encoder-decoder",
    matches=_matches,
    inputs=("input_ids", "attention_mask", "input_features", "input_values", "decoder_input_ids"),
    convert=_convert,
    sizes={"source_len": None, "cache_len": 64},
    facts=_facts,
    rows=_rows,
    generate=_generate,
)
