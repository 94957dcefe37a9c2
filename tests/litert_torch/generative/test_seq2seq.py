"""Encoder-decoder export (`encode` + `decode` signatures with self- and cross-attention
caches) run in LiteRT against the model's own forward: T5 (relative position buckets
crossed at every boundary), BART, mBART, Marian and Whisper from tiny random-weight
configs. Greedy and seeded sampled generation equal PyTorch token for token, and the
logits of every step are within 1e-4 (max relative) of the model's forward over the
unpadded source and the whole decoder sequence."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from benchmarks.families.seq2seq import (
    AUDIO_SAMPLES,
    CACHE,
    SOURCE_LEN,
    VOCAB,
    build,
    source_for,
)
from litert_torch.generative import UnsupportedModelError
from litert_torch.generative.seq2seq import (
    beam_search_seq2seq,
    decoder_start_ids,
    export_seq2seq,
    generate_seq2seq,
    reference_generate_seq2seq,
    score_seq2seq,
    verify_seq2seq,
)
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4
NEW = CACHE - 1  # generate to the end of the cache: beyond T5's max_distance (16)
# t5 v1.1 and mbart add little over t5 and bart: under -m slow (the family table runs them all)
FAMILIES = [
    "t5",
    "bart",
    "marian",
    "whisper",
    pytest.param("mbart", marks=pytest.mark.slow),
    pytest.param("t5 v1.1 (gated-gelu, untied head)", marks=pytest.mark.slow),
]


def export(model, **options):
    source_len = None if hasattr(model.config, "num_mel_bins") else SOURCE_LEN
    return export_seq2seq(model, source_len=source_len, cache_len=CACHE, progress=False, **options)


@functools.cache
def exported_family(family: str):
    """(model, edge) built and exported once per test session."""
    model = build(family)
    return model, export(model)


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request):
    return (request.param, *exported_family(request.param))


def test_generation_equals_pytorch_token_for_token_with_every_steps_logits(exported):
    family, model, edge = exported
    source = source_for(model)
    prompt = decoder_start_ids(model)
    got, got_rows = generate_seq2seq(edge, source, NEW, decoder_prompt=prompt, return_logits=True)
    want, want_rows = reference_generate_seq2seq(model, source, NEW, decoder_prompt=prompt, return_logits=True)
    assert got == want and len(got) == NEW
    errors = [max_relative_error(g, w) for g, w in zip(got_rows, want_rows)]
    assert max(errors) <= TOLERANCE, (family, max(errors))


def test_sampling_with_a_seed_matches_the_reference_sampler(exported):
    family, model, edge = exported
    source, prompt = source_for(model, seed=5, length=7), decoder_start_ids(model)
    options = dict(decoder_prompt=prompt, temperature=1.0, top_k=40, top_p=0.95, seed=11)
    got = generate_seq2seq(edge, source, 12, **options)
    assert got == reference_generate_seq2seq(model, source, 12, **options)
    if family == "bart":  # a flat distribution (random weights): the seed matters
        assert got != generate_seq2seq(edge, source, 12, **dict(options, seed=12))


def test_signatures_and_cache_shapes():
    model, edge = exported_family("bart")
    encode, decode = (edge.runtime.signature(k) for k in ("encode", "decode"))
    assert encode.input_names == ["input_ids", "source_mask"]
    assert encode.inputs[0].shape == (1, SOURCE_LEN)
    cross = [f"cross_kv_{i}" for i in range(4)]
    assert encode.output_names == cross and all(o.shape == (1, 4, SOURCE_LEN, 8) for o in encode.outputs)
    cache = [f"kv_cache_{i}" for i in range(4)]
    assert decode.input_names == ["tokens", "input_pos", *cache, *cross, "source_mask"]
    assert decode.output_names == ["logits", *cache]
    assert decode.outputs[0].shape == (1, 1, VOCAB)
    assert all(o.shape == (1, 4, CACHE, 8) for o in decode.outputs[1:])
    # one copy of the weights for both signatures (tiny models: constants and graph add ~25%)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.3 * weights, (len(edge), weights)


def test_whisper_encodes_log_mel_frames_once():
    _, edge = exported_family("whisper")
    encode = edge.runtime.signature("encode")
    assert encode.input_names == ["input_features"] and encode.inputs[0].shape == (1, 8, 32)
    assert "source_mask" not in edge.runtime.signature("decode").input_names
    with pytest.raises(ValueError, match=r"input_features must have shape \(8, 32\)"):
        generate_seq2seq(edge, np.zeros((8, 30), np.float32), 3, decoder_prompt=[3])


def test_a_source_of_every_length_up_to_the_padded_one_is_exact():
    """The source is padded to `source_len` and masked: 1 token and all 20 as exact as 13."""
    model, edge = exported_family("t5")
    for length in (1, SOURCE_LEN):
        source = source_for(model, seed=length, length=length)
        got, rows = generate_seq2seq(edge, source, 8, decoder_prompt=[0], return_logits=True)
        want, want_rows = reference_generate_seq2seq(model, source, 8, decoder_prompt=[0], return_logits=True)
        assert got == want
        assert max(max_relative_error(g, w) for g, w in zip(rows, want_rows)) <= TOLERANCE


def test_the_reference_loop_equals_transformers_generate():
    """Our PyTorch reference (the model's forward, no cache) is what transformers' own
    greedy `generate` produces (T5: no forced tokens in its generation config)."""
    model = build("t5")
    source = source_for(model)
    with torch.no_grad():
        hf = model.generate(source[None].long(), max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert hf[0, 1:].tolist() == reference_generate_seq2seq(model, source, 10, decoder_prompt=[0])


def test_bad_input_is_refused_with_the_reason():
    model, edge = exported_family("t5")
    with pytest.raises(ValueError, match="the source has 21 tokens; the model was exported for at most 20"):
        generate_seq2seq(edge, list(range(21)), 3, decoder_prompt=[0])
    with pytest.raises(ValueError, match="exceeds the exported cache length"):
        generate_seq2seq(edge, [5, 6], CACHE, decoder_prompt=[0])
    with pytest.raises(ValueError, match="pass decoder_prompt"):
        generate_seq2seq(edge, [5, 6], 3, decoder_prompt=None)
    with pytest.raises(ValueError, match=r"decoder token 96 is outside the vocabulary \[0, 96\)"):
        generate_seq2seq(edge, [5, 6], 3, decoder_prompt=[0, 96])
    with pytest.raises(ValueError, match="negative token id"):
        generate_seq2seq(edge, [5, -1], 3, decoder_prompt=[0])
    with pytest.raises(ValueError, match="the source is empty"):
        generate_seq2seq(edge, [], 3, decoder_prompt=[0])
    # two rows are two sources, never one source of both run together
    with pytest.raises(ValueError, match=r"the source has shape \(2, 3\): this call takes one example"):
        generate_seq2seq(edge, [[5, 6, 7], [8, 9, 10]], 3, decoder_prompt=[0])
    with pytest.raises(ValueError, match=r"decoder_prompt has shape \(2, 1\)"):
        generate_seq2seq(edge, [5, 6], 3, decoder_prompt=[[0], [0]])
    with pytest.raises(ValueError, match="pass source_len"):
        export_seq2seq(model, cache_len=8)
    with pytest.raises(ValueError, match="exceeds the decoder's position table"):
        export_seq2seq(build("bart"), source_len=8, cache_len=65)


@pytest.mark.parametrize(
    "family,match",
    [
        ("led (local attention)", "Longformer's attention .* would need a banded, global-token source mask"),
        ("bigbird_pegasus (full attention)", "its encoder computes attention itself .* would need"),
        ("prophetnet", "n-gram self-attention streams; exporting it would need"),
    ],
)
def test_what_would_not_be_exact_is_refused_by_name(family, match):
    with pytest.raises(UnsupportedModelError, match=match):
        export_seq2seq(build(family), source_len=8, cache_len=8)


# one layer each side (every one a mixture of experts): the export traces every expert
MOE = {
    "switch_transformers (MoE)": dict(num_layers=1, num_decoder_layers=1),
    "nllb_moe (MoE)": dict(encoder_layers=1, decoder_layers=1),
}


@pytest.mark.parametrize(
    "family", ["nllb_moe (MoE)", pytest.param("switch_transformers (MoE)", marks=pytest.mark.slow)]
)  # Switch: ~35 s on 2 shared cores
def test_mixture_of_experts_generation_equals_transformers_generate(family):
    """Routers and experts exported (each experts loop written densely): 16 greedy tokens in
    LiteRT equal transformers' `generate` (with its cache), every step's logits within 1e-4
    of the logits `generate` computed."""
    model = build(family, **MOE[family])
    edge = export(model)
    source = source_for(model)
    got, rows = generate_seq2seq(edge, source, 16, decoder_prompt=decoder_start_ids(model), return_logits=True)
    with torch.no_grad():
        hf = model.generate(
            source[None].long(),
            max_new_tokens=16,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            forced_eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert got == hf.sequences[0, 1:].tolist()
    errors = [max_relative_error(g, w[0].numpy()) for g, w in zip(rows, hf.logits)]
    assert len(errors) == 16 and max(errors) <= TOLERANCE, (family, max(errors))


def generate_equals_transformers(model, edge, source, **source_kwargs):
    """16 greedy tokens in LiteRT equal transformers' `generate` (with its cache), and every
    step's logits are within 1e-4 of the logits `generate` computed."""
    got, rows = generate_seq2seq(edge, source, 16, decoder_prompt=decoder_start_ids(model), return_logits=True)
    with torch.no_grad():
        hf = model.generate(
            **source_kwargs,
            max_new_tokens=16,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            forced_eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert got == hf.sequences[0, 1:].tolist()
    errors = [max_relative_error(g, w[0].numpy()) for g, w in zip(rows, hf.logits)]
    assert len(errors) == 16 and max(errors) <= TOLERANCE, max(errors)


@pytest.mark.parametrize("family", ["speech_to_text", "moonshine (raw audio)"])
def test_speech_front_ends_in_the_cached_model_match_the_models_forward(family):
    """In PyTorch (no conversion: the LiteRT runs are under -m slow): the encode/decode
    adapter over Speech2Text's masked features and Moonshine's raw samples, 24 steps."""
    model = build(family)
    source_len = AUDIO_SAMPLES if family.startswith("moonshine") else SOURCE_LEN
    assert verify_seq2seq(model, cache_len=CACHE, source_len=source_len) <= TOLERANCE


@pytest.mark.slow  # ~60 s on 2 shared cores
def test_moonshine_encodes_raw_audio_of_the_exported_length():
    """Its convolutional front end (3 strided convolutions, a group norm) is in `encode`."""
    model = build("moonshine (raw audio)")
    edge = export_seq2seq(model, source_len=AUDIO_SAMPLES, cache_len=CACHE, progress=False)
    encode = edge.runtime.signature("encode")
    assert encode.input_names == ["input_values"] and encode.inputs[0].shape == (1, AUDIO_SAMPLES)
    audio = source_for(model)
    generate_equals_transformers(model, edge, audio, input_values=audio[None])
    with pytest.raises(ValueError, match="exported for exactly 2000 audio samples, got 1999: pad or trim"):
        generate_seq2seq(edge, audio[:-1], 3, decoder_prompt=[1])


@pytest.mark.slow  # ~45 s on 2 shared cores
def test_speech2text_features_of_any_length_up_to_the_exported_one_are_masked():
    """Frames padded to `source_len` with the feature mask (subsampled as its convolutions
    subsample the frames): what transformers computes from the feature extractor's padded
    features and attention mask, for 13 of 20 frames and for 5."""
    from litert_torch.generative.seq2seq import _feature_source

    model = build("speech_to_text")
    edge = export_seq2seq(model, source_len=SOURCE_LEN, cache_len=CACHE, progress=False)
    assert edge.runtime.signature("encode").input_names == ["input_features", "feature_mask"]
    for frames in (13, 5):
        features = source_for(model, length=frames)
        padded, mask = _feature_source(features, SOURCE_LEN)
        generate_equals_transformers(model, edge, features, input_features=padded, attention_mask=mask)
    want = reference_generate_seq2seq(model, features, 8, decoder_prompt=[2], source_len=SOURCE_LEN)
    assert generate_seq2seq(edge, features, 8, decoder_prompt=[2]) == want


def test_a_mixture_of_experts_whose_routing_padding_changes_is_refused_before_any_work():
    model = build("nllb_moe (MoE)", encoder_layers=1, decoder_layers=1, moe_eval_capacity_token_fraction=0.5)
    with pytest.raises(UnsupportedModelError, match="moe_eval_capacity_token_fraction=0.5 drops tokens"):
        export_seq2seq(model, source_len=8, cache_len=8)


def test_an_image_to_text_model_is_sent_to_export_image_to_text_not_refused_for_a_config_key():
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    vit = ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=8, patch_size=4
    )
    gpt2 = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=VOCAB, n_positions=16)
    model = VisionEncoderDecoderModel(VisionEncoderDecoderConfig.from_encoder_decoder_configs(vit, gpt2)).eval()
    with pytest.raises(UnsupportedModelError, match="image-to-text.*export it with export_image_to_text"):
        export_seq2seq(model, source_len=8, cache_len=8)


def test_a_decoder_only_model_is_sent_to_export_generative():
    from benchmarks.families.causal_lm import build as build_decoder

    with pytest.raises(
        UnsupportedModelError,
        match="a decoder-only model .* no cross-attention cache; decoder-only LMs go through export_generative",
    ):
        export_seq2seq(build_decoder("llama"), source_len=8, cache_len=8)


def test_a_difference_from_the_models_own_forward_refuses_the_export():
    """verify_seq2seq compares by number: any logit further than the tolerance refuses."""
    with pytest.raises(UnsupportedModelError, match="differ from the model's own forward by .* refusing"):
        verify_seq2seq(build("bart"), cache_len=8, source_len=8, tolerance=0.0)


def test_dynamic_int8_is_smaller_and_close():
    """Dynamic-range int8 weights on both signatures: the file shrinks and every step's
    logits stay near the float model's (the numbers are printed)."""
    from litert_torch import quantize

    model, plain = exported_family("t5")
    small = export(model, quant_config=quantize.dynamic_int8(), verify=False)
    source = source_for(model)
    want, want_rows = reference_generate_seq2seq(model, source, 12, decoder_prompt=[0], return_logits=True)
    # along the float model's tokens (the int8 model's own choices may drift)
    rows = score_seq2seq(small, source, [0] + want[:-1])
    error = max(max_relative_error(g, w) for g, w in zip(rows, want_rows))
    print(f"t5 tiny: float {len(plain)} B, dynamic int8 {len(small)} B, max logit error {error:.3g}")
    assert len(small) < 0.5 * len(plain)
    assert error < 0.1


@pytest.mark.slow
def test_the_family_table_says_what_the_run_finds():
    """docs/generative_families.md's encoder-decoder rows (tiny configs): the task and the
    status (exact / refused, with the reason) are what a run finds; numbers vary by machine.
    Regenerate with `python -m benchmarks.generative.seq2seq_bench --real --write`."""
    from benchmarks.generative.seq2seq_bench import DOC, doc_rows, tiny_rows

    shown = {row[0]: row for row in doc_rows(DOC.read_text())}
    for row in tiny_rows(24):
        assert shown[row[0]][1:3] == row[1:3], (shown.get(row[0]), row)
        if row[2].startswith("exact"):
            assert float(shown[row[0]][3]) <= TOLERANCE


def test_a_model_on_the_tpu_device_exports_and_stays_there():
    import tpu_backend  # noqa: F401  (registers the device)

    reference = build("bart")
    on_tpu = build("bart").to("tpu")
    edge = export_seq2seq(on_tpu, source_len=SOURCE_LEN, cache_len=16, progress=False)
    assert all(p.device.type == "tpu" for p in on_tpu.parameters())
    source = source_for(reference)
    want = reference_generate_seq2seq(reference, source, 10, decoder_prompt=[2])
    assert generate_seq2seq(edge, source, 10, decoder_prompt=[2]) == want
    # the reference runs where the model lives (3 tokens: eager tpu ops are slow on CPU)
    assert reference_generate_seq2seq(on_tpu, source, 3, decoder_prompt=[2]) == want[:3]


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_beam_search_in_litert_equals_transformers_generate(family):
    """transformers' own beam search (no EOS, so every hypothesis runs to the end)."""
    model, edge = exported_family(family)
    source, start = source_for(model), model.config.decoder_start_token_id
    got = beam_search_seq2seq(edge, source, 12, decoder_prompt=[start], num_beams=3)
    with torch.no_grad():
        want = model.generate(
            source[None].long(),
            max_new_tokens=12,
            num_beams=3,
            do_sample=False,
            eos_token_id=None,
            forced_eos_token_id=None,
            length_penalty=1.0,
        )
    assert got == want[0, 1:].tolist()
    assert got != generate_seq2seq(edge, source, 12, decoder_prompt=[start])  # the beams found another sequence


def test_t5s_own_bucket_settings_are_exact_over_150_positions():
    """T5's real relative-bucket settings (32 buckets, max distance 128) on a one-layer
    model: a 150-token source and 149 generated tokens reach beyond max_distance on both
    sides (the decoder's bucket is computed in LiteRT from the position: LOG, DIV, CAST)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    edge = export_seq2seq(model, source_len=150, cache_len=150, progress=False)
    source = torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(3))
    got, rows = generate_seq2seq(edge, source, 149, decoder_prompt=[0], return_logits=True)
    want, want_rows = reference_generate_seq2seq(model, source, 149, decoder_prompt=[0], return_logits=True)
    assert got == want
    assert max(max_relative_error(g, w) for g, w in zip(rows, want_rows)) <= TOLERANCE
