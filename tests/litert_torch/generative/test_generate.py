"""Generative export: prefill/decode signatures with a KV cache, run in LiteRT, checked by
the logits of every prefill chunk and every decode step against the model's own
forward (max relative error <= 1e-4), on sequences longer than every sliding window and
crossing prefill-chunk and ring-buffer boundaries; plus greedy and sampled generation
token for token. Models: TinyLlama, Mistral with sliding_window=8 (every layer a ring
buffer), Gemma 3 text (two sliding layers, one global)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate, reference_generate
from runtimes.litert import max_relative_error
from tests.litert_torch.generative.families import VOCAB, WINDOW, build

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


def run_stepwise(edge, ids: torch.Tensor, prompt_len: int, prefill: str = "prefill") -> list[np.ndarray]:
    """Logits of each step as `generate` runs them: prefill chunks over the prompt (the
    last one padded with position -1), then one decode call per remaining token of `ids`.
    Returns one (positions, vocab) array per call, for the positions it returns."""
    runtime = edge.runtime
    chunk = runtime.signature(prefill).inputs[0].shape[1]
    cache = [np.zeros(s.shape, np.float32) for s in runtime.signature("decode").inputs[2:]]
    out = []
    for start in range(0, prompt_len, chunk):
        n = min(chunk, prompt_len - start)
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, :n] = ids[0, start : start + n].numpy()
        positions = np.full(chunk, -1, np.int32)
        positions[:n] = np.arange(start, start + n)
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
    assert generate(edge, prompt, new) == reference_generate(model, prompt, new)


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
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(edge, [], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate(edge, [1, 2], max_new_tokens=-1)
    assert generate(edge, [1, 2], max_new_tokens=0) == []


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
