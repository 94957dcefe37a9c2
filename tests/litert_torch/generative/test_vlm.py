"""Vision-language export: `encode_image`, a prefill taking image embeddings at the image
tokens, and `decode`, run in LiteRT against the model's own forward with `pixel_values`:
image embeddings and every decode step's logits within 1e-4 (max relative), greedy and
sampled generation token for token; images split from the text across prefill chunks and
decoding beyond the sliding window; what is refused says why. Models:
- Gemma 3 (SigLIP tower, pooled projector; two sliding layers and one global; an image's
  tokens attend to each other both ways), one image (two under `-m slow`);
- SmolVLM (its vision embeddings, pixel-shuffle connector, Llama decoder, causal), with its
  image splitting as a fixed 2 x 2 grid: five tiles, the image running across chunks;
- PaliGemma (SigLIP, linear projector, Gemma decoder; prefix-LM: the whole prompt attends
  both ways, in one prefill chunk; positions from 1);
- Idefics3 (SmolVLM's parent) under `-m slow`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.families.vlm import (
    CACHE,
    CASES,
    IMAGE,
    PER_IMAGE,
    PREFILL,
    TOTAL,
    gemma3_vlm,
    paligemma,
    pixels,
    prompt_with_images,
)
from litert_torch import quantize
from litert_torch.generative import UnsupportedModelError, vlm, vlm_common
from litert_torch.generative.vlm import (
    export_vlm,
    generate_vlm,
    reference_forward,
    reference_generate_vlm,
    tile_image,
    verify_vlm,
)
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4
SLOW = {"gemma3, two images", "idefics3, 2x2 tiles"}  # Idefics3: SmolVLM's parent, the same code path


@pytest.fixture(scope="module", params=[pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else []) for c in CASES])
def exported(request):
    build, options, images = CASES[request.param]
    model = build()
    options = {"prefill_len": PREFILL, **options}
    return model, images, export_vlm(model, cache_len=CACHE, progress=False, **options)


def _pixels_for(model, images: int) -> torch.Tensor:
    return pixels(images, size=model.config.vision_config.image_size)


def test_three_signatures_sharing_the_weights(exported):
    model, images, edge = exported
    prefix_lm = vlm.family(model).prefix_lm
    names = ["encode_image", "prefill_whole_prompt" if prefix_lm else "prefill", "decode"]
    assert [s.key for s in edge.signatures] == names
    encode, prefill, decode = (edge.runtime.signature(k) for k in names)
    size = model.config.vision_config.image_size
    assert encode.inputs[0].shape == (images, 3, size, size)
    assert encode.output_names == ["image_embeds"] and encode.outputs[0].shape == (1, images * PER_IMAGE, 64)
    assert prefill.input_names[:3] == ["tokens", "input_pos", "image_embeds"]
    assert prefill.inputs[2].shape == (1, 16 if prefix_lm else PREFILL, 64)
    assert decode.input_names[:2] == ["tokens", "input_pos"]
    assert prefill.output_names == decode.output_names
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.3 * weights, (len(edge), weights)


def test_image_embeddings_are_the_models(exported):
    model, images, edge = exported
    px = _pixels_for(model, images)
    with torch.no_grad():
        batched = px[None] if vlm.family(model).batched_pixels else px
        features = model.get_image_features(batched, return_dict=True).pooler_output
    expected = torch.cat(list(features)).reshape(1, -1, 64) if isinstance(features, (list, tuple)) else features
    got = edge(px.numpy(), signature_name="encode_image")
    assert np.abs(got).max() > 0.1  # the image has a say in the tiny random model
    assert max_relative_error(got, expected.reshape(1, -1, 64).numpy()) <= TOLERANCE


def test_logits_at_every_decode_step_match_the_models_own_forward(exported):
    """The first image starts 2 tokens before the end of the first chunk: Gemma 3's chunk
    ends before it (its image comes whole in the next one), SmolVLM's runs on into the
    next chunks (PaliGemma's prompt is one chunk); then decode runs past 3x Gemma's window."""
    model, images, edge = exported
    prompt = prompt_with_images(images, text_before=5, text_after=3)
    gen = torch.Generator().manual_seed(3)
    ids = torch.tensor(prompt + torch.randint(0, 89, (TOTAL - len(prompt),), generator=gen).tolist())[None]
    px = _pixels_for(model, images)
    with torch.no_grad():
        expected = reference_forward(model, ids, px, prompt_len=len(prompt))[0].numpy()
    # as generate_vlm: a prefix-LM's prompt is prefilled whole and its last token decoded again
    body = prompt if vlm.family(model).prefix_lm else prompt[:-1]
    cache = vlm.prefill_prompt(edge, px.numpy(), np.array(body, np.int32), IMAGE)
    errors = []
    for pos in range(len(prompt) - 1, TOTAL):
        step = [ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache]
        logits, *cache = edge.runtime.run(step, "decode")
        errors.append(max_relative_error(logits[0, -1], expected[pos]))
    assert TOTAL > 3 * 8 and max(errors) <= TOLERANCE, errors


def test_generation_matches_pytorch_token_for_token(exported):
    model, images, edge = exported
    prompt = prompt_with_images(images, text_before=3, text_after=2)
    px = _pixels_for(model, images)
    new = TOTAL - len(prompt)
    assert generate_vlm(edge, px, prompt, new, image_token_id=IMAGE) == reference_generate_vlm(model, px, prompt, new)
    sampled = dict(temperature=0.8, top_k=20, top_p=0.95, seed=5)
    assert generate_vlm(edge, px, prompt, new, image_token_id=IMAGE, **sampled) == reference_generate_vlm(
        model, px, prompt, new, **sampled
    )


def test_the_check_catches_a_causal_gemma3_image(monkeypatch):
    """Without the image's bidirectional keys the cached model is not Gemma 3: refused."""
    model = gemma3_vlm()
    monkeypatch.setattr(vlm_common, "image_blocks", lambda is_image: torch.zeros(len(is_image), len(is_image)).bool())
    with pytest.raises(UnsupportedModelError, match="with an image, the cached model's logits differ"):
        verify_vlm(model, CACHE, PREFILL)


def test_image_blocks_keep_two_images_apart():
    """Two images in one chunk: each token sees the later tokens of its own image only."""
    is_image = torch.tensor([0, 1, 1, 1, 0, 1, 1, 0]).bool()
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for q, k in [(1, 2), (1, 3), (2, 3), (5, 6)]:
        expected[q, k] = True
    assert torch.equal(vlm.image_blocks(is_image), expected)


def test_an_image_longer_than_the_sliding_window():
    """16 image tokens, window 8: within the image, a sliding layer's query sees every later
    token of the image and only the last 8 before it (transformers: AND(window, OR(causal,
    image)))."""
    assert verify_vlm(gemma3_vlm(per_image=16), CACHE, prefill_len=20) <= TOLERANCE


@pytest.mark.slow  # the default suite's time budget: dynamic int8 of the decoder families is checked in test_kv_cache.py, test_seq2seq.py, test_embedder.py
def test_dynamic_int8_size_and_logit_error():
    model = gemma3_vlm()
    full = export_vlm(model, prefill_len=PREFILL, cache_len=CACHE, progress=False, verify=False)
    int8 = export_vlm(model, prefill_len=PREFILL, cache_len=CACHE, quant_config=quantize.dynamic_int8(), verify=False)
    prompt = np.array(prompt_with_images(1, text_before=3, text_after=2), np.int32)
    px = pixels(1).numpy()
    caches = [vlm.prefill_prompt(e, px, prompt[:-1], IMAGE) for e in (full, int8)]
    ids, worst = prompt[None, -1:], 0.0
    for step in range(8):
        pos = np.array([len(prompt) - 1 + step], np.int32)
        a, *caches[0] = full.runtime.run([ids, pos, *caches[0]], "decode")
        b, *caches[1] = int8.runtime.run([ids, pos, *caches[1]], "decode")
        worst = max(worst, max_relative_error(b, a))
        ids = np.array([[int(np.argmax(a[0, -1]))]], np.int32)
    print(f"gemma3 vlm: float {len(full)} B, dynamic int8 {len(int8)} B, max rel. logit error {worst:.2e}")
    assert len(int8) < 0.6 * len(full) and 0 < worst < 0.2


def test_tile_image_is_a_fixed_grid_plus_the_whole_image():
    image = torch.arange(3 * 64 * 96, dtype=torch.float32).reshape(3, 64, 96)
    tiles = tile_image(image, (2, 3), 32)
    assert tiles.shape == (7, 3, 32, 32)
    assert torch.equal(tiles[4], image[:, 32:, 32:64])  # row 1, col 1: no resize needed at 2x3 x 32
    assert tile_image(image, (1, 1), 32).shape == (1, 3, 32, 32)
    with pytest.raises(ValueError, match="tiles must be"):
        tile_image(image, (0, 2), 32)


def test_a_paligemma_prompt_comes_in_one_chunk():
    model = paligemma()
    with pytest.raises(ValueError, match=r"prefill_len \(4\) must hold the whole prompt"):
        export_vlm(model, prefill_len=4, cache_len=CACHE)
    edge = export_vlm(model, prefill_len=12, cache_len=CACHE, progress=False, verify=False)
    with pytest.raises(ValueError, match=r"prompt_ids \(14 tokens\) must fit one prefill chunk \(12\)"):
        generate_vlm(edge, pixels(1, size=16), prompt_with_images(1, 5, 3), 3, image_token_id=IMAGE)


def test_refusals_say_why():
    import transformers

    model = gemma3_vlm()
    with pytest.raises(ValueError, match=r"prefill_len \(2\) is shorter than an image \(4 tokens\)"):
        export_vlm(model, prefill_len=2, cache_len=CACHE)
    with pytest.raises(ValueError, match="images must be an int >= 1"):
        export_vlm(model, images=0)
    with pytest.raises(ValueError, match="pass either images"):
        export_vlm(model, images=2, tiles=(2, 2))
    with pytest.raises(ValueError, match="grids= is for Qwen2-VL"):
        export_vlm(model, grids=[(1, 4, 4)])
    with pytest.raises(UnsupportedModelError, match="export_generative"):
        export_vlm(transformers.GemmaForCausalLM(transformers.GemmaConfig(vocab_size=8, num_hidden_layers=1)))


@pytest.mark.parametrize("exported", ["gemma3, one image"], indirect=True)  # one model is enough
def test_bad_inputs_name_the_argument(exported):
    model, images, edge = exported
    prompt = prompt_with_images(1, 2, 2)
    with pytest.raises(ValueError, match=r"pixel_values has shape \(2, 3, 32, 32\)"):
        generate_vlm(edge, pixels(2), prompt, 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="all zeros"):
        generate_vlm(edge, torch.zeros(1, 3, 32, 32), prompt, 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="prompt_ids has 3 image tokens"):
        generate_vlm(edge, pixels(1), [IMAGE] * 3 + [1], 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="prompt_ids must end with a text token"):
        generate_vlm(edge, pixels(1), [1] + [IMAGE] * 4, 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="exceeds the exported cache length"):
        generate_vlm(edge, pixels(1), prompt, CACHE, image_token_id=IMAGE)
