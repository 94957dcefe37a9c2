"""`litert_torch.generative.convert(model, inputs)` + `.generate(**inputs, ...)` for every
generative family, against transformers' own `model.generate(**inputs, ...)` on the same
processor-shaped inputs: the same ids and shape (greedy: equal), batches of rows padded as
the family's processors pad them, the model's generation config with its end tokens on.
Embedders through `.embed`, against the model's own output."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from benchmarks.families import embedder as emb
from benchmarks.families.causal_lm import build as build_lm
from benchmarks.families.one_call import CASES, left_padded, right_padded, words
from litert_torch.generative import UnsupportedModelError, convert
from litert_torch.generative.embedder import pad_batch

TOLERANCE = 1e-4


@functools.cache
def converted(name: str):
    build, inputs_for, sizes = CASES[name]
    model = build()
    inputs = inputs_for(model)
    return model, inputs, convert(model, inputs, progress=False, **sizes)


def transformers_generate(model, inputs, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**inputs, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_generate_returns_what_transformers_generate_returns(name):
    """Greedy, the model's generation config (its end token on), a batch: the same ids."""
    model, inputs, edge = converted(name)
    got = edge.generate(**inputs, max_new_tokens=10)
    want = transformers_generate(model, inputs, max_new_tokens=10)
    assert got.dtype == torch.long and got.shape == want.shape
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("name", list(CASES))
def test_the_logits_of_every_step_are_transformers(name):
    """`output_logits` as transformers returns them: one (batch, vocab) tensor per step, each
    within 1e-4 (max relative) of the logits transformers' generate computed (min_new_tokens
    keeps every row running to the end, so that every row has every step)."""
    from runtimes.litert import max_relative_error

    model, inputs, edge = converted(name)
    options = dict(max_new_tokens=8, min_new_tokens=8, output_logits=True, return_dict_in_generate=True)
    got = edge.generate(**inputs, **options)
    want = transformers_generate(model, inputs, **options)
    assert got.sequences.tolist() == want.sequences.tolist()
    assert len(got.logits) == len(want.logits) == 8
    errors = [max_relative_error(g.numpy(), w.numpy()) for g, w in zip(got.logits, want.logits)]
    assert max(errors) <= TOLERANCE, errors


@pytest.mark.parametrize("name", ["llama", "t5", "gemma3 (two rows, an image each)"])
def test_logits_processors_transformers_applies(name):
    """min_new_tokens against an end token that comes early (ids below 40 all end a row),
    the repetition penalty, and transformers' default length (max_length 20)."""
    model, inputs, edge = converted(name)
    for kwargs in (
        {"max_new_tokens": 8, "min_new_tokens": 5, "eos_token_id": list(range(40))},
        {"max_new_tokens": 8, "repetition_penalty": 1.5},
        {"max_new_tokens": 12, "no_repeat_ngram_size": 2},
        {"max_new_tokens": 8, "eos_token_id": list(range(40))},  # rows end at different steps: padded
        {},
    ):
        assert edge.generate(**inputs, **kwargs).tolist() == transformers_generate(model, inputs, **kwargs).tolist()


def test_n_grams_of_the_source_are_not_repeated():
    """encoder_no_repeat_ngram_size (Blenderbot's generation config sets it): no n-gram of the
    source in the output, as transformers blocks them."""
    model, inputs, edge = converted("t5")
    for n in (1, 2):
        options = {"max_new_tokens": 10, "encoder_no_repeat_ngram_size": n}
        got = edge.generate(**inputs, **options)
        assert got.tolist() == transformers_generate(model, inputs, **options).tolist()
        if n == 1:  # no token of a row's source (its padding included) among its new tokens
            for row, source in zip(got[:, 1:].tolist(), inputs["input_ids"].tolist()):
                assert not set(row) & set(source)


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_a_streamer_hears_what_transformers_tells_it(name):
    """The prompt (the decoder prompt), then each token as it is picked, then end()."""
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.tolist())

        def end(self):
            self.calls.append("end")

    model, inputs, edge = converted(name)
    row = {key: value[:1] for key, value in inputs.items()}
    ours, theirs = Recorder(), Recorder()
    got = edge.generate(**row, max_new_tokens=6, streamer=ours)
    transformers_generate(model, row, max_new_tokens=6, streamer=theirs)
    assert (
        ours.calls == theirs.calls
        and ours.calls[-1] == "end"
        and len(ours.calls) == got.shape[1] - (1 if name == "t5" else row["input_ids"].shape[1]) + 2
    )
    with pytest.raises(ValueError, match="a streamer takes one row at a time; the batch has 2"):
        edge.generate(**inputs, streamer=Recorder())


def test_sampling_draws_from_the_models_distribution_reproducibly():
    model, inputs, edge = converted("llama")
    torch.manual_seed(3)
    first = edge.generate(**inputs, max_new_tokens=8, do_sample=True, temperature=0.7)
    torch.manual_seed(3)
    assert edge.generate(**inputs, max_new_tokens=8, do_sample=True, temperature=0.7).tolist() == first.tolist()
    assert edge.generate(**inputs, max_new_tokens=8, do_sample=True, seed=1).shape == first.shape
    # the most likely token only: sampling is greedy
    greedy = transformers_generate(model, inputs, max_new_tokens=8)
    assert edge.generate(**inputs, max_new_tokens=8, do_sample=True, top_k=1, seed=5).tolist() == greedy.tolist()


def test_embedders_embed_as_the_model_computes():
    model = emb.bert()
    ids, mask = (torch.tensor(a) for a in pad_batch(emb.sentences([9, 4, 12])))
    edge = convert(model, {"input_ids": ids, "attention_mask": mask}, progress=False, pooling="cls")
    got = edge.embed(input_ids=ids, attention_mask=mask).numpy()
    want = emb.reference(model, emb.sentences([9, 4, 12]), "cls")
    assert got.shape == (3, 64) and np.abs(got - want).max() <= TOLERANCE
    # what a BERT tokenizer returns: token types (all 0 for one sentence) too
    types = torch.zeros_like(ids)
    assert np.array_equal(edge.embed(input_ids=ids, attention_mask=mask, token_type_ids=types).numpy(), got)
    with pytest.raises(ValueError, match="token_type_ids has ones \\(a second segment"):
        edge.embed(input_ids=ids, attention_mask=mask, token_type_ids=types + 1)


@pytest.mark.parametrize(
    "config, model_class, output",
    [
        ("CLIPVisionConfig", "CLIPVisionModelWithProjection", "image_embeds"),
        ("SiglipVisionConfig", "SiglipVisionModel", "pooler_output"),
    ],
)
def test_image_embedders_embed_their_own_output(config, model_class, output):
    import transformers

    torch.manual_seed(0)
    extra = {"projection_dim": 16} if output == "image_embeds" else {}
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32)
    model = getattr(transformers, model_class)(getattr(transformers, config)(**shape, patch_size=8, **extra)).eval()
    pixels = torch.randn(3, 3, 32, 32)
    edge = convert(model, {"pixel_values": pixels}, progress=False)
    with torch.no_grad():
        want = getattr(model(pixel_values=pixels), output)
    got = edge.embed(pixel_values=pixels)
    assert got.shape == want.shape and (got - want).abs().max() <= TOLERANCE
    with pytest.raises(TypeError, match="this image embedder does not generate: call embed"):
        edge.generate(pixel_values=pixels)


def test_what_the_loop_does_not_apply_is_refused_by_name():
    model, inputs, edge = converted("llama")
    with pytest.raises(NotImplementedError, match="generation_config.num_beams=2 is not applied.*pass num_beams=1"):
        edge.generate(**inputs, num_beams=2)
    with pytest.raises(NotImplementedError, match="generation_config.min_p=0.1 is not applied"):
        edge.generate(**inputs, do_sample=True, min_p=0.1)
    assert edge.generate(**inputs, max_new_tokens=2, min_p=0.1).shape == (2, 8)  # a warper: nothing when greedy
    with pytest.raises(
        TypeError,
        match="generate\\(\\) got stream_me: neither an input of this causal LM \\(input_ids, attention_mask\\)",
    ):
        edge.generate(**inputs, stream_me=True)
    with pytest.raises(TypeError, match="labels: not an input of this causal LM, which reads input_ids"):
        convert(model, dict(inputs, labels=inputs["input_ids"]))
    # images for a model whose family does not read them: said, not dropped
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM: its pixel_values are not read by a family"):
        convert(model, dict(inputs, pixel_values=torch.zeros(1, 3, 8, 8)))
    with pytest.raises(TypeError, match="this causal LM does not embed"):
        edge.embed(**inputs)
    with pytest.raises(ValueError, match="pass input_ids \\(what the tokenizer or processor returns\\)"):
        edge.generate(max_new_tokens=2)
    with pytest.raises(ValueError, match="input_ids must have 2 dimensions \\(batch first\\), got shape \\(6,\\)"):
        edge.generate(input_ids=inputs["input_ids"][0], max_new_tokens=2)


def test_a_padded_batch_without_its_mask_is_read_as_transformers_reads_it():
    """No attention_mask: transformers masks the pad token (when it is not an end token)."""
    model, inputs, edge = converted("llama")
    ids = inputs["input_ids"].clone()
    model.generation_config.pad_token_id = edge.generation_config.pad_token_id = 0
    try:
        assert ids[1, 0] == 0  # the shorter row's padding
        got = edge.generate(input_ids=ids, max_new_tokens=6)
        assert got.tolist() == transformers_generate(model, {"input_ids": ids}, max_new_tokens=6).tolist()
        assert got.tolist() == edge.generate(**inputs, max_new_tokens=6).tolist()
    finally:
        model.generation_config.pad_token_id = edge.generation_config.pad_token_id = None


def test_padding_on_the_wrong_side_is_refused_not_generated():
    """A decoder-only batch padded on the right would continue after the padding."""
    model, inputs, edge = converted("llama")
    right = right_padded([words(6, 1), words(3, 2)])
    with pytest.raises(ValueError, match="row 1 of attention_mask .*padding on the left only"):
        edge.generate(**right, max_new_tokens=4)
    _, source, seq2seq = converted("t5")
    with pytest.raises(ValueError, match="padding on the right only"):
        seq2seq.generate(**left_padded([words(6, 1), words(3, 2)]), max_new_tokens=4)


def test_convert_names_what_a_family_takes():
    model = build_lm("llama")
    with pytest.raises(TypeError, match="convert\\(\\) got source_len, which this causal LM does not take; its sizes"):
        convert(model, source_len=8)
    with pytest.raises(UnsupportedModelError, match="Blip2ForConditionalGeneration: BLIP-2 reads its Q-Former"):
        import transformers

        convert(transformers.Blip2ForConditionalGeneration.__new__(transformers.Blip2ForConditionalGeneration))
    with pytest.raises(UnsupportedModelError, match="Linear: not a generative model this package converts"):
        convert(torch.nn.Linear(2, 2))
    from litert_torch.generative import TinyLlama, TinyLlamaConfig

    with pytest.raises(UnsupportedModelError, match="TinyLlama: .* export it with export_generative"):
        convert(TinyLlama(TinyLlamaConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)))


@pytest.mark.parametrize("name", ["llama", "whisper", "blip", "qwen2-vl (rows with images of two grids)"])
def test_a_saved_file_generates_alone(name, tmp_path):
    """The file carries its family, what generation reads and the generation config: loaded
    in place of the converted model, it returns the same ids."""
    from litert_torch.generative import load

    model, inputs, edge = converted(name)
    path = edge.export(tmp_path / "model.tflite")
    again = load(path)
    assert again.family is edge.family and again.facts == edge.facts
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 2}
    assert again.generate(**inputs, **kwargs).tolist() == edge.generate(**inputs, **kwargs).tolist()


def test_a_file_without_generation_metadata_is_refused(tmp_path):
    import litert_torch

    path = tmp_path / "plain.tflite"
    litert_torch.convert(torch.nn.Linear(2, 2), (torch.zeros(1, 2),)).export(path)
    from litert_torch.generative import load

    with pytest.raises(ValueError, match="plain.tflite: no litert_torch.generative metadata; it was not written by"):
        load(path)


def test_a_model_trained_on_the_tpu_device_converts_from_there():
    """The flow users come for: a step of training on "tpu", then the one call on the model
    and inputs where they are; the file generates what the trained model generates."""
    import tpu_backend  # noqa: F401  (the "tpu" device)

    model = build_lm("llama").to("tpu")
    inputs = {key: value.to("tpu") for key, value in left_padded([words(6, 1), words(3, 2)]).items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    optimizer.step()
    edge = convert(model, inputs, progress=False, cache_len=48)
    assert next(model.parameters()).device.type == "tpu"  # converted from a CPU view, left where it was
    trained = build_lm("llama")
    trained.load_state_dict({key: value.cpu() for key, value in model.state_dict().items()})
    cpu_inputs = {key: value.cpu() for key, value in inputs.items()}
    want = transformers_generate(trained, cpu_inputs, max_new_tokens=8)
    assert edge.generate(**inputs, max_new_tokens=8).tolist() == want.tolist()
    assert want.tolist() != transformers_generate(build_lm("llama"), cpu_inputs, max_new_tokens=8).tolist()


def test_an_image_encoder_decoder_continues_the_decoder_prompt_it_is_given():
    """TrOCR and Donut users pass a task's decoder prompt as decoder_input_ids."""
    model, inputs, edge = converted("vit + gpt2")
    prompt = torch.tensor([[model.config.decoder_start_token_id, 7, 9]] * 2)
    got = edge.generate(**inputs, decoder_input_ids=prompt, max_new_tokens=6)
    assert got[:, :3].tolist() == prompt.tolist()
    assert got.tolist() == transformers_generate(model, inputs, decoder_input_ids=prompt, max_new_tokens=6).tolist()


@pytest.mark.parametrize("family", ["CLIP", "Siglip"])
def test_dual_encoders_embed_images_and_texts_as_their_get_features(family):
    """CLIPModel / SiglipModel: `embed(pixel_values=...)` is `get_image_features`,
    `embed(input_ids=...)` `get_text_features` (SigLIP's text padded to the processor's
    max_length, no mask), one signature each."""
    import transformers

    torch.manual_seed(0)
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text = dict(tower, vocab_size=99, max_position_embeddings=16, **({"eos_token_id": 2} if family == "CLIP" else {}))
    config = getattr(transformers, f"{family}Config")(
        text_config=text, vision_config=dict(tower, image_size=32, patch_size=8)
    )
    model = getattr(transformers, f"{family}Model")(config).eval()
    ids = torch.randint(3, 99, (2, 16), generator=torch.Generator().manual_seed(1))
    ids[:, -1] = 2
    texts = {"input_ids": ids, **({"attention_mask": torch.ones_like(ids)} if family == "CLIP" else {})}
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    edge = convert(model, {"pixel_values": pixels, **texts}, progress=False)
    with torch.no_grad():
        images_want = model.get_image_features(pixel_values=pixels).pooler_output
        texts_want = model.get_text_features(**texts).pooler_output
    assert (edge.embed(pixel_values=pixels) - images_want).abs().max() <= TOLERANCE
    assert (edge.embed(**texts) - texts_want).abs().max() <= TOLERANCE
    with pytest.raises(ValueError, match="input_ids has 8 tokens a row; the file takes 16: pad as the processor"):
        edge.embed(input_ids=ids[:, :8])
    with pytest.raises(ValueError, match="pass pixel_values \\(image embeddings\\) or input_ids"):
        edge.embed(pixel_values=pixels, **texts)


@pytest.mark.parametrize(
    "name", ["gemma3 (two rows, an image each)", "paligemma (prefix-LM)", "smolvlm (two rows of 2x2 tiles)"]
)
def test_a_vision_language_model_answers_a_prompt_without_images(name):
    """No image tokens, no pixel_values: the prefill runs without encode_image, as
    transformers' generate runs the text path alone."""
    model, inputs, edge = converted(name)
    text = left_padded([words(5, 1), words(3, 2)])
    if name.startswith("paligemma"):
        text["token_type_ids"] = torch.zeros_like(text["input_ids"])
    got = edge.generate(**text, max_new_tokens=6)
    assert got.tolist() == transformers_generate(model, text, max_new_tokens=6).tolist()


def test_a_batch_mixing_a_prompt_with_an_image_and_one_without():
    model, _, edge = converted("gemma3 (two rows, an image each)")
    from benchmarks.families import vlm as tv
    from benchmarks.families.one_call import vlm_inputs

    inputs = vlm_inputs(model, [tv.prompt_with_images(1, 3, 2, seed=1), words(5, 2)], images=1)
    got = edge.generate(**inputs, max_new_tokens=6)
    assert got.tolist() == transformers_generate(model, inputs, max_new_tokens=6).tolist()
