"""Vision-language models: an image encoder and a decoder whose prefill takes image
embeddings, as LiteRT signatures sharing weights, and generation in LiteRT.

    edge = export_vlm(Gemma3ForConditionalGeneration(config), prefill_len=32, cache_len=128)
    new_ids = generate_vlm(edge, pixel_values, prompt_ids, 20, image_token_id=config.image_token_id)

Families (`FAMILIES`): Gemma 3, SmolVLM and Idefics3 (their image splitting as a fixed
grid: `tiles=`), PaliGemma; Qwen2-VL and Qwen2.5-VL (`grids=`: their image grids; their
rotary positions an input of prefill and decode, see `qwen_vl`).

Signatures (the decoder's cache tensors as in `export.py`):

    encode_image(pixel_values float32[images, 3, S, S]) -> image_embeds float32[1, images * T, hidden]
    prefill(tokens int32[1, P], input_pos int32[P], image_embeds float32[1, P, hidden], kv_cache_*)
    decode (tokens int32[1, 1], input_pos int32[1], kv_cache_*)
      -> (logits float32[1, n, vocab], kv_{cache|ring}_*)

`encode_image` is the model's own `get_image_features` (vision tower and projector).
Prefill's `image_embeds` holds, at each image-token position of the chunk, the image
embedding that goes there (the host places the rows, in order, as the model's
`masked_scatter` does; other rows are ignored): inside the signature the token
embeddings are looked up and the image rows selected where `tokens == image_token_id`
(EQUAL + SELECT_V2), then the model's own forward runs on those `inputs_embeds` with the
explicit cache of `transformers_lm`. Gemma 3 lets the tokens of one image attend to each
other both ways (its `token_type_ids` mask): the prefill adds those keys to each query's
causal mask (`image_blocks`), so an image's tokens must come in one prefill chunk
(`generate_vlm` plans chunks so; a chunk shorter than an image is refused). PaliGemma's
whole prompt attends both ways (its prefix-LM, token_type_ids 0): the prefill adds every
later real token of the chunk (`prompt_prefix`), the prompt comes in one chunk, and the
signature is named `prefill_whole_prompt` so that a runtime knows (`generate_vlm` prefills
the whole prompt, then decodes its last token again for its logits: the same keys and
values, now with the logits of a query that sees the whole prompt, as it did in prefill).

Exact or refused: families are checked by name (`check_vlm`), the text path by
`verify_cached_lm`, and the image path by `verify_vlm` (prompt with an image, prefill
chunks and decode steps in PyTorch against the model's own forward with `pixel_values`,
every logit within 1e-4) before anything is converted.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from litert_torch.edge_model import EdgeModel
from litert_torch.generative import qwen_vl
from litert_torch.generative.export import (
    CachedHFCausalLM,
    _prefill_lengths,
    cache_tensor_names,
    verify_cached_lm,
    with_kv_cache,
)
from litert_torch.generative.generate import _sampler, _split, check_vocabulary, logits_vocabulary, one_sequence
from litert_torch.generative.kv_cache import check_positions
from litert_torch.generative.transformers_lm import UnsupportedModelError, attention_through_litert, text_config
from litert_torch.generative.vlm_common import (  # noqa: F401  (vlm's names, as before)
    FAMILIES,
    PREFILL,
    PREFILL_WHOLE_PROMPT,
    REFUSED,
    SUPPORTED,
    TOLERANCE,
    CachedVLMPrefill,
    ImageEncoder,
    VLMFamily,
    check_vlm,
    exported_cache_len,
    family,
    image_blocks,
    image_token_id,
    place_image_rows,
    plan_chunks,
    prompt_prefix,
)
from litert_torch.signatures import signature


def image_shape(model: nn.Module, images: int = 1) -> tuple[int, int, int, int]:
    vision = model.config.vision_config
    return (images, getattr(vision, "num_channels", 3), vision.image_size, vision.image_size)


def tokens_per_image(model: nn.Module) -> int:
    """Image tokens per image (tile): Gemma 3's mm_tokens_per_image; SmolVLM's patches
    after its pixel shuffle."""
    cfg = model.config
    if hasattr(cfg, "mm_tokens_per_image"):
        return int(cfg.mm_tokens_per_image)
    if hasattr(text_config(model), "num_image_tokens"):  # PaliGemma: one token per patch
        return int(text_config(model).num_image_tokens)
    patches = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    return int(patches // cfg.scale_factor**2)


def reference_forward(model: nn.Module, ids: torch.Tensor, pixel_values: torch.Tensor, prompt_len: int | None = None):
    """The model's own forward over a whole sequence with its image (no cache): logits.
    `prompt_len`: where the prompt ends (PaliGemma's prefix; default: the whole sequence)."""
    kwargs, fam = {}, family(model)
    if fam.mrope:  # pixel_values: the images (channels, height, width), one or a list
        return qwen_vl.reference_forward(model, ids, *qwen_vl.model_patches(model, pixel_values))
    if fam.bidirectional_images:
        kwargs["token_type_ids"] = (ids == image_token_id(model)).long()
    if fam.prefix_lm:  # as its processor and generate give them: 0 for the prompt, 1 after
        kwargs["token_type_ids"] = (torch.arange(ids.shape[1]) >= (prompt_len or ids.shape[1])).long()[None]
    if fam.batched_pixels:
        pixel_values = pixel_values[None]
    out = model(input_ids=ids.long(), pixel_values=pixel_values, **kwargs)
    return out.logits


@torch.no_grad()
def verify_vlm(
    model: nn.Module, cache_len: int, prefill_len: int, steps: int = 24, tolerance: float = TOLERANCE
) -> float:
    """A prompt with an image (text, the image's tokens, text) through the image encoder,
    prefill chunks and decode steps in PyTorch, against the model's own forward with
    `pixel_values`: max relative error of the logits at every position (raises
    UnsupportedModelError above `tolerance`)."""
    from runtimes.litert import max_relative_error

    gen = torch.Generator().manual_seed(0)
    n_image = tokens_per_image(model)
    vocab = text_config(model).vocab_size
    image_id = image_token_id(model)
    total = min(cache_len, max(steps, n_image + 2 * prefill_len))
    ids = torch.randint(0, vocab, (1, total), generator=gen)
    ids[ids == image_id] = (image_id + 1) % vocab
    fam = family(model)
    if fam.prefix_lm:  # the image first, as PaliGemma's processor puts it; the prompt in one chunk
        first = 0
    elif fam.bidirectional_images:  # image after a little text, in the first chunk (it must fit)
        first = min(3, prefill_len - n_image)
    else:  # image across the first chunk's end
        first = max(1, prefill_len - n_image // 2)
    total = min(cache_len, max(total, first + n_image + prefill_len))
    if first + n_image >= total:
        raise ValueError(f"verify needs a cache longer than an image ({n_image} tokens), got cache_len={cache_len}")
    ids[0, first : first + n_image] = image_id
    pixel_values = torch.randn(image_shape(model), generator=gen)
    n_prompt = min(total - 1, first + n_image + prefill_len // 2)
    if fam.prefix_lm:
        n_prompt = min(n_prompt, prefill_len)
    expected = reference_forward(model, ids, pixel_values, prompt_len=n_prompt).float()
    prefill = CachedVLMPrefill(model, cache_len, logits="all")
    image_embeds = ImageEncoder(model)(pixel_values)
    prompt = ids[0].numpy().astype(np.int32)
    placed = torch.from_numpy(place_image_rows(prompt[:n_prompt], image_embeds.numpy(), image_id))
    cache, got = prefill.empty_cache(), []
    with attention_through_litert(model):
        for start, stop in plan_chunks(prompt[:n_prompt], prefill_len, image_id, cache_len, fam.prefix_lm):
            tokens = torch.zeros(1, prefill_len, dtype=torch.int32)
            tokens[0, : stop - start] = ids[0, start:stop]
            positions = torch.full((prefill_len,), -1, dtype=torch.int32)
            positions[: stop - start] = torch.arange(start, stop, dtype=torch.int32)
            rows = torch.zeros(1, prefill_len, placed.shape[1])
            rows[0, : stop - start] = placed[start:stop]
            logits, *cache = prefill(tokens, positions, rows, cache)
            got.append(logits[:, : stop - start])
        for pos in range(n_prompt, total):
            logits, *cache = prefill.lm(ids[:, pos : pos + 1].int(), torch.tensor([pos], dtype=torch.int32), cache)
            got.append(logits)
    error = max_relative_error(torch.cat(got, dim=1).numpy(), expected.numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{type(model).__name__}: with an image, the cached model's logits differ from the model's own "
            f"forward by {error:.3g} (max relative, over {total} positions); refusing to export a different model"
        )
    return error


def export_vlm(
    model: nn.Module,
    *,
    prefill_len: int = 32,
    cache_len: int = 128,
    images: int = 1,
    tiles: tuple[int, int] | None = None,
    grids: list[tuple[int, int, int]] | None = None,
    prefill_logits: str = "last",
    verify: bool = True,
    **convert_options,
) -> EdgeModel:
    """Convert a vision-language model into `encode_image`, `prefill` and `decode`
    signatures sharing its weights (see the module docstring). `images`: how many images
    (tiles) `encode_image` takes per call, a fixed size; `tiles=(rows, cols)`: SmolVLM's
    image splitting as a fixed grid, `images = rows * cols + 1` (the tiles and the whole
    image, as `tile_image` makes them). `grids=[(1, h, w), ...]`: Qwen2-VL / Qwen2.5-VL's
    image grids in patches, one `encode_image_<h>x<w>` signature each (see `qwen_vl`).
    `verify`: check the text path
    and the image path against the model's own forward in PyTorch first (refuses above
    1e-4). `convert_options` go to `convert` (quant_config, target, progress...)."""
    from converter.pipeline import cpu_view

    check_vlm(model)
    fam = family(model)
    if fam.mrope or grids is not None:
        if not fam.mrope:
            raise ValueError(f"grids= is for Qwen2-VL / Qwen2.5-VL; {type(model).__name__} takes images= or tiles=")
        if images != 1 or tiles is not None:
            raise ValueError(
                "Qwen2-VL / Qwen2.5-VL take their image sizes as grids=[(1, h, w), ...], not images=/tiles="
            )
        if not isinstance(prefill_len, int):
            raise ValueError(f"prefill_len must be one int for a vision-language model, got {prefill_len!r}")
        _prefill_lengths(prefill_len, cache_len)  # checks the range
        return qwen_vl.export(model, grids, prefill_len, cache_len, prefill_logits, verify, **convert_options)
    if tiles is not None:
        if images != 1:
            raise ValueError(f"pass either images ({images}) or tiles ({tiles!r}), not both")
        images = _tile_count(tiles)
    if not isinstance(images, int) or images < 1:
        raise ValueError(f"images must be an int >= 1, got {images!r}")
    if not isinstance(prefill_len, int):
        raise ValueError(f"prefill_len must be one int for a vision-language model, got {prefill_len!r}")
    _prefill_lengths(prefill_len, cache_len)  # checks the range
    if fam.bidirectional_images and tokens_per_image(model) > prefill_len:
        raise ValueError(
            f"prefill_len ({prefill_len}) is shorter than an image ({tokens_per_image(model)} tokens), whose "
            "tokens attend to each other in one prefill chunk"
        )
    if fam.prefix_lm and tokens_per_image(model) * images >= prefill_len:
        raise ValueError(
            f"prefill_len ({prefill_len}) must hold the whole prompt, images ({tokens_per_image(model) * images} "
            "tokens) and text: the prompt attends to itself both ways (PaliGemma's prefix-LM)"
        )
    model = cpu_view(model).eval()
    if verify:
        if not fam.prefix_lm:  # a prefix-LM's own text-only forward attends both ways over everything
            verify_cached_lm(model, cache_len, prefill_len)
        verify_vlm(model, cache_len, prefill_len)
    prefill = CachedVLMPrefill(model, cache_len, prefill_logits)
    decode = with_kv_cache(model, cache_len, "last")
    assert isinstance(decode, CachedHFCausalLM)
    names = cache_tensor_names(decode)
    hidden = text_config(model).hidden_size
    prefill_args = (
        torch.zeros(1, prefill_len, dtype=torch.int32),
        torch.arange(prefill_len, dtype=torch.int32),
        torch.zeros(1, prefill_len, hidden),
        prefill.empty_cache(),
    )
    decode_args = (torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), decode.empty_cache())
    return (
        signature(
            "encode_image",
            ImageEncoder(model),
            (torch.zeros(image_shape(model, images)),),
            output_names=["image_embeds"],
        )
        .signature(
            PREFILL_WHOLE_PROMPT if fam.prefix_lm else PREFILL,
            prefill,
            prefill_args,
            output_names=([] if prefill_logits == "none" else ["logits"]) + names,
        )
        .signature("decode", decode, decode_args, output_names=["logits"] + names)
        .convert(**convert_options)
    )


def generate_vlm(
    edge_model: EdgeModel,
    pixel_values,
    prompt_ids,
    max_new_tokens: int,
    *,
    image_token_id: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    sampler=None,
    image_grid_thw=None,
) -> list[int]:
    """Continuation of `prompt_ids` (with one `image_token_id` per image embedding) about
    `pixel_values` (images, 3, S, S) with a model from `export_vlm`, in LiteRT. The prompt
    is prefilled in chunks that never split an image, all but its last token, which goes
    through `decode` (it must be text); with `prefill_whole_prompt` (PaliGemma) in one
    chunk, all of it, and its last token through `decode` again. Qwen2-VL / Qwen2.5-VL:
    `pixel_values` is an image (3, H, W), resized and normalised, or a list of them (empty:
    text only), each through the `encode_image_<h>x<w>` of its size, with their rotary
    positions (`qwen_vl`); or, with `image_grid_thw`, the processor's flattened patches. Greedy unless `temperature` > 0 (see `generate`)."""
    prompt = one_sequence(prompt_ids)
    sampler = sampler or _sampler(temperature, top_k, top_p, seed)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if prompt[-1] == image_token_id:
        raise ValueError("prompt_ids must end with a text token after the image (e.g. the end-of-image token)")
    runtime = edge_model.runtime
    decode = runtime.signature("decode")
    check_vocabulary(prompt, logits_vocabulary(decode))
    mrope = "rope_pos" in decode.input_names  # Qwen2-VL: pixel_values are images, their grids by size
    text_only = not (prompt == image_token_id).any() and (pixel_values is None or not np.size(pixel_values))
    if not mrope:  # a prompt without images prefills without encode_image (its image rows are unused)
        pixels = None if text_only else _checked_pixels(runtime, pixel_values)
    if max_new_tokens == 0:
        return []
    cache_len = exported_cache_len(decode)
    if cache_len is not None and len(prompt) + max_new_tokens > cache_len:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the exported cache length "
            f"({cache_len}); export with a larger cache_len"
        )
    if mrope:
        cache, rope = qwen_vl.prefill_prompt(edge_model, pixel_values, prompt, image_token_id, image_grid_thw)
    else:
        # A prefix-LM's prompt is prefilled whole (its tokens see the last one); its last token
        # then runs again through decode for its logits, writing the same keys and values.
        whole = PREFILL_WHOLE_PROMPT in [s.key for s in runtime.signatures]
        cache = prefill_prompt(edge_model, pixels, prompt if whole else prompt[:-1], image_token_id)
        rope = lambda pos: []  # noqa: E731

    def step(token: np.ndarray, pos: int):
        return runtime.run([token, np.array([pos], np.int32), *rope(pos), *cache], "decode")

    rng = sampler.rng()
    pos = len(prompt) - 1
    logits, *cache = step(prompt[None, pos:], pos)
    out = [sampler(logits[0, -1], rng)]
    stop = {int(t) for t in stop_tokens}
    for pos in range(len(prompt), len(prompt) + max_new_tokens - 1):
        if out[-1] in stop:
            break
        logits, *cache = step(np.array([[out[-1]]], np.int32), pos)
        out.append(sampler(logits[0, -1], rng))
    return out


def _checked_pixels(runtime, pixel_values) -> np.ndarray:
    encode = runtime.signature("encode_image")
    pixels = np.asarray(pixel_values.detach().cpu() if isinstance(pixel_values, torch.Tensor) else pixel_values)
    pixels = pixels.astype(np.float32)
    if pixels.shape != tuple(encode.inputs[0].shape):
        raise ValueError(
            f"pixel_values has shape {pixels.shape}; the model was exported for {tuple(encode.inputs[0].shape)} "
            "(images, channels, height, width)"
        )
    empty = [i for i in range(pixels.shape[0]) if not pixels[i].any()]
    if empty:
        raise ValueError(
            f"pixel_values image {empty[0]} is all zeros, which SmolVLM's forward drops as padding: "
            "pass only real images (tiles)"
        )
    return pixels


def _tile_count(tiles) -> int:
    if not (isinstance(tiles, (tuple, list)) and len(tiles) == 2 and all(isinstance(t, int) and t >= 1 for t in tiles)):
        raise ValueError(f"tiles must be (rows, cols) of ints >= 1, got {tiles!r}")
    return tiles[0] * tiles[1] + (tiles[0] * tiles[1] > 1)


def tile_image(image, tiles: tuple[int, int], size: int) -> torch.Tensor:
    """SmolVLM's image splitting with a grid the user fixes: `image` (3, H, W), already
    normalised, resized to (rows * size, cols * size) and cut into rows x cols tiles (row
    by row), followed by the whole image resized to (size, size) -> (rows * cols + 1, 3,
    size, size); one tile, (1, 3, size, size), for a 1 x 1 grid. Bilinear resizing with
    antialiasing: the processor's resampling differs, so pass its tiles where they must
    match it."""
    count = _tile_count(tiles)
    image = torch.as_tensor(np.asarray(image, dtype=np.float32))
    if image.ndim != 3:
        raise ValueError(f"image must be (channels, height, width), got shape {tuple(image.shape)}")
    rows, cols = tiles

    def resize(height, width):
        return torch.nn.functional.interpolate(
            image[None], size=(height, width), mode="bilinear", antialias=True, align_corners=False
        )[0]

    whole = resize(size, size)[None]
    if count == 1:
        return whole
    grid = resize(rows * size, cols * size)
    parts = grid.reshape(image.shape[0], rows, size, cols, size).permute(1, 3, 0, 2, 4)
    return torch.cat([parts.reshape(rows * cols, image.shape[0], size, size), whole])


def prefill_prompt(
    edge_model: EdgeModel, pixel_values: np.ndarray | None, prompt: np.ndarray, image_token_id: int
) -> list:
    """Run `encode_image` (None: a prompt without images) and the prefill chunks over `prompt`
    (which may end with the image); returns the cache after it (the next position is len(prompt))."""
    runtime = edge_model.runtime
    whole = PREFILL_WHOLE_PROMPT in [s.key for s in runtime.signatures]
    name = PREFILL_WHOLE_PROMPT if whole else PREFILL
    prefill, decode = runtime.signature(name), runtime.signature("decode")
    cache_len = exported_cache_len(decode)
    if pixel_values is None:  # a prompt without images
        placed = np.zeros((prompt.size, prefill.inputs[2].shape[2]), np.float32)
    else:
        (image_embeds,) = runtime.run([pixel_values], "encode_image")
        placed = place_image_rows(prompt, image_embeds, image_token_id)
    chunk = prefill.inputs[0].shape[1]
    has_logits = prefill.output_names[0] == "logits"
    cache = [np.zeros(spec.shape, spec.dtype) for spec in decode.inputs[2:]]
    limit = cache_len if cache_len is not None else np.iinfo(np.int32).max
    for start, stop in plan_chunks(prompt, chunk, image_token_id, limit, whole) if prompt.size else []:
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, : stop - start] = prompt[start:stop]
        positions = np.full(chunk, -1, np.int32)
        positions[: stop - start] = np.arange(start, stop)
        check_positions(positions, cache_len)
        rows = np.zeros((1, chunk, placed.shape[1]), np.float32)
        rows[0, : stop - start] = placed[start:stop]
        _, *cache = _split(runtime.run([tokens, positions, rows, *cache], name), has_logits)
    return cache


@torch.no_grad()
def reference_generate_vlm(
    model: nn.Module,
    pixel_values,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
) -> list[int]:
    """The same continuation in PyTorch without a cache: the model's own forward over the
    whole sequence with `pixel_values` at every step (the reference `generate_vlm` must
    match)."""
    sampler = _sampler(temperature, top_k, top_p, seed)
    stop = {int(t) for t in stop_tokens}
    ids = torch.as_tensor(one_sequence(prompt_ids), dtype=torch.long)[None]
    pixels = pixel_values if family(model).mrope else torch.as_tensor(np.asarray(pixel_values, dtype=np.float32))
    rng, out, prompt_len = sampler.rng(), [], ids.shape[1]
    for _ in range(max_new_tokens):
        logits = reference_forward(model, ids, pixels, prompt_len=prompt_len)
        out.append(sampler(logits[0, -1].float().numpy(), rng))
        if out[-1] in stop:
            break
        ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
    return out
