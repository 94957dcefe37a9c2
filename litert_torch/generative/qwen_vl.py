"""Qwen2-VL and Qwen2.5-VL through `export_vlm`: multimodal rotary positions (M-RoPE)
as an input, computed on the host, and the vision tower for fixed image grids.

    edge = export_vlm(model, grids=[(1, 16, 16), (1, 16, 24)], prefill_len=32, cache_len=256)
    new_ids = generate_vlm(edge, image, prompt_ids, 20, image_token_id=config.image_token_id)

Signatures (the decoder's cache tensors as in `export.py`):

    encode_image_<h>x<w>(pixel_values float32[h * w, C * temporal_patch * patch**2])
      -> image_embeds float32[1, h * w / merge**2, hidden]          one per grid (1, h, w)
    prefill(tokens int32[1, P], input_pos int32[P], rope_pos int32[3, P], image_embeds float32[1, P, hidden], kv_*)
    decode (tokens int32[1, 1], input_pos int32[1], rope_pos int32[3, 1], kv_*)

`input_pos` is the token's index in the sequence (its cache slot); `rope_pos` its
(temporal, height, width) rotary positions: a text token's three are equal, an image
token's are its grid cell offset by where the image starts, and the text after an image
continues after the image's largest position (`rope_positions`, the rule of
transformers' `get_rope_index` for still images). The grid (in patches) is fixed per
`encode_image` signature: the vision tower's patch positions, attention blocks (one per
image; Qwen2.5-VL's windows) and window order are constants of the export, so each grid
is a signature of its own (the weights are stored once). `pixel_values` are the
flattened patches Qwen's image processor makes (`patchify` makes them from a resized,
normalised image). The vision tower is the model's own (`visual`, with its patch merger);
its attention goes through `packed_attention`, a mask that keeps attention within each
block. Video (a temporal grid above 1) is refused; a prompt holds image tokens and text
(video tokens would be taken for text: the file does not know `video_token_id`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from litert_torch.generative import vlm_common
from litert_torch.generative.attention import grouped_attention
from litert_torch.generative.export import cache_tensor_names, verify_cached_lm, with_kv_cache
from litert_torch.generative.generate import _split
from litert_torch.generative.kv_cache import MASKED_SCORE, check_positions
from litert_torch.generative.transformers_lm import UnsupportedModelError
from litert_torch.signatures import signature

# "flash" in the name makes transformers' Qwen vision attention pass the blocks' boundaries
# (cu_seqlens, as to a varlen flash kernel) instead of splitting by them with .tolist().
VISION_ATTENTION = "litert_flash_packed_vision"


def merge_size(model: nn.Module) -> int:
    return int(model.config.vision_config.spatial_merge_size)


def check_grid(model: nn.Module, grid) -> tuple[int, int, int]:
    """(t, h, w) of a still image in patches, h and w multiples of the merge size."""
    name = type(model).__name__
    if not (isinstance(grid, (tuple, list)) and len(grid) == 3 and all(isinstance(g, int) and g >= 1 for g in grid)):
        raise ValueError(f"{name}: a grid is (t, h, w) in patches, ints >= 1, got {grid!r}")
    t, h, w = grid
    if t != 1:
        raise UnsupportedModelError(
            f"{name}: grid {tuple(grid)} has t={t}: video input (temporal patches > 1) is not supported; "
            "export still images, t=1 (video would need video-token positions spaced by tokens_per_second "
            "and a tower signature per frame count)"
        )
    m = merge_size(model)
    if h % m or w % m:
        raise ValueError(f"{name}: grid {tuple(grid)}: h and w must be multiples of spatial_merge_size ({m})")
    return t, h, w


def image_tokens(model: nn.Module, grid) -> int:
    t, h, w = grid
    return t * h * w // merge_size(model) ** 2


def patchify(image, patch: int, merge: int, temporal_patch: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`image` (C, H, W), resized and normalised, H and W multiples of patch * merge ->
    (flattened patches (h * w, C * temporal_patch * patch**2), grid (1, h, w)), in the
    order of Qwen's image processor: merge blocks row by row, the patches of a block row
    by row, each patch as (channel, time, row, col) with the image repeated over time."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if image.ndim != 3:
        raise ValueError(f"image must be (channels, height, width), got shape {image.shape}")
    c, height, width = image.shape
    if height % (patch * merge) or width % (patch * merge):
        raise ValueError(
            f"image is {height} x {width}; height and width must be multiples of patch_size * spatial_merge_size "
            f"({patch * merge}): resize it as Qwen's image processor does"
        )
    h, w = height // patch, width // patch
    blocks = image.reshape(c, h // merge, merge, patch, w // merge, merge, patch).transpose(1, 4, 2, 5, 0, 3, 6)
    repeated = np.repeat(blocks[:, :, :, :, :, None], temporal_patch, axis=5)
    return np.ascontiguousarray(repeated.reshape(h * w, c * temporal_patch * patch * patch)), (1, h, w)


def rope_positions(prompt, image_token_id: int, grids, merge: int) -> np.ndarray:
    """(3, len(prompt)) int32 rotary positions: text tokens count on by one, the n-th run of
    image tokens takes grids[n]'s cells (temporal = start, height = start + row, width =
    start + col, in merge blocks) and the text after it starts at the image's start +
    max(rows, cols). A later token at sequence index i has positions i + `rope_delta`."""
    prompt = np.asarray(prompt)
    out = np.zeros((3, prompt.size), np.int64)
    grids = list(grids)
    i, pos = 0, 0
    while i < prompt.size:
        if prompt[i] != image_token_id:
            out[:, i] = pos
            i, pos = i + 1, pos + 1
            continue
        stop = i
        while stop < prompt.size and prompt[stop] == image_token_id:
            stop += 1
        if not grids:
            raise ValueError(f"prompt_ids has more runs of image tokens (id {image_token_id}) than images")
        t, h, w = grids.pop(0)
        rows, cols = h // merge, w // merge
        if stop - i != t * rows * cols:
            raise ValueError(
                f"prompt_ids has a run of {stop - i} image tokens at {i}; its image (grid {(t, h, w)}) gives "
                f"{t * rows * cols}: put one image token per merged patch"
            )
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        out[:, i:stop] = pos + np.stack([tt.ravel(), hh.ravel(), ww.ravel()])
        i, pos = stop, pos + max(rows, cols)
    if grids:
        raise ValueError(f"prompt_ids has fewer runs of image tokens (id {image_token_id}) than images")
    return out.astype(np.int32)


def rope_delta(positions: np.ndarray) -> int:
    """What a token after the prompt adds to its sequence index for its rotary positions."""
    return int(positions.max()) + 1 - positions.shape[1] if positions.size else 0


def packed_attention(module, query, key, value, attention_mask, scaling=None, cu_seq_lens_q=None, **kwargs):
    """transformers' attention-function signature for the vision tower: (1, H, N, D) over
    N patches in blocks (`cu_seq_lens_q`, cumulative block lengths, a constant of the
    export): each patch attends within its block -> ((1, N, H, D), None)."""
    n = query.shape[2]
    index = torch.arange(n, device=query.device)
    block = (index[:, None] >= cu_seq_lens_q[None, 1:-1].to(index.dtype)).sum(-1)
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    bias = torch.where(block[:, None] == block[None, :], zero, torch.full_like(zero, MASKED_SCORE))
    out = grouped_attention(query, key, value, bias, scaling if scaling is not None else query.shape[-1] ** -0.5)
    return out.transpose(1, 2), None


@contextlib.contextmanager
def vision_through_litert(visual: nn.Module):
    from transformers import AttentionInterface

    AttentionInterface.register(VISION_ATTENTION, packed_attention)
    before = visual.config._attn_implementation
    visual.config._attn_implementation = VISION_ATTENTION
    try:
        yield
    finally:
        visual.config._attn_implementation = before


def tower_constants(model: nn.Module, grid) -> dict:
    """What the vision tower computes from the grid, computed once for the export (the
    keyword arguments transformers' tower takes precomputed)."""
    from transformers import vision_utils

    visual, grid_thw = model.model.visual, torch.tensor([grid])
    out = {
        "position_ids": vision_utils.get_vision_position_ids(grid_thw, visual.spatial_merge_size),
        "cu_seqlens": vision_utils.get_vision_cu_seqlens(grid_thw),
    }
    out["max_seqlen"] = int((out["cu_seqlens"][1:] - out["cu_seqlens"][:-1]).max())
    if hasattr(visual, "window_size"):  # Qwen2.5-VL: windowed layers, patches in window order
        index, cu = vision_utils.get_vision_window_index(
            grid_thw, visual.spatial_merge_size, visual.window_size, visual.patch_size
        )
        out.update(window_index=index, cu_window_seqlens=cu, max_window_seqlen=int((cu[1:] - cu[:-1]).max()))
    return out


class QwenImageEncoder(nn.Module):
    """`forward(pixel_values (h * w, patch_dim)) -> (1, image tokens, hidden)`: the model's
    vision tower and patch merger for one fixed grid."""

    def __init__(self, model: nn.Module, grid):
        super().__init__()
        self.grid = check_grid(model, grid)
        self.visual = model.model.visual
        self.constants = tower_constants(model, self.grid)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        with vision_through_litert(self.visual):
            out = self.visual(
                pixel_values.to(self.visual.dtype), grid_thw=torch.tensor([self.grid]), **self.constants
            ).pooler_output
        return out[None]


def encoder_name(grid) -> str:
    return f"encode_image_{grid[1]}x{grid[2]}"


def grid_of(name: str) -> tuple[int, int, int]:
    h, w = name.rsplit("_", 1)[1].split("x")
    return 1, int(h), int(w)


def reference_forward(model: nn.Module, ids: torch.Tensor, pixel_values, grids) -> torch.Tensor:
    """The model's own forward over a whole sequence with its images (no cache): logits."""
    image_id = int(model.config.image_token_id)
    images = dict(pixel_values=torch.as_tensor(pixel_values), image_grid_thw=torch.tensor([list(g) for g in grids]))
    return model(input_ids=ids.long(), mm_token_type_ids=(ids == image_id).int(), **(images if grids else {})).logits


def as_images(pixel_values) -> list[np.ndarray]:
    """An image (C, H, W), images of one size (N, C, H, W), or a list of images (any sizes;
    empty: a text-only prompt) -> a list of (C, H, W) float32 arrays."""
    if isinstance(pixel_values, (torch.Tensor, np.ndarray)):
        pixel_values = [pixel_values] if pixel_values.ndim == 3 else list(pixel_values)
    images = []
    for image in pixel_values:
        image = np.asarray(image.detach().cpu() if isinstance(image, torch.Tensor) else image, dtype=np.float32)
        if image.ndim != 3:
            raise ValueError(f"an image must be (channels, height, width), got shape {image.shape}")
        images.append(image)
    return images


def model_patches(model: nn.Module, pixel_values) -> tuple[torch.Tensor | None, list[tuple[int, int, int]]]:
    """The images' flattened patches, concatenated as Qwen's processor gives them, and their
    grids (None, []: no images)."""
    vision = model.config.vision_config
    pairs = [
        patchify(image, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        for image in as_images(pixel_values)
    ]
    if not pairs:  # a text-only prompt
        return None, []
    return torch.from_numpy(np.concatenate([p for p, _ in pairs])), [g for _, g in pairs]


def text_hidden(model: nn.Module) -> int:
    return int(model.config.get_text_config().hidden_size)


class CachedMRoPEPrefill(vlm_common.CachedVLMPrefill):
    """`forward(tokens, input_pos, rope_pos (3, T), image_embeds, kv_cache)`: the chunk's
    embeddings with its image rows, rotated at `rope_pos`, written at slots `input_pos`."""

    def forward(self, tokens, input_pos, rope_pos, image_embeds, kv_cache):
        merged = self.merged_embeds(tokens, image_embeds)
        return self.lm.inner(tokens, input_pos, kv_cache, inputs_embeds=merged, rope_pos=rope_pos)


class CachedMRoPEDecode(nn.Module):
    """`forward(tokens, input_pos, rope_pos (3, 1), kv_cache) -> (logits, *new_cache)`."""

    def __init__(self, model: nn.Module, cache_len: int):
        super().__init__()
        self.lm = with_kv_cache(model, cache_len, "last")

    def empty_cache(self):
        return self.lm.empty_cache()

    def forward(self, tokens, input_pos, rope_pos, kv_cache):
        return self.lm.inner(tokens, input_pos, kv_cache, rope_pos=rope_pos)


def verify_prompt(model: nn.Module, grids, total: int, seed: int = 0) -> torch.Tensor:
    """(1, total) ids: a little text before each image's tokens, then text."""
    gen = torch.Generator().manual_seed(seed)
    image_id, vocab = int(model.config.image_token_id), int(model.config.get_text_config().vocab_size)

    def text(n: int) -> list[int]:
        words = torch.randint(0, vocab, (n,), generator=gen)
        return torch.where(words == image_id, (image_id + 1) % vocab, words).tolist()

    ids = []
    for grid in grids:
        ids += text(3) + [image_id] * image_tokens(model, grid)
    return torch.tensor([ids + text(total - len(ids))])


@torch.no_grad()
def verify(model: nn.Module, grids, cache_len: int, prefill_len: int, tolerance: float = vlm_common.TOLERANCE) -> float:
    """A prompt with one image per grid through the image encoders, prefill chunks (with
    their rotary positions) and decode steps in PyTorch, against the model's own forward
    with `pixel_values` and `image_grid_thw`: max relative error of the logits at every
    position (raises UnsupportedModelError above `tolerance`)."""
    from runtimes.litert import max_relative_error

    image_id = int(model.config.image_token_id)
    n_images = sum(3 + image_tokens(model, g) for g in grids)
    total = n_images + prefill_len + 8
    if total > cache_len:
        raise ValueError(
            f"verify needs a cache of {total} slots for the images of grids {list(grids)} and some text; "
            f"export with cache_len >= {total}"
        )
    ids = verify_prompt(model, grids, total)
    gen = torch.Generator().manual_seed(1)
    patches = torch.cat([torch.randn(g[1] * g[2], patch_dim(model), generator=gen) for g in grids])
    expected = reference_forward(model, ids, patches, grids).float()
    embeds, start = [], 0
    for grid in grids:
        embeds.append(QwenImageEncoder(model, grid)(patches[start : start + grid[1] * grid[2]])[0])
        start += grid[1] * grid[2]
    prompt = ids[0].numpy().astype(np.int32)
    n_prompt = n_images + 2
    positions = torch.from_numpy(rope_positions(prompt, image_id, grids, merge_size(model)))
    placed = torch.from_numpy(vlm_common.place_image_rows(prompt[:n_prompt], torch.cat(embeds).numpy(), image_id))
    prefill = CachedMRoPEPrefill(model, cache_len, logits="all")
    cache, got = prefill.empty_cache(), []
    for start, stop in vlm_common.plan_chunks(prompt[:n_prompt], prefill_len, image_id, cache_len):
        n = stop - start
        tokens = torch.zeros(1, prefill_len, dtype=torch.int32)
        tokens[0, :n] = ids[0, start:stop]
        slots = torch.full((prefill_len,), -1, dtype=torch.int32)
        slots[:n] = torch.arange(start, stop, dtype=torch.int32)
        rope = torch.zeros(3, prefill_len, dtype=torch.int32)
        rope[:, :n] = positions[:, start:stop]
        rows = torch.zeros(1, prefill_len, placed.shape[1])
        rows[0, :n] = placed[start:stop]
        logits, *cache = prefill(tokens, slots, rope, rows, cache)
        got.append(logits[:, :n])
    decode = CachedMRoPEDecode(model, cache_len)
    for pos in range(n_prompt, total):
        step = (ids[:, pos : pos + 1].int(), torch.tensor([pos], dtype=torch.int32), positions[:, pos : pos + 1])
        logits, *cache = decode(*step, cache)
        got.append(logits)
    error = max_relative_error(torch.cat(got, dim=1).numpy(), expected.numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{type(model).__name__}: with images, the cached model's logits differ from the model's own "
            f"forward by {error:.3g} (max relative, over {total} positions); refusing to export a different model"
        )
    return error


def patch_dim(model: nn.Module) -> int:
    vision = model.config.vision_config
    return int(vision.in_channels * vision.temporal_patch_size * vision.patch_size**2)


def export(
    model: nn.Module, grids, prefill_len: int, cache_len: int, prefill_logits: str, verify_first: bool, **options
):
    """`export_vlm` for Qwen2-VL / Qwen2.5-VL: an `encode_image_<h>x<w>` signature per grid,
    then `prefill` and `decode` with `rope_pos` (see the module docstring)."""
    from converter.pipeline import cpu_view

    name = type(model).__name__
    if not grids:
        raise ValueError(
            f"{name}: pass grids=[(1, h, w), ...], the image grids in patches that encode_image takes "
            "(the vision tower's positions and attention blocks are fixed per grid)"
        )
    grids = [check_grid(model, g) for g in grids]
    if len(set(grids)) != len(grids):
        raise ValueError(f"{name}: grids has duplicates: {grids}")
    model = cpu_view(model).eval()
    if verify_first:
        verify_cached_lm(model, cache_len, prefill_len)
        verify(model, grids, cache_len, prefill_len)
    prefill = CachedMRoPEPrefill(model, cache_len, prefill_logits)
    decode = CachedMRoPEDecode(model, cache_len)
    names = cache_tensor_names(decode.lm)
    builder = None
    for grid in grids:
        builder = (signature if builder is None else builder.signature)(
            encoder_name(grid),
            QwenImageEncoder(model, grid),
            (torch.zeros(grid[1] * grid[2], patch_dim(model)),),
            output_names=["image_embeds"],
        )
    steps = torch.arange(prefill_len, dtype=torch.int32)
    prefill_args = (
        torch.zeros(1, prefill_len, dtype=torch.int32),
        steps,
        steps[None].repeat(3, 1),
        torch.zeros(1, prefill_len, text_hidden(model)),
        prefill.empty_cache(),
    )
    one = torch.zeros(1, dtype=torch.int32)
    decode_args = (one[None], one, torch.zeros(3, 1, dtype=torch.int32), decode.empty_cache())
    return (
        builder.signature(
            vlm_common.PREFILL,
            prefill,
            prefill_args,
            output_names=([] if prefill_logits == "none" else ["logits"]) + names,
        )
        .signature("decode", decode, decode_args, output_names=["logits"] + names)
        .convert(**options)
    )


def encoders(runtime) -> dict[tuple[int, int, int], str]:
    return {grid_of(s.key): s.key for s in runtime.signatures if s.key.startswith("encode_image_")}


def matching_encoder(runtime, image: np.ndarray) -> tuple[tuple[int, int, int], str, int, int]:
    """(grid, signature, patch_size, temporal_patch_size) of the encoder whose grid `image`
    (C, H, W) fills: H = h * patch, W = w * patch, patches of C * temporal * patch**2."""
    channels, height, width = image.shape
    for grid, name in encoders(runtime).items():
        patch, dim = height // grid[1], runtime.signature(name).inputs[0].shape[1]
        if patch and (height, width) == (grid[1] * patch, grid[2] * patch) and dim % (channels * patch**2) == 0:
            return grid, name, patch, dim // (channels * patch**2)
    raise ValueError(
        f"an image of shape {image.shape} fits none of the exported grids {sorted(encoders(runtime))} (in patches): "
        "resize it to grid * patch_size pixels, or export with grids= that include its grid"
    )


def encode_images(edge_model, pixel_values, grids=None) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Each image (C, H, W), resized and normalised, through the `encode_image_<h>x<w>`
    signature of its grid -> (image embedding rows in order, the grids). With `grids` (the
    processor's `image_grid_thw`), `pixel_values` are the processor's flattened patches of
    those images, concatenated."""
    runtime = edge_model.runtime
    hidden = runtime.signature(vlm_common.PREFILL).inputs[3].shape[2]
    rows = [np.zeros((0, hidden), np.float32)]
    if grids is not None:
        return _encode_patches(runtime, pixel_values, grids, rows)
    grids = []
    for image in as_images(pixel_values):
        grid, name, patch, temporal = matching_encoder(runtime, image)
        patches, _ = patchify(image, patch, exported_merge(runtime, grid), temporal)
        (embeds,) = runtime.run([patches], name)
        rows.append(embeds[0])
        grids.append(grid)
    return np.concatenate(rows), grids


def _encode_patches(runtime, patches, grids, rows: list) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    patches = np.asarray(patches.detach().cpu() if isinstance(patches, torch.Tensor) else patches, np.float32)
    grids = [tuple(int(n) for n in g) for g in np.asarray(grids).reshape(-1, 3)]
    if patches.ndim != 2 or patches.shape[0] != sum(t * h * w for t, h, w in grids):
        raise ValueError(
            f"pixel_values has shape {patches.shape}: the flattened patches of image_grid_thw {grids} are "
            f"({sum(t * h * w for t, h, w in grids)}, patch values)"
        )
    exported, start = encoders(runtime), 0
    for grid in grids:
        if grid not in exported:
            raise ValueError(
                f"image grid {grid} (image_grid_thw) has no encoder in the file, which has {sorted(exported)}: "
                "resize the image to an exported grid, or convert with a sample holding it"
            )
        count = grid[0] * grid[1] * grid[2]
        (embeds,) = runtime.run([patches[start : start + count]], exported[grid])
        rows.append(embeds[0])
        start += count
    return np.concatenate(rows), grids


def prefill_prompt(edge_model, pixel_values, prompt: np.ndarray, image_token_id: int, grids=None):
    """Encode the images, prefill `prompt[:-1]` in chunks with its rotary positions;
    returns (the cache, `rope(pos)`: the decode input for the token at index pos)."""
    runtime = edge_model.runtime
    prefill, decode = runtime.signature(vlm_common.PREFILL), runtime.signature("decode")
    embeds, grids = encode_images(edge_model, pixel_values, grids)
    merge = exported_merge(runtime, grids[0]) if grids else 1
    positions = rope_positions(prompt, image_token_id, grids, merge)
    delta = rope_delta(positions)
    body = prompt[:-1]
    placed = vlm_common.place_image_rows(body, embeds, image_token_id)
    chunk = prefill.inputs[0].shape[1]
    has_logits = prefill.output_names[0] == "logits"
    cache = [np.zeros(spec.shape, spec.dtype) for spec in decode.inputs[3:]]
    cache_len = vlm_common.exported_cache_len(decode)
    limit = cache_len if cache_len is not None else np.iinfo(np.int32).max
    for start, stop in vlm_common.plan_chunks(body, chunk, image_token_id, limit) if body.size else []:
        n = stop - start
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, :n] = body[start:stop]
        slots = np.full(chunk, -1, np.int32)
        slots[:n] = np.arange(start, stop)
        check_positions(slots, cache_len)
        rope = np.zeros((3, chunk), np.int32)
        rope[:, :n] = positions[:, start:stop]
        rows = np.zeros((1, chunk, placed.shape[1]), np.float32)
        rows[0, :n] = placed[start:stop]
        _, *cache = _split(runtime.run([tokens, slots, rope, rows, *cache], vlm_common.PREFILL), has_logits)

    def rope(pos: int) -> list[np.ndarray]:
        column = positions[:, pos : pos + 1] if pos < prompt.size else np.full((3, 1), pos + delta, np.int32)
        return [column]

    return cache, rope


def exported_merge(runtime, grid) -> int:
    """spatial_merge_size, read from an encoder's patches in and tokens out."""
    tokens = runtime.signature(encoders(runtime)[grid]).outputs[0].shape[1]
    return int(round((grid[1] * grid[2] / tokens) ** 0.5))
