"""Image-to-text models: an image encoder read by a text decoder through cross-attention
(VisionEncoderDecoderModel: TrOCR, Donut, ViT + GPT-2; BLIP captioning; Florence-2) or as
leading tokens of one stream (GIT): `encode_image` and `decode` signatures
(`export_image_to_text`). The image size and Florence-2's task prompt length are read from
the sample."""

from __future__ import annotations

import numpy as np
from torch import nn

from litert_torch.generative import image_to_text
from litert_torch.generative.families.family import Family, as_array, unpadded_rows
from litert_torch.generative.image_families import FAMILIES

FLORENCE, BLIP, GIT = "Florence2ForConditionalGeneration", "BlipForConditionalGeneration", "GitForCausalLM"


def _matches(model: nn.Module) -> bool:
    return type(model).__name__ in FAMILIES


def _convert(model, sample, sizes, options):
    image_size, prompt_len = sizes["image_size"], sizes["prompt_len"]
    if "pixel_values" in sample and image_size is None:
        image_size = tuple(as_array(sample["pixel_values"], "pixel_values", 4).shape[-2:])
    if type(model).__name__ == FLORENCE and prompt_len is None and "input_ids" in sample:
        ids = as_array(sample["input_ids"], "input_ids", 2)
        prompt_len = int((ids != model.config.image_token_id).sum(axis=1).max())
    return image_to_text.export_image_to_text(
        model, cache_len=sizes["cache_len"], image_size=image_size, prompt_len=prompt_len, **options
    )


def _facts(model) -> dict:
    name = type(model).__name__
    facts = {"name": name, "decoder_start": image_to_text.image_to_text_prompt(model)}
    if name == FLORENCE:
        facts["image_token_id"] = int(model.config.image_token_id)
    if name == BLIP:  # BLIP's generate ends at its [SEP] and pads with the text config's pad
        text = model.config.text_config
        facts["generation"] = {"eos_token_id": text.sep_token_id, "pad_token_id": text.pad_token_id}
    return facts


def _rows(inputs, facts):
    if "pixel_values" not in inputs:
        raise ValueError("pass pixel_values (the image processor's output)")
    pixels = as_array(inputs["pixel_values"], "pixel_values", 4)
    name, rows = facts["name"], []
    decoder = inputs.get("decoder_input_ids")  # an encoder-decoder's own decoder prompt (TrOCR, Donut, Florence-2)
    decoder = None if decoder is None else as_array(decoder, "decoder_input_ids", 2)
    texts = unpadded_rows(inputs, "right" if name == FLORENCE else "left") if "input_ids" in inputs else None
    if texts is not None and len(texts) != len(pixels):
        raise ValueError(f"input_ids has {len(texts)} rows for {len(pixels)} images")
    for i, image in enumerate(pixels):
        start = facts["decoder_start"] if decoder is None else decoder[i]
        row = {"pixels": image, "prefix": np.asarray(start), "prompt": None}
        if texts is None:
            pass
        elif name != FLORENCE and len(texts[i][1]) < len(texts[i][0]):
            raise ValueError(f"row {i} of input_ids is padded: a decoder prompt is generated from unpadded rows")
        elif name == FLORENCE:  # the encoder reads the task prompt after the image tokens
            row["prompt"] = texts[i][1][texts[i][1] != facts["image_token_id"]]
        elif name == BLIP:  # BLIP's generate puts its bos first and drops the tokenizer's last ([SEP])
            row["prefix"] = np.concatenate([row["prefix"], texts[i][1][1:-1]])
        else:  # GIT and the decoders of VisionEncoderDecoderModel continue the given ids
            row["prefix"] = texts[i][0]
        rows.append(row)
    return rows


def _generate(edge, row, max_new_tokens, picker, stop, facts):
    return image_to_text.generate_image_to_text(
        edge,
        row["pixels"],
        max_new_tokens,
        decoder_prompt=row["prefix"],
        prompt=row["prompt"],
        sampler=picker,
        stop_tokens=stop,
    )


FAMILY = Family(
    name="image-to-text model",
    matches=_matches,
    inputs=("pixel_values", "input_ids", "attention_mask", "decoder_input_ids"),
    convert=_convert,
    sizes={"cache_len": 64, "image_size": None, "prompt_len": None},
    facts=_facts,
    rows=_rows,
    generate=_generate,
)
