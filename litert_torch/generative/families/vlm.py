"""Vision-language models whose decoder reads image embeddings as prompt tokens: Gemma 3,
SmolVLM and Idefics3, PaliGemma (`FAMILY`), and Qwen2-VL / Qwen2.5-VL with their image grids
and M-RoPE positions (`QWEN_VL`): `encode_image`, `prefill` and `decode` signatures
(`export_vlm`). The number of images per prompt (or tiles), and Qwen's grids, are read from
the sample; a batch's rows are padded on the left and take the batch's images in order, as
transformers' processors lay them out."""

from __future__ import annotations

import math

import numpy as np
from torch import nn

from litert_torch.generative import vlm, vlm_common
from litert_torch.generative.families.family import Family, as_array, unpadded_rows

QWEN = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")


def _matches(model: nn.Module) -> bool:
    return type(model).__name__ in vlm_common.FAMILIES and type(model).__name__ not in QWEN


def _matches_qwen(model: nn.Module) -> bool:
    return type(model).__name__ in QWEN


def _facts(model) -> dict:
    family = vlm_common.family(model)
    facts = {"image_token_id": vlm_common.image_token_id(model), "class": type(model).__name__}
    if not family.mrope:
        facts["tokens_per_image"] = vlm.tokens_per_image(model)
    return facts


def _convert(model, sample, sizes, options):
    facts, images, prefill_len = _facts(model), sizes["images"], sizes["prefill_len"]
    if "input_ids" in sample and images is None:
        row = _rows(sample, facts)[0]
        images = 0 if row["pixels"] is None else len(row["pixels"])
    prefix_lm = vlm_common.FAMILIES[facts["class"]].prefix_lm
    if prefix_lm and "input_ids" in sample:  # PaliGemma: the whole prompt in one chunk
        longest = as_array(sample["input_ids"], "input_ids", 2).shape[1]
        prefill_len = max(prefill_len, 8 * math.ceil((longest + 1) / 8))
    return vlm.export_vlm(model, prefill_len=prefill_len, cache_len=sizes["cache_len"], images=images or 1, **options)


def _convert_qwen(model, sample, sizes, options):
    grids = sizes["grids"]
    if grids is None and "image_grid_thw" in sample:
        grids = list(dict.fromkeys(tuple(int(n) for n in g) for g in as_array(sample["image_grid_thw"], "grids", 2)))
    if not grids:
        raise ValueError("pass a sample with images (pixel_values, image_grid_thw) or grids=[(1, h, w), ...]")
    return vlm.export_vlm(model, prefill_len=sizes["prefill_len"], cache_len=sizes["cache_len"], grids=grids, **options)


def _check_types(inputs: dict, name: str, ids: np.ndarray, expected: np.ndarray) -> None:
    if name in inputs and not np.array_equal(as_array(inputs[name], name, 2), expected):
        raise ValueError(f"{name} is not what the file computes from input_ids ({name} 1 at image tokens only)")


def _rows(inputs, facts):
    if "input_ids" not in inputs:
        raise ValueError("pass input_ids (the processor's, with its image tokens)")
    image_id, family = facts["image_token_id"], vlm_common.FAMILIES[facts["class"]]
    ids = as_array(inputs["input_ids"], "input_ids", 2)
    if family.prefix_lm:  # PaliGemma: the prompt is all prefix (0) when generating
        _check_types(inputs, "token_type_ids", ids, np.zeros_like(ids))
    elif family.bidirectional_images:
        _check_types(inputs, "token_type_ids", ids, (ids == image_id).astype(ids.dtype))
    pixels = None if "pixel_values" not in inputs else as_array(inputs["pixel_values"], "pixel_values")
    rows, used = [], 0
    for i, (row, prompt) in enumerate(unpadded_rows(inputs, "left")):
        count = int((prompt == image_id).sum())
        if family.batched_pixels:  # SmolVLM: (batch, images, 3, S, S)
            mask = inputs.get("pixel_attention_mask")
            if mask is not None and not as_array(mask, "pixel_attention_mask").all():
                raise ValueError("pixel_attention_mask has zeros: the file takes whole images (tiles) of one size")
            images = pixels[i] if pixels is not None and count else None
        else:  # (images of the whole batch, 3, S, S), taken in order
            n = count // facts["tokens_per_image"]
            images, used = (pixels[used : used + n] if pixels is not None and n else None), used + n
        rows.append({"prefix": row, "prompt": prompt, "pixels": images})
    return rows


def _rows_qwen(inputs, facts):
    image_id = facts["image_token_id"]
    ids = as_array(inputs["input_ids"], "input_ids", 2)
    _check_types(inputs, "mm_token_type_ids", ids, (ids == image_id).astype(ids.dtype))
    grids = [] if "image_grid_thw" not in inputs else as_array(inputs["image_grid_thw"], "image_grid_thw", 2)
    patches = None if "pixel_values" not in inputs else as_array(inputs["pixel_values"], "pixel_values", 2)
    rows, image, patch = [], 0, 0
    for row, prompt in unpadded_rows(inputs, "left"):
        tokens, mine = int((prompt == image_id).sum()), []
        while tokens > 0 and image < len(grids):  # the row's images: grids in order until its image tokens
            mine.append(grids[image])
            tokens -= int(np.prod(grids[image])) // facts["merge"] ** 2
            image += 1
        start, patch = patch, patch + sum(int(np.prod(g)) for g in mine)
        pixels = patches[start:patch] if mine else []
        rows.append({"prefix": row, "prompt": prompt, "pixels": pixels, "grids": mine or None})
    return rows


def _qwen_facts(model) -> dict:
    return dict(_facts(model), merge=int(model.config.vision_config.spatial_merge_size))


def _generate(edge, row, max_new_tokens, picker, stop, facts):
    return vlm.generate_vlm(
        edge,
        row["pixels"],
        row["prompt"],
        max_new_tokens,
        image_token_id=facts["image_token_id"],
        sampler=picker,
        stop_tokens=stop,
        image_grid_thw=row.get("grids"),
    )


FAMILY = Family(
    name="vision-language model",
    matches=_matches,
    inputs=("input_ids", "attention_mask", "pixel_values", "token_type_ids", "pixel_attention_mask"),
    convert=_convert,
    sizes={"prefill_len": 32, "cache_len": 128, "images": None},
    facts=_facts,
    rows=_rows,
    generate=_generate,
)

QWEN_VL = Family(
    name="Qwen-VL model",
    matches=_matches_qwen,
    inputs=("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids"),
    convert=_convert_qwen,
    sizes={"prefill_len": 32, "cache_len": 128, "grids": None},
    facts=_qwen_facts,
    rows=_rows_qwen,
    generate=_generate,
)
