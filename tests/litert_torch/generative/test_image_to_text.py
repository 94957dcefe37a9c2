"""Image-to-text export (`encode_image` + `decode` with self- and cross-attention caches)
run in LiteRT against transformers: VisionEncoderDecoderModel pairs (ViT + GPT-2, TrOCR,
Donut's Swin + mBART, DeiT + BERT, BEiT / DeiT + RoBERTa), BLIP captioning, GIT and
Florence-2, from tiny random-weight configs (one family by default, the rest under -m slow). Greedy tokens equal transformers' `generate` for 16 steps with
every step's logits within 1e-4 (max relative); seeded sampling equals the same sampler
applied to the model's own logits."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from benchmarks.families.image_to_text import (
    CACHE,
    FAMILIES,
    VOCAB,
    build,
    export_options,
    image_for,
    task_prompt,
    transformers_generate,
)
from litert_torch.generative import UnsupportedModelError
from litert_torch.generative.image_to_text import (
    export_image_to_text,
    generate_image_to_text,
    image_to_text_prompt,
    reference_generate_image_to_text,
)
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4
STEPS = 16
# one family in the default suite (an export takes ~20 s on 2 shared cores); the rest under -m slow
PARAMS = [f if f == "vit + gpt2" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]


@functools.cache
def exported_family(family: str):
    """(model, edge) built and exported once per test session."""
    model = build(family)
    return model, export_image_to_text(model, cache_len=CACHE, progress=False, **export_options(family))


@pytest.fixture(scope="module", params=PARAMS)
def exported(request):
    return (request.param, *exported_family(request.param))


def test_greedy_tokens_equal_transformers_generate_with_every_steps_logits(exported):
    family, model, edge = exported
    image = image_for(model)
    got, rows = generate_image_to_text(
        edge, image, STEPS, decoder_prompt=image_to_text_prompt(model), prompt=task_prompt(model), return_logits=True
    )
    want, want_rows = transformers_generate(model, image, STEPS)
    assert got == want and len(got) == STEPS, family
    errors = [max_relative_error(g, w) for g, w in zip(rows, want_rows)]
    assert max(errors) <= TOLERANCE, (family, max(errors))


def test_sampling_with_a_seed_equals_the_same_sampler_on_the_models_logits(exported):
    family, model, edge = exported
    image, prompt = image_for(model, seed=3), image_to_text_prompt(model)
    options = dict(decoder_prompt=prompt, prompt=task_prompt(model), temperature=1.0, top_k=40, top_p=0.95, seed=11)
    if "sinusoidal" in family:  # after a generated pad token, TrOCR's sinusoidal positions differ between
        # transformers' cached forward (generate's, which the export follows) and the uncached reference: stop there
        options["stop_tokens"] = [model.config.decoder.pad_token_id]
    got, rows = generate_image_to_text(edge, image, STEPS, return_logits=True, **options)
    want, want_rows = reference_generate_image_to_text(model, image, STEPS, return_logits=True, **options)
    assert got == want, family
    assert max(max_relative_error(g, w) for g, w in zip(rows, want_rows)) <= TOLERANCE
    assert got != generate_image_to_text(edge, image, STEPS, **dict(options, seed=12))  # the seed matters


def test_signatures_and_cache_shapes():
    model, edge = exported_family("vit + gpt2")
    encode, decode = (edge.runtime.signature(k) for k in ("encode_image", "decode"))
    assert encode.input_names == ["pixel_values"] and encode.inputs[0].shape == (1, 3, 16, 16)
    cross = [f"cross_kv_{i}" for i in range(4)]
    # 2 x 2 patches and the class token; GPT-2's 2 heads of 24
    assert encode.output_names == cross and all(o.shape == (1, 2, 5, 24) for o in encode.outputs)
    cache = [f"kv_cache_{i}" for i in range(4)]
    assert decode.input_names == ["tokens", "input_pos", *cache, *cross]
    assert decode.output_names == ["logits", *cache]
    assert decode.outputs[0].shape == (1, 1, VOCAB)
    assert all(o.shape == (1, 2, CACHE, 24) for o in decode.outputs[1:])


def test_bad_input_is_refused_with_the_reason():
    model, edge = exported_family("vit + gpt2")
    with pytest.raises(ValueError, match=r"pixel_values must have shape \(1, 3, 16, 16\)"):
        generate_image_to_text(edge, np.zeros((3, 8, 8), np.float32), 3, decoder_prompt=[0])
    with pytest.raises(ValueError, match="exceeds the exported cache length"):
        generate_image_to_text(edge, image_for(model), CACHE, decoder_prompt=[0])
    with pytest.raises(ValueError, match="exceeds the decoder's position table"):
        export_image_to_text(model, cache_len=65)


def test_a_model_of_another_shape_is_refused_with_where_it_goes():
    from benchmarks.families.seq2seq import build as build_seq2seq

    with pytest.raises(UnsupportedModelError, match="not an image-to-text model.*export_seq2seq"):
        export_image_to_text(build_seq2seq("bart"))


@pytest.mark.parametrize("api", ["export_vlm", "export_seq2seq", "export_generative"])
@pytest.mark.parametrize("family", ["vit + gpt2", "blip"])
def test_the_other_exporters_send_image_to_text_models_here(api, family):
    import litert_torch.generative as generative

    with pytest.raises(UnsupportedModelError, match=f"image-to-text.*{api} does not take it.*export_image_to_text"):
        getattr(generative, api)(
            build(family), cache_len=CACHE, **({"prefill_len": 4} if api == "export_generative" else {})
        )


def test_blip2_is_refused_with_the_reason_and_what_would_be_needed():
    import transformers as t

    config = t.Blip2Config(
        vision_config=dict(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        qformer_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
        text_config=dict(model_type="opt", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64),
        num_query_tokens=4,
    )
    with pytest.raises(UnsupportedModelError, match="Q-Former's query embeddings as prompt tokens.*export_vlm"):
        export_image_to_text(t.Blip2ForConditionalGeneration(config).eval())
