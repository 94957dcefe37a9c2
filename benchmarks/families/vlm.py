"""Tiny random-weight vision-language models from transformers configs (Gemma 3,
SmolVLM, PaliGemma, Idefics3), with their prompts and images: shared by the VLM tests and
`benchmarks.generative.embedder_vlm_families`."""

from __future__ import annotations

import warnings

import torch

VOCAB, IMAGE, BOI, EOI = 96, 92, 90, 91
PER_IMAGE = 4  # image tokens per image (tile) in both tiny configs
PREFILL, CACHE, TOTAL = 8, 64, 48
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
)
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
)


def quietly(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def gemma3_vlm(per_image: int = PER_IMAGE):
    import transformers

    text = dict(
        TEXT,
        num_hidden_layers=3,
        sliding_window=8,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    config = quietly(
        lambda: transformers.Gemma3Config(
            text_config=text,
            vision_config=VISION,
            mm_tokens_per_image=per_image,
            image_token_id=IMAGE,
            boi_token_id=BOI,
            eoi_token_id=EOI,
        )
    )
    model = quietly(lambda: transformers.Gemma3ForConditionalGeneration(config)).eval()
    with torch.no_grad():  # the projector starts at zero: give the image a say
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    return model


def paligemma():
    import transformers

    torch.manual_seed(0)
    config = quietly(
        lambda: transformers.PaliGemmaConfig(
            text_config=dict(TEXT, num_hidden_layers=2, model_type="gemma"),
            vision_config=dict(VISION, image_size=16),  # 2 x 2 patches: 4 image tokens
            image_token_id=IMAGE,
            projection_dim=64,
            hidden_size=64,
        )
    )
    model = quietly(lambda: transformers.PaliGemmaForConditionalGeneration(config)).eval()
    with torch.no_grad():  # larger weights than the init's: generation that does not repeat one token
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def smolvlm(family: str = "SmolVLM"):
    import transformers

    torch.manual_seed(0)
    config = quietly(
        lambda: getattr(transformers, f"{family}Config")(
            text_config=dict(TEXT, num_hidden_layers=2),
            vision_config=VISION,
            scale_factor=2,  # 16 patches -> 4 tokens per tile
            image_token_id=IMAGE,
            pad_token_id=0,
        )
    )
    return quietly(lambda: getattr(transformers, f"{family}ForConditionalGeneration")(config)).eval()


# case -> (model builder, export keywords, images per call)
CASES = {
    "gemma3, one image": (gemma3_vlm, {"images": 1}, 1),
    "gemma3, two images": (gemma3_vlm, {"images": 2}, 2),
    "smolvlm, 2x2 tiles": (smolvlm, {"tiles": (2, 2)}, 5),
    "paligemma": (paligemma, {"prefill_len": 16}, 1),
    "idefics3, 2x2 tiles": (lambda: smolvlm("Idefics3"), {"tiles": (2, 2)}, 5),
}


def prompt_with_images(images: int, text_before: int, text_after: int, seed: int = 1) -> list[int]:
    """Text, then per image (tile) a start token, its image tokens, an end token; then text."""
    gen = torch.Generator().manual_seed(seed)
    words = lambda n: torch.randint(0, 89, (n,), generator=gen).tolist()  # noqa: E731
    ids = words(text_before)
    for _ in range(images):
        ids += [BOI] + [IMAGE] * PER_IMAGE + [EOI]
    return ids + words(text_after)


def pixels(images: int, seed: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(seed))
