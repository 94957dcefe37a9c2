"""What every vision-language family of `vlm.py` shares, below the families' own modules
(`vlm.py` dispatches to `qwen_vl.py`, which builds on these): the family table and its
checks, the prefill module that selects image rows at image tokens, and the host's
placement of image rows and planning of prefill chunks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from litert_torch.generative.export import with_kv_cache
from litert_torch.generative.image_families import redirect_image_to_text
from litert_torch.generative.transformers_lm import UnsupportedModelError

TOLERANCE = 1e-4


@dataclass(frozen=True)
class VLMFamily:
    """What differs between the supported families."""

    # an image's tokens attend to each other both ways (Gemma 3's token_type_ids mask)
    bidirectional_images: bool
    # the model's forward takes pixel_values as (batch, images, 3, S, S) (SmolVLM), not (images, 3, S, S)
    batched_pixels: bool
    # encode_image runs the vision model and connector that get_image_features runs (SmolVLM's
    # get_image_features first drops all-zero images by boolean indexing, a data-dependent shape)
    tower_and_connector: bool = False
    # the whole prompt attends both ways, generated tokens causally (PaliGemma's prefix-LM,
    # token_type_ids 0 / 1): the prompt comes in one prefill chunk, signature "prefill_whole_prompt"
    prefix_lm: bool = False
    # rotary positions (3, T) from the image grid, an input computed on the host (Qwen2-VL's
    # M-RoPE): the signatures of `qwen_vl`
    mrope: bool = False


FAMILIES = {
    "Gemma3ForConditionalGeneration": VLMFamily(bidirectional_images=True, batched_pixels=False),
    "SmolVLMForConditionalGeneration": VLMFamily(
        bidirectional_images=False, batched_pixels=True, tower_and_connector=True
    ),
    "Idefics3ForConditionalGeneration": VLMFamily(  # SmolVLM's parent, the same image path
        bidirectional_images=False, batched_pixels=True, tower_and_connector=True
    ),
    "PaliGemmaForConditionalGeneration": VLMFamily(bidirectional_images=False, batched_pixels=False, prefix_lm=True),
    "Qwen2VLForConditionalGeneration": VLMFamily(bidirectional_images=False, batched_pixels=False, mrope=True),
    "Qwen2_5_VLForConditionalGeneration": VLMFamily(bidirectional_images=False, batched_pixels=False, mrope=True),
}
# The prefill signature's name: a prefix-LM model's says that the whole prompt goes in one call.
PREFILL, PREFILL_WHOLE_PROMPT = "prefill", "prefill_whole_prompt"
SUPPORTED = tuple(FAMILIES)
# Families refused by name, with what the export would not reproduce.
REFUSED: dict[str, str] = {}


def check_vlm(model: nn.Module) -> None:
    """Refuse, by name, the families whose image path is not reproduced."""
    name = type(model).__name__
    if name in REFUSED:
        raise UnsupportedModelError(f"{name}: {REFUSED[name]}")
    redirect_image_to_text(model, "export_vlm")
    if name not in SUPPORTED:
        raise UnsupportedModelError(
            f"{name}: not a supported vision-language model (supported: {', '.join(SUPPORTED)}); "
            "a decoder-only LM goes through export_generative"
        )
    if getattr(model.config, "image_token_id", None) is None:
        raise UnsupportedModelError(f"{name}: config.image_token_id is not set")


def family(model: nn.Module) -> VLMFamily:
    check_vlm(model)
    return FAMILIES[type(model).__name__]


def image_token_id(model: nn.Module) -> int:
    return int(model.config.image_token_id)


def prompt_prefix(positions: torch.Tensor) -> torch.Tensor:
    """(T, T) bool: key k is a later real token of the chunk than query q (PaliGemma's
    prefix-LM over a chunk holding the whole prompt; padding, at -1, is no part of it)."""
    real = positions >= 0
    tokens = positions.shape[0]
    later = torch.ones(tokens, tokens, dtype=torch.bool, device=positions.device).triu(1)
    return real[:, None] & real[None, :] & later


def image_blocks(is_image: torch.Tensor) -> torch.Tensor:
    """(T, T) bool: key k is a later token of the same image as query q (an unbroken run
    of image tokens). Runs are told apart by the count of text tokens before each token
    (a matmul with a constant lower triangle: no cumsum op needed)."""
    tokens = is_image.shape[0]
    lower = torch.ones(tokens, tokens, device=is_image.device).tril()
    text_before = torch.matmul(lower, (~is_image).to(lower.dtype)[:, None])[:, 0]
    same_run = text_before[:, None] == text_before[None, :]
    later = torch.ones(tokens, tokens, dtype=torch.bool, device=is_image.device).triu(1)
    return is_image[:, None] & is_image[None, :] & same_run & later


class ImageEncoder(nn.Module):
    """`forward(pixel_values (images, 3, S, S)) -> (1, images * tokens_per_image, hidden)`:
    the model's own `get_image_features` (SmolVLM: the vision model and connector it runs,
    see `VLMFamily.tower_and_connector`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.family = model, family(model)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.family.tower_and_connector:
            inner = self.model.model
            features = inner.connector(inner.vision_model(pixel_values=pixel_values).last_hidden_state)
        else:
            features = self.model.get_image_features(pixel_values, return_dict=True).pooler_output
        return features.reshape(1, -1, features.shape[-1])


class CachedVLMPrefill(nn.Module):
    """`forward(tokens, input_pos, image_embeds, kv_cache) -> (logits?, *new_cache)`: the
    chunk's token embeddings with the image rows selected at image tokens, through the
    model's own forward with the explicit cache."""

    def __init__(self, model: nn.Module, cache_len: int, logits: str = "last"):
        super().__init__()
        self.lm = with_kv_cache(model, cache_len, logits)
        self.model, self.image_token_id = model, image_token_id(model)
        self.family = family(model)
        self.cache_len, self.logits = cache_len, logits

    def cache_shapes(self):
        return self.lm.cache_shapes()

    def empty_cache(self):
        return self.lm.empty_cache()

    def merged_embeds(self, tokens, image_embeds):
        """The chunk's token embeddings with `image_embeds`' rows at the image tokens."""
        is_image = tokens == self.image_token_id  # (1, T)
        # the image id may lie outside the vocabulary (the model replaces it before the lookup too)
        ids = torch.where(is_image, torch.zeros_like(tokens), tokens)
        embeds = self.model.get_input_embeddings()(ids)
        return torch.where(is_image[..., None], image_embeds.to(embeds.dtype), embeds)

    def forward(self, tokens, input_pos, image_embeds, kv_cache):
        merged = self.merged_embeds(tokens, image_embeds)
        overlay = None
        if self.family.prefix_lm:
            overlay = prompt_prefix(input_pos)
        elif self.family.bidirectional_images:
            overlay = image_blocks((tokens == self.image_token_id)[0])
        return self.lm.inner(tokens, input_pos, kv_cache, inputs_embeds=merged, overlay=overlay)


def place_image_rows(prompt: np.ndarray, image_embeds: np.ndarray, image_id: int) -> np.ndarray:
    """(len(prompt), hidden): image embedding rows in order at the image-token positions
    of `prompt`, zeros elsewhere (what the model's masked_scatter does)."""
    rows = image_embeds.reshape(-1, image_embeds.shape[-1])
    where = np.flatnonzero(prompt == image_id)
    if where.size != rows.shape[0]:
        raise ValueError(
            f"prompt_ids has {where.size} image tokens (id {image_id}); the image gives {rows.shape[0]} "
            "embeddings: put one image token per embedding (e.g. Gemma 3: mm_tokens_per_image per image)"
        )
    placed = np.zeros((prompt.size, rows.shape[1]), np.float32)
    placed[where] = rows
    return placed


def plan_chunks(
    prompt: np.ndarray, chunk: int, image_id: int, cache_len: int, whole_prompt: bool = False
) -> list[tuple[int, int]]:
    """(start, stop) of prefill chunks of at most `chunk` tokens over `prompt`. A run of
    image tokens that fits a chunk is never split (an image that attends to itself both
    ways, Gemma 3's, must come in one chunk; export_vlm refuses a prefill shorter than such
    an image); a longer run (a causal family's many tiles) is split like text. With
    `whole_prompt` (a prefix-LM: the prompt attends to itself both ways) one chunk."""
    if whole_prompt:
        if prompt.size > chunk:
            raise ValueError(
                f"prompt_ids ({prompt.size} tokens) must fit one prefill chunk ({chunk}): this model's prompt "
                f"attends to itself both ways (PaliGemma's prefix-LM); export with prefill_len >= {prompt.size}"
            )
        return [(0, prompt.size)]
    runs, start = [], None
    for i, flag in enumerate(list(prompt == image_id) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start <= chunk:
                runs.append((start, i))
            start = None
    plan, done = [], 0
    while done < prompt.size:
        stop = min(done + chunk, prompt.size)
        for a, b in runs:
            if a < stop < b:  # the chunk would split this image: end it before the image
                stop = a
        plan.append((done, stop))
        done = stop
    if plan and plan[-1][0] + chunk > cache_len:
        raise ValueError(
            f"the prompt ({prompt.size} tokens) does not fit the cache ({cache_len}) in chunks of {chunk}; "
            "export with a larger cache_len"
        )
    return plan


def exported_cache_len(decode) -> int | None:
    """The linear cache's length in a decode signature (None: ring buffers only)."""
    return max((s.shape[2] for s in decode.outputs[1:] if s.name.startswith("kv_cache")), default=None)
