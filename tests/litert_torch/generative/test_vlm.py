"""Vision-language export: `encode_image`, a prefill taking image embeddings at the image
tokens, and `decode`, run in LiteRT against the model's own forward with `pixel_values`:
image embeddings and every decode step's logits within 1e-4 (max relative), greedy and
sampled generation token for token, one image or two (a fixed number of tiles), images
split from the text across prefill chunks and beyond the sliding window; what is refused
says why. Model: Gemma 3 (SigLIP tower, pooled projector, two sliding layers and one
global, image tokens attending to each other both ways)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from litert_torch import quantize
from litert_torch.generative import UnsupportedModelError, vlm
from litert_torch.generative.vlm import (
    export_vlm,
    generate_vlm,
    reference_forward,
    reference_generate_vlm,
    verify_vlm,
)
from runtimes.litert import max_relative_error

VOCAB, IMAGE, BOI, EOI = 96, 92, 90, 91
PER_IMAGE = 4  # mm_tokens_per_image
PREFILL, CACHE, TOTAL = 8, 40, 32
TOLERANCE = 1e-4


def gemma3_vlm(seed: int = 0):
    import transformers

    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=8,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=PER_IMAGE,
            image_token_id=IMAGE,
            boi_token_id=BOI,
            eoi_token_id=EOI,
        )
        model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projector starts at zero: give the image a say
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    return model


def prompt_with_images(images: int, text_before: int, text_after: int, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    words = lambda n: torch.randint(0, 89, (n,), generator=gen).tolist()  # noqa: E731
    ids = words(text_before)
    for _ in range(images):
        ids += [BOI] + [IMAGE] * PER_IMAGE + [EOI] + words(2)
    return ids + words(text_after)


def pixels(images: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(images, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return gemma3_vlm()


@pytest.fixture(scope="module", params=[1, 2], ids=["one image", "two images"])
def exported(request, model):
    images = request.param
    return images, export_vlm(model, prefill_len=PREFILL, cache_len=CACHE, images=images, progress=False)


def test_three_signatures_sharing_the_weights(exported, model):
    images, edge = exported
    encode, prefill, decode = (edge.runtime.signature(k) for k in ("encode_image", "prefill", "decode"))
    assert encode.inputs[0].shape == (images, 3, 32, 32)
    assert encode.output_names == ["image_embeds"] and encode.outputs[0].shape == (1, images * PER_IMAGE, 64)
    assert prefill.input_names[:3] == ["tokens", "input_pos", "image_embeds"]
    assert prefill.inputs[2].shape == (1, PREFILL, 64)
    assert decode.input_names[:2] == ["tokens", "input_pos"]
    assert prefill.output_names == decode.output_names
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.3 * weights, (len(edge), weights)


def test_image_embeddings_are_the_models(exported, model):
    images, edge = exported
    px = pixels(images)
    with torch.no_grad():
        expected = model.get_image_features(px, return_dict=True).pooler_output.reshape(1, -1, 64)
    got = edge(px.numpy(), signature_name="encode_image")
    assert max_relative_error(got, expected.numpy()) <= TOLERANCE


def test_logits_at_every_decode_step_match_the_models_own_forward(exported, model):
    """The first image starts 2 tokens before the end of the first chunk: the chunk ends
    before it and the image comes whole in the next one; decode runs past 3x the window."""
    images, edge = exported
    prompt = prompt_with_images(images, text_before=5, text_after=3)
    gen = torch.Generator().manual_seed(3)
    ids = torch.tensor(prompt + torch.randint(0, 89, (TOTAL - len(prompt),), generator=gen).tolist())[None]
    px = pixels(images)
    with torch.no_grad():
        expected = reference_forward(model, ids, px)[0].numpy()
    cache = vlm.prefill_prompt(edge, px.numpy(), np.array(prompt[:-1], np.int32), IMAGE)
    errors = []
    for pos in range(len(prompt) - 1, TOTAL):
        logits, *cache = edge.runtime.run(
            [ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache], "decode"
        )
        errors.append(max_relative_error(logits[0, -1], expected[pos]))
    assert TOTAL > 3 * 8 and max(errors) <= TOLERANCE, errors


def test_generation_matches_pytorch_token_for_token(exported, model):
    images, edge = exported
    prompt = prompt_with_images(images, text_before=3, text_after=2)
    px = pixels(images)
    new = TOTAL - len(prompt)
    assert generate_vlm(edge, px, prompt, new, image_token_id=IMAGE) == reference_generate_vlm(model, px, prompt, new)
    sampled = dict(temperature=0.8, top_k=20, top_p=0.95, seed=5)
    assert generate_vlm(edge, px, prompt, new, image_token_id=IMAGE, **sampled) == reference_generate_vlm(
        model, px, prompt, new, **sampled
    )


def test_the_check_catches_a_causal_image(model, monkeypatch):
    """Without the image's bidirectional keys the cached model is not Gemma 3: refused."""
    monkeypatch.setattr(vlm, "image_blocks", lambda is_image: torch.zeros(len(is_image), len(is_image)).bool())
    with pytest.raises(UnsupportedModelError, match="with an image, the cached model's logits differ"):
        verify_vlm(model, CACHE, PREFILL)


def test_dynamic_int8_size_and_logit_error(model):
    full = export_vlm(model, prefill_len=PREFILL, cache_len=CACHE, progress=False, verify=False)
    int8 = export_vlm(model, prefill_len=PREFILL, cache_len=CACHE, quant_config=quantize.dynamic_int8(), verify=False)
    prompt = prompt_with_images(1, text_before=3, text_after=2)
    px = pixels(1).numpy()
    worst = 0.0
    caches = [vlm.prefill_prompt(e, px, np.array(prompt[:-1], np.int32), IMAGE) for e in (full, int8)]
    ids = np.array([[prompt[-1]]], np.int32)
    for step in range(8):
        pos = np.array([len(prompt) - 1 + step], np.int32)
        (a, *caches[0]), (b, *caches[1]) = (
            full.runtime.run([ids, pos, *caches[0]], "decode"),
            int8.runtime.run([ids, pos, *caches[1]], "decode"),
        )
        worst = max(worst, max_relative_error(b, a))
        ids = np.array([[int(np.argmax(a[0, -1]))]], np.int32)
    print(f"gemma3 vlm: float {len(full)} B, dynamic int8 {len(int8)} B, max rel. logit error {worst:.2e}")
    assert len(int8) < 0.6 * len(full) and 0 < worst < 0.2


def test_refusals_say_why(model):
    import transformers

    with pytest.raises(ValueError, match=r"prefill_len \(2\) is shorter than an image \(4 tokens\)"):
        export_vlm(model, prefill_len=2, cache_len=CACHE)
    with pytest.raises(ValueError, match="images must be an int >= 1"):
        export_vlm(model, images=0)
    with pytest.raises(UnsupportedModelError, match="M-RoPE"):
        export_vlm(transformers.Qwen2VLForConditionalGeneration.__new__(transformers.Qwen2VLForConditionalGeneration))
    with pytest.raises(UnsupportedModelError, match="export_generative"):
        export_vlm(transformers.GemmaForCausalLM(transformers.GemmaConfig(vocab_size=8, num_hidden_layers=1)))


def test_bad_inputs_name_the_argument(exported):
    images, edge = exported
    if images != 1:
        pytest.skip("one model is enough")
    prompt = prompt_with_images(1, 2, 2)
    with pytest.raises(ValueError, match=r"pixel_values has shape \(2, 3, 32, 32\)"):
        generate_vlm(edge, pixels(2), prompt, 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="prompt_ids has 3 image tokens"):
        generate_vlm(edge, pixels(1), [IMAGE] * 3 + [1], 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="prompt_ids must end with a text token"):
        generate_vlm(edge, pixels(1), [1] + [IMAGE] * 4, 3, image_token_id=IMAGE)
    with pytest.raises(ValueError, match="exceeds the exported cache length"):
        generate_vlm(edge, pixels(1), prompt, CACHE, image_token_id=IMAGE)
