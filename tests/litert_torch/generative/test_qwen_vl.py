"""Qwen2-VL / Qwen2.5-VL through `export_vlm(grids=...)`: M-RoPE positions computed on
the host equal transformers' `get_rope_index`; host patches equal its image processor's;
the vision tower (Qwen2-VL: full attention; Qwen2.5-VL: windows and a full-attention
layer, RMSNorm, SwiGLU) and patch merger equal `get_image_features` for several grids;
exported, in LiteRT, greedy tokens equal transformers' `generate` for 16 steps with every
step's logits within 1e-4 (max relative), for images of two sizes, alone and together in
one prompt. Qwen2.5-VL's LiteRT export runs by default, Qwen2-VL's under `-m slow`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.families.qwen_vl import (
    BUILDERS,
    CACHE,
    GRIDS,
    IMAGE,
    MERGE,
    PATCH,
    PREFILL,
    STEPS,
    image,
    prompt_for,
    qwen2_5_vl,
    transformers_generate,
)
from litert_torch.generative import UnsupportedModelError, qwen_vl
from litert_torch.generative.vlm import export_vlm, generate_vlm, reference_forward, reference_generate_vlm
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=[pytest.param("qwen2-vl", marks=pytest.mark.slow), pytest.param("qwen2.5-vl")])
def exported(request):
    model = BUILDERS[request.param]()
    return model, export_vlm(model, grids=GRIDS, prefill_len=PREFILL, cache_len=CACHE, progress=False)


def test_signatures_one_encoder_per_grid(exported):
    model, edge = exported
    assert [s.key for s in edge.signatures] == ["encode_image_4x4", "encode_image_4x6", "prefill", "decode"]
    for grid in GRIDS:
        encode = edge.runtime.signature(qwen_vl.encoder_name(grid))
        assert encode.inputs[0].shape == (grid[1] * grid[2], 3 * 2 * PATCH**2)
        assert encode.outputs[0].shape == (1, grid[1] * grid[2] // MERGE**2, 64)
    prefill, decode = edge.runtime.signature("prefill"), edge.runtime.signature("decode")
    assert prefill.input_names[:4] == ["tokens", "input_pos", "rope_pos", "image_embeds"]
    assert prefill.inputs[2].shape == (3, PREFILL) and decode.inputs[2].shape == (3, 1)
    assert decode.input_names[:3] == ["tokens", "input_pos", "rope_pos"]
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.3 * weights, (len(edge), weights)


def test_image_embeddings_are_the_models(exported):
    model, edge = exported
    for grid in GRIDS:
        patches, grids = qwen_vl.model_patches(model, image(grid))
        with torch.no_grad():
            (expected,) = model.get_image_features(patches, torch.tensor(grids), return_dict=True).pooler_output
        (got,) = edge.runtime.run([patches.numpy()], qwen_vl.encoder_name(grid))
        assert np.abs(got).max() > 0.05  # as large as the text's embeddings (init std 0.02)
        assert max_relative_error(got[0], expected.numpy()) <= TOLERANCE


@pytest.mark.parametrize("grids", [[GRIDS[0]], [GRIDS[1]], GRIDS], ids=["16x16", "16x24", "both"])
def test_generation_equals_transformers_generate_with_every_logit(exported, grids):
    """Greedy: LiteRT's tokens are transformers' generate's, and each of the 16 steps'
    logits (LiteRT decode fed generate's tokens) within 1e-4 of generate's."""
    model, edge = exported
    images = [image(g, seed=2 + i) for i, g in enumerate(grids)]
    prompt = prompt_for(grids)
    expected_tokens, expected_logits = transformers_generate(model, images, prompt)
    assert generate_vlm(edge, images, prompt, STEPS, image_token_id=IMAGE) == expected_tokens
    other = [image(g, seed=7 + i) for i, g in enumerate(grids)]
    with torch.no_grad():  # the images have a say: other images, other logits
        elsewhere = reference_forward(model, torch.tensor([prompt]), other)[0, -1].numpy()
    assert max_relative_error(elsewhere, expected_logits[0]) > 100 * TOLERANCE
    tokens = np.array(prompt, np.int32)
    cache, rope = qwen_vl.prefill_prompt(edge, images, tokens, IMAGE)
    ids, errors = [tokens[-1]] + expected_tokens, []
    for step in range(STEPS):
        pos = len(prompt) - 1 + step
        inputs = [np.array([[ids[step]]], np.int32), np.array([pos], np.int32), *rope(pos), *cache]
        logits, *cache = edge.runtime.run(inputs, "decode")
        errors.append(max_relative_error(logits[0, -1], expected_logits[step]))
    assert max(errors) <= TOLERANCE, errors


def test_text_only_generation_equals_transformers_generate(exported):
    model, edge = exported
    prompt = prompt_for([])
    expected_tokens, _ = transformers_generate(model, [], prompt)
    assert generate_vlm(edge, [], prompt, STEPS, image_token_id=IMAGE) == expected_tokens


def test_sampled_generation_matches_pytorch(exported):
    model, edge = exported
    images, prompt = [image(GRIDS[1])], prompt_for(GRIDS[1:])
    sampled = dict(temperature=0.8, top_k=20, top_p=0.95, seed=5)
    got = generate_vlm(edge, images, prompt, 8, image_token_id=IMAGE, **sampled)
    assert got == reference_generate_vlm(model, images, prompt, 8, **sampled)


@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
@pytest.mark.parametrize("grid", [(1, 4, 4), (1, 4, 6), (1, 8, 12), (1, 10, 6)])
def test_vision_tower_with_litert_attention_is_the_models(build, grid):
    """In PyTorch, the tower with the packed attention and precomputed grid constants
    against get_image_features (Qwen2.5-VL at 8 x 12: six windows; at 10 x 6: padded ones)."""
    model = build()
    patches, grids = qwen_vl.model_patches(model, image(grid))
    with torch.no_grad():
        (expected,) = model.get_image_features(patches, torch.tensor(grids), return_dict=True).pooler_output
        got = qwen_vl.QwenImageEncoder(model, grid)(patches)
    assert max_relative_error(got[0].numpy(), expected.numpy()) <= 1e-5


def test_patches_are_the_image_processors():
    import transformers

    processor = transformers.Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2, do_resize=False, do_rescale=False, do_normalize=False
    )
    picture = image((1, 6, 10)).numpy()
    expected = processor(images=[picture], input_data_format="channels_first")
    patches, grid = qwen_vl.patchify(picture, PATCH, MERGE, 2)
    assert grid == tuple(expected["image_grid_thw"][0].tolist()) == (1, 6, 10)
    assert np.array_equal(patches, np.asarray(expected["pixel_values"]))


@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
def test_rope_positions_are_get_rope_index(build):
    model = build()
    grids = [(1, 4, 6), (1, 6, 4), (1, 4, 4)]
    ids = torch.tensor([prompt_for(grids)])
    expected, delta = model.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=torch.tensor(grids))
    got = qwen_vl.rope_positions(ids[0].numpy(), IMAGE, grids, MERGE)
    assert np.array_equal(got, expected[:, 0].numpy())
    assert qwen_vl.rope_delta(got) == int(delta) < 0  # the text after the images counts on from their largest


@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
def test_an_image_longer_than_a_prefill_chunk(build):
    """16 image tokens in chunks of 8: the image's positions carry across three chunks."""
    assert qwen_vl.verify(build(), [(1, 8, 8)], CACHE, PREFILL) <= TOLERANCE


def test_the_check_catches_1d_positions(monkeypatch):
    """With sequence indices as rotary positions the cached model is not Qwen2-VL: refused."""
    model = qwen2_5_vl()
    one_d = lambda prompt, *args: np.repeat(np.arange(len(prompt), dtype=np.int32)[None], 3, 0)  # noqa: E731
    monkeypatch.setattr(qwen_vl, "rope_positions", one_d)
    with pytest.raises(UnsupportedModelError, match="with images, the cached model's logits differ"):
        qwen_vl.verify(model, GRIDS, CACHE, PREFILL)


def test_refusals_say_why():
    model = qwen2_5_vl()
    with pytest.raises(UnsupportedModelError, match=r"t=2: video input .* not supported"):
        export_vlm(model, grids=[(2, 4, 4)])
    with pytest.raises(ValueError, match=r"multiples of spatial_merge_size \(2\)"):
        export_vlm(model, grids=[(1, 3, 4)])
    with pytest.raises(ValueError, match=r"pass grids=\[\(1, h, w\)"):
        export_vlm(model)
    with pytest.raises(ValueError, match="not images=/tiles="):
        export_vlm(model, grids=GRIDS, images=2)
    with pytest.raises(ValueError, match=r"export with cache_len >= \d+"):
        export_vlm(model, grids=[(1, 16, 16)], cache_len=32, prefill_len=8)
    with pytest.raises(ValueError, match="multiples of patch_size"):
        qwen_vl.patchify(np.zeros((3, 10, 16)), PATCH, MERGE, 2)
    with pytest.raises(ValueError, match="a run of 3 image tokens"):
        qwen_vl.rope_positions(np.array([1, IMAGE, IMAGE, IMAGE, 2]), IMAGE, [(1, 4, 4)], MERGE)


@pytest.mark.parametrize("exported", ["qwen2.5-vl"], indirect=True)
def test_image_forms_and_bad_images(exported):
    """Bad images are named (shape, grid, token count); images of one size may come as one array."""
    _, edge = exported
    with pytest.raises(ValueError, match=r"fits none of the exported grids \[\(1, 4, 4\), \(1, 4, 6\)\]"):
        generate_vlm(edge, image((1, 6, 6)), prompt_for([(1, 6, 6)]), 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="a run of 4 image tokens"):
        generate_vlm(edge, image(GRIDS[1]), prompt_for(GRIDS[:1]), 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match=r"an image must be \(channels, height, width\), got shape \(16, 16\)"):
        generate_vlm(edge, [np.zeros((16, 16))], prompt_for(GRIDS[:1]), 3, image_token_id=IMAGE)
    pair, prompt = [image(GRIDS[0], seed=2), image(GRIDS[0], seed=3)], prompt_for(GRIDS[:1] * 2)
    as_list = generate_vlm(edge, pair, prompt, 4, image_token_id=IMAGE)
    assert generate_vlm(edge, torch.stack(pair), prompt, 4, image_token_id=IMAGE) == as_list  # (N, C, H, W)
