"""Tiny random-weight Qwen2-VL and Qwen2.5-VL from transformers configs, with their images,
prompts and transformers' own generate: shared by tests/litert_torch/generative/test_qwen_vl.py
and `benchmarks.generative.embedder_vlm_families`."""

from __future__ import annotations

import warnings

import torch

from litert_torch.generative import qwen_vl

VOCAB, IMAGE, VIDEO, START, END = 96, 92, 93, 90, 91
PATCH, MERGE = 4, 2
GRIDS = [(1, 4, 4), (1, 4, 6)]  # images of 16 x 16 and 16 x 24 pixels: 4 and 6 image tokens
PREFILL, CACHE, STEPS = 8, 64, 16
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    num_hidden_layers=2,
    rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
)
TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)


def _quiet(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def qwen2_vl():
    import transformers

    torch.manual_seed(0)
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=PATCH, spatial_merge_size=MERGE)
    config = _quiet(lambda: transformers.Qwen2VLConfig(text_config=TEXT, vision_config=vision, **TOKENS))
    return _quiet(lambda: transformers.Qwen2VLForConditionalGeneration(config)).eval()


def qwen2_5_vl(**config_overrides):
    """Windows of 2 x 2 merged patches (window_size 16 px): a 4 x 6 grid has two of unequal
    sizes; block 0 attends within windows, block 1 over the whole image. `config_overrides`
    go to `Qwen2_5_VLConfig` (e.g. `tie_word_embeddings=True`)."""
    import transformers

    torch.manual_seed(0)
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        window_size=16,
        fullatt_block_indexes=[1],
    )
    config = _quiet(
        lambda: transformers.Qwen2_5_VLConfig(text_config=TEXT, vision_config=vision, **TOKENS, **config_overrides)
    )
    return _quiet(lambda: transformers.Qwen2_5_VLForConditionalGeneration(config)).eval()


BUILDERS = {"qwen2-vl": qwen2_vl, "qwen2.5-vl": qwen2_5_vl}


def image(grid, seed: int = 2) -> torch.Tensor:
    return torch.randn(3, grid[1] * PATCH, grid[2] * PATCH, generator=torch.Generator().manual_seed(seed))


def prompt_for(grids, seed: int = 1) -> list[int]:
    """Text, then per image a start token, its image tokens and an end token; then text."""
    gen = torch.Generator().manual_seed(seed)
    words = lambda n: torch.randint(0, 89, (n,), generator=gen).tolist()  # noqa: E731
    ids = words(2)
    for grid in grids:
        ids += [START] + [IMAGE] * (grid[1] * grid[2] // MERGE**2) + [END] + words(1)
    return ids + words(2)


def transformers_generate(model, images, prompt):
    """transformers' own generate with the processor's inputs: (new tokens, logits per step)."""
    patches, grids = qwen_vl.model_patches(model, images)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **(dict(pixel_values=patches, image_grid_thw=torch.tensor(grids)) if grids else {}),
            mm_token_type_ids=(ids == IMAGE).int(),
            max_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), [step[0].numpy() for step in out.logits]
