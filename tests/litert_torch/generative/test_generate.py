"""Generative export: prefill/decode signatures with a KV cache, run in LiteRT, checked by
the logits of every prefill chunk and every decode step against the model's own
forward (max relative error <= 1e-4), on sequences longer than every sliding window and
crossing prefill-chunk and ring-buffer boundaries; plus greedy and sampled generation
token for token. Models: TinyLlama, Mistral with sliding_window=8 (every layer a ring
buffer), Gemma 3 text (two sliding layers, one global)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from benchmarks.families.causal_lm import VOCAB, WINDOW, build
from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate, reference_generate
from runtimes.litert import max_relative_error

PREFILL, CACHE = 8, 40
STEPS = 3 * WINDOW + 8  # prompt + generation: beyond 3x every window
TOLERANCE = 1e-4


def tiny_llama() -> TinyLlama:
    torch.manual_seed(0)
    return TinyLlama(
        TinyLlamaConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, max_seq_len=64)
    ).eval()


def torch_logits(model, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = model(ids.long())
    return getattr(out, "logits", out).numpy()


MODELS = {
    "tiny_llama": tiny_llama,
    "mistral_sliding": lambda: build("mistral (sliding_window)"),
    "gemma3_text": lambda: build("gemma3 text"),
}


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request):
    model = MODELS[request.param]()
    return request.param, model, export_generative(model, prefill_len=PREFILL, cache_len=CACHE, progress=False)


def run_stepwise(
    edge, ids: torch.Tensor, prompt_len: int, prefill: str = "prefill", continue_positions: bool = False
) -> list[np.ndarray]:
    """Logits of each step as `generate` runs them: prefill chunks over the prompt (the
    last one padded at the end, with random tokens, at position -1 or, with
    `continue_positions`, at the positions after the prompt), then one decode call per
    remaining token of `ids`. Returns one (positions, vocab) array per call."""
    runtime = edge.runtime
    chunk = runtime.signature(prefill).inputs[0].shape[1]
    cache = [np.zeros(s.shape, np.float32) for s in runtime.signature("decode").inputs[2:]]
    junk = torch.randint(0, VOCAB, (chunk,), generator=torch.Generator().manual_seed(9)).int().numpy()
    out = []
    for start in range(0, prompt_len, chunk):
        n = min(chunk, prompt_len - start)
        tokens = junk[None].copy()
        tokens[0, :n] = ids[0, start : start + n].numpy()
        positions = np.arange(start, start + chunk, dtype=np.int32)
        if not continue_positions:
            positions[n:] = -1
        logits, *cache = runtime.run([tokens, positions, *cache], prefill)
        out.append(logits[0])
    for pos in range(prompt_len, ids.shape[1]):
        logits, *cache = runtime.run([ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache], "decode")
        out.append(logits[0])
    return out


def test_two_signatures_with_the_cache_as_inputs_and_outputs(exported):
    name, model, edge = exported
    prefill, decode = (edge.runtime.signature(k) for k in ("prefill", "decode"))
    assert prefill.input_names[:2] == ["tokens", "input_pos"]
    assert prefill.inputs[0].shape == (1, PREFILL) and decode.inputs[0].shape == (1, 1)
    caches = prefill.inputs[2:]
    # the cache of a sliding layer is a ring buffer of the window, a global layer's the whole context
    slots = {"tiny_llama": [CACHE] * 2, "mistral_sliding": [WINDOW] * 2, "gemma3_text": [WINDOW, WINDOW, CACHE]}[name]
    assert [c.shape for c in caches] == [(1, 2, s, 16) for s in slots for _ in "kv"]
    kinds = ["cache" if s == CACHE else "ring" for s in slots for _ in "kv"]
    assert [c.name for c in caches] == [f"kv_cache_{i}" for i in range(len(caches))]
    assert (
        prefill.output_names == decode.output_names == ["logits"] + [f"kv_{kind}_{i}" for i, kind in enumerate(kinds)]
    )
    assert [o.shape for o in prefill.outputs[1:]] == [c.shape for c in caches]
    # prefill returns the logits of its last position only (the default)
    assert prefill.outputs[0].shape == decode.outputs[0].shape == (1, 1, VOCAB)
    weights = sum(p.numel() * 4 for p in model.parameters())
    # one copy of the weights for all signatures (tiny models: constants and graph add ~20%)
    assert len(edge) < 1.3 * weights, (len(edge), weights)


def test_logits_at_every_step_match_the_models_own_forward(exported):
    """The padded chunk writes its padding's keys (random tokens, position -1) into the
    slots after the prompt: no later step sees them (decode overwrites each slot before
    attending to it)."""
    _, model, edge = exported
    ids = torch.randint(0, VOCAB, (1, STEPS), generator=torch.Generator().manual_seed(2))
    expected = torch_logits(model, ids)[0]
    prompt_len = PREFILL + 3  # two prefill chunks, the second padded
    got = run_stepwise(edge, ids, prompt_len)
    # prefill returns the chunk's last slot: position 7, then the padded slot (ignored)
    assert max_relative_error(got[0][-1], expected[PREFILL - 1]) <= TOLERANCE
    errors = [max_relative_error(g[-1], expected[pos]) for pos, g in enumerate(got[2:], start=prompt_len)]
    assert len(errors) == STEPS - prompt_len and max(errors) <= TOLERANCE, errors


def test_greedy_generation_matches_pytorch_token_for_token(exported):
    _, model, edge = exported
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1))  # two prefill chunks
    new = STEPS - len(prompt)
    got, got_rows = generate(edge, prompt, new, return_logits=True)
    want, want_rows = reference_generate(model, prompt, new, return_logits=True)
    assert got == want == generate(edge, prompt, new)
    errors = [max_relative_error(a, b) for a, b in zip(got_rows, want_rows, strict=True)]
    assert len(errors) == new and max(errors) <= TOLERANCE, errors


def test_sampling_matches_pytorch_with_the_same_seed(exported):
    _, model, edge = exported
    prompt = [5, 3, 9, 1, 4, 4, 7, 2]  # one full chunk: its logits come from prefill
    options = dict(temperature=0.9, top_k=20, top_p=0.95, seed=7)
    sampled = generate(edge, prompt, 16, **options)
    assert sampled == reference_generate(model, prompt, 16, **options)
    assert generate(edge, prompt, 16, **options) == sampled  # the seed makes it repeatable
    stop = sampled[5]
    first = sampled.index(stop)
    assert generate(edge, prompt, 16, stop_tokens=[stop], **options) == sampled[: first + 1]


def test_a_prompt_that_does_not_fit_the_cache_is_refused(exported):
    name, _, edge = exported
    if name == "mistral_sliding":  # every layer a ring buffer: no context limit from the cache
        assert len(generate(edge, list(range(30)), max_new_tokens=20)) == 20
    else:
        with pytest.raises(ValueError, match="exceeds the exported cache length"):
            generate(edge, list(range(30)), max_new_tokens=20)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        generate(edge, [], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate(edge, [1, 2], max_new_tokens=-1)
    assert generate(edge, [1, 2], max_new_tokens=0) == []


def test_a_batch_out_of_range_or_non_integer_prompt_is_refused_never_joined(exported):
    """Rows of a (2, N) prompt are two sequences: joined into one 2N-token prompt they gave
    one continuation of both. A (1, N) prompt is one sequence; ids are checked against the
    vocabulary before LiteRT's GATHER fails without naming them."""
    _, _, edge = exported
    rows = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        ValueError, match=r"prompt_ids has shape \(2, 5\): this call takes one example.*each of the 2 rows"
    ):
        generate(edge, rows, max_new_tokens=3)
    assert generate(edge, rows[:1], max_new_tokens=3) == generate(edge, rows[0], max_new_tokens=3)
    with pytest.raises(
        ValueError, match=rf"token id {VOCAB} \(at position 1\), outside the model's vocabulary of {VOCAB} ids"
    ):
        generate(edge, [1, VOCAB, 2], max_new_tokens=3)
    with pytest.raises(ValueError, match=r"a negative token id \(-1\)"):
        generate(edge, [1, -1], max_new_tokens=3)
    with pytest.raises(TypeError, match="prompt_ids must hold integer token ids, got float32"):
        generate(edge, torch.tensor([1.0, 2.5]), max_new_tokens=3)


def test_several_prefill_lengths_share_the_weights_and_generate_exactly():
    """prefill_4 and prefill_8 in one file (weights stored once), prefill without logits:
    generation picks the chunks (8 + 4 + padded 4) and runs the last prompt token through
    decode; the result equals PyTorch, and so do the logits of a prefill_4 chunk's cache."""
    model = tiny_llama()
    edge = export_generative(model, prefill_len=[8, 4], cache_len=CACHE, prefill_logits="none", progress=False)
    keys = [s.key for s in edge.runtime.signatures]
    assert sorted(keys) == ["decode", "prefill_4", "prefill_8"]
    assert edge.runtime.signature("prefill_4").output_names[0] == "kv_cache_0"  # no logits
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.3 * weights, (len(edge), weights)
    prompt = torch.randint(0, VOCAB, (15,), generator=torch.Generator().manual_seed(4))
    assert generate(edge, prompt, 20) == reference_generate(model, prompt, 20)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(5))
    runtime = edge.runtime
    cache = [np.zeros(s.shape, np.float32) for s in runtime.signature("decode").inputs[2:]]
    cache = runtime.run([ids[:, :4].int().numpy(), np.arange(4, dtype=np.int32), *cache], "prefill_4")
    errors = []
    for pos in range(4, 7):
        logits, *cache = runtime.run([ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache], "decode")
        errors.append(max_relative_error(logits[0, -1], torch_logits(model, ids)[0, pos]))
    assert max(errors) <= TOLERANCE, errors


def test_sampler_restricts_to_top_k_and_top_p_and_checks_its_arguments():
    from litert_torch.generative import Sampler

    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    assert Sampler()(logits, rng) == 0  # greedy
    assert {Sampler(1.0, top_k=2, seed=0)(logits, rng) for _ in range(200)} == {0, 1}
    assert {Sampler(1.0, top_p=0.7)(logits, rng) for _ in range(200)} == {0, 1}  # 0.5 + 0.3 reaches 0.7
    assert {Sampler(1.0, top_p=0.4)(logits, rng) for _ in range(50)} == {0}
    draws = [Sampler(1.0)(logits, rng) for _ in range(4000)]
    assert abs(draws.count(3) / 4000 - 0.05) < 0.015  # temperature 1 keeps the model's probabilities
    for bad in (dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampler(**bad)


# ---- several prefill lengths, prompts across their boundaries (Llama- and Qwen3-style) -----
# prefill_4 and prefill_8 in one file, cache 30. Per prompt length, the calls `generate`
# makes, as (chunk length, first position): the smallest length holding the rest of the
# prompt, else the largest; a padded last chunk does not return the last prompt token's
# logits, so that token goes through decode and the chunks cover one token less.
BOUNDARY_CACHE = 30
CHUNKS = {
    3: [(4, 0)],  # 2 tokens + 2 padding, then token 2 through decode
    4: [(4, 0)],
    5: [(4, 0)],  # 8 would be padded: 4 tokens, then token 4 through decode
    8: [(8, 0)],
    9: [(8, 0)],
    12: [(8, 0), (4, 8)],
    13: [(8, 0), (4, 8)],
    27: [(8, 0), (8, 8), (8, 16), (4, 24)],  # the last chunk padded (2 tokens)
    29: [(8, 0), (8, 8), (8, 16), (8, 21)],  # 24 + 8 would run past the cache: it starts at 21, redoing 3 tokens
}
# With ring buffers (Gemma 3's sliding layers) tokens are not redone: a ring holds the
# positions before a chunk. 29 tokens: 24 + 8 does not fit, so the prompt but its last
# token is prefilled (24 + a padded 4), then that token goes through decode.
RING_CHUNKS = {**CHUNKS, 29: [(8, 0), (8, 8), (8, 16), (4, 24)]}


@functools.cache
def two_lengths(family: str):
    model = build(family)
    return model, export_generative(model, prefill_len=[4, 8], cache_len=BOUNDARY_CACHE, progress=False)


def recorded_generate(edge, prompt, new: int, monkeypatch):
    """`generate`, recording each LiteRT call as (signature, input_pos, logits)."""
    runtime, calls = edge.runtime, []
    run = runtime.run

    def recording(inputs, key):
        outputs = run(inputs, key)
        calls.append((key, inputs[1].copy(), outputs[0]))
        return outputs

    monkeypatch.setattr(runtime, "run", recording)
    return generate(edge, prompt, new), calls


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3 text"])
@pytest.mark.parametrize("prompt_len", list(CHUNKS))
def test_prompts_across_prefill_lengths_generate_exactly_with_the_logits_of_every_step(family, prompt_len, monkeypatch):
    """Greedy generation to the end of the cache equals PyTorch token for token, and the
    logits of every LiteRT call (each prefill chunk's last real position, each decode step)
    equal the model's own forward over prompt + generated tokens (max relative <= 1e-4)."""
    model, edge = two_lengths(family)
    prompt = torch.randint(0, VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    new = BOUNDARY_CACHE - prompt_len
    out, calls = recorded_generate(edge, prompt, new, monkeypatch)
    assert out == reference_generate(model, prompt, new)
    prefills = [(int(key.split("_")[1]), int(pos[0])) for key, pos, _ in calls if key.startswith("prefill")]
    assert prefills == (RING_CHUNKS if family == "gemma3 text" else CHUNKS)[prompt_len]
    expected = torch_logits(model, torch.tensor([prompt + out[:-1]]))[0]
    checked = {}
    for _, positions, logits in calls:
        last = int(positions[-1])
        assert list(positions[positions >= 0]) == list(range(positions[0], positions[0] + (positions >= 0).sum()))
        if last >= 0:  # a padded prefill chunk's last row is padding: not compared
            checked[last] = max_relative_error(logits[0, -1], expected[last])
    # the last prompt token and every generated one but the last had their logits checked
    assert set(range(prompt_len - 1, BOUNDARY_CACHE - 1)) <= set(checked)
    assert max(checked.values()) <= TOLERANCE, checked


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_padding_at_positions_after_the_prompt_does_not_reach_decode(family):
    """Padding may also carry the positions that continue the prompt's (as some runtimes
    feed it; models without sliding-window layers): a prefill_8 chunk with 3 tokens and 5
    random padding tokens at positions 11-15, then decode from position 11 on: every
    step's logits equal the model's own forward over the real tokens."""
    model, edge = two_lengths(family)
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(3))
    expected = torch_logits(model, ids)[0]
    got = run_stepwise(edge, ids, 11, prefill="prefill_8", continue_positions=True)
    errors = [max_relative_error(g[-1], expected[pos]) for pos, g in enumerate(got[2:], start=11)]
    assert max_relative_error(got[0][-1], expected[7]) <= TOLERANCE
    assert len(errors) == 24 - 11 and max(errors) <= TOLERANCE, errors


def test_a_picker_keeps_each_steps_logits_only_when_asked():
    """A step's logits are a vocabulary of floats (1 MB at Gemma's 256k): a long generation
    keeps them only for `output_logits` / `output_scores`, and then as they came and as the
    rules (here no end token before two new ones) left them."""
    from litert_torch.generative.generate import LogitsRules, Picker, Sampler

    rules = LogitsRules(eos=(2,), min_new=2)
    step = np.array([0.0, 1.0, 5.0, 3.0], np.float32)  # the end token 2 ranks first
    plain = Picker(Sampler(), rules, [1], max_new_tokens=4)
    kept = Picker(Sampler(), rules, [1], max_new_tokens=4, keep_logits=True, keep_scores=True)
    for picker in (plain, kept):
        assert [picker(step, picker.rng()) for _ in range(3)] == [3, 3, 2]
    assert plain.logits == plain.scores == []
    assert [list(x) for x in kept.logits] == [list(step)] * 3
    assert kept.scores[0][2] == kept.scores[1][2] == -np.inf and kept.scores[2][2] == 5.0
