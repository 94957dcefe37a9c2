"""The cache building blocks in PyTorch, the export's argument checks, and a model
whose parameters live on the "tpu" device."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from benchmarks.families.causal_lm import build
from litert_torch.generative import (
    TinyLlama,
    TinyLlamaConfig,
    UnsupportedModelError,
    export_generative,
    generate,
    reference_generate,
    verify_cached_lm,
    with_kv_cache,
)
from litert_torch.generative.kv_cache import (
    MASKED_SCORE,
    attention_bias,
    check_positions,
    ring_attention_bias,
    write_cache,
    write_ring,
)
from runtimes.litert import max_relative_error


@pytest.mark.parametrize("positions", [[5], [0, 1, 2], [3, 4, 5, 6], [7, 8, 9]])
def test_write_cache_equals_index_copy(positions):
    torch.manual_seed(0)
    cache = torch.randn(1, 2, 10, 4)
    new = torch.randn(1, 2, len(positions), 4)
    pos = torch.tensor(positions, dtype=torch.int32)
    expected = cache.index_copy(2, pos.long(), new)
    for write in ("select", "update_slice"):  # the two ways of writing one token
        with _decode_write(write):
            torch.testing.assert_close(write_cache(cache, new, pos), expected, rtol=0, atol=0)


def test_padding_lands_after_the_prompt_only():
    """A chunk [2, pad, pad] is written as one block: the padding entries go to slots 3-4,
    after the prompt (hidden by the mask, overwritten by the next write); slots 0, 1, 5 keep
    their values."""
    cache = torch.randn(1, 2, 6, 4)
    new = torch.randn(1, 2, 3, 4)
    out = write_cache(cache, new, torch.tensor([2, -1, -1], dtype=torch.int32))
    torch.testing.assert_close(out, cache.index_copy(2, torch.tensor([2, 3, 4]), new), rtol=0, atol=0)


@pytest.mark.parametrize(
    "positions,match",
    [
        ([3, 1, 2], r"input_pos must be consecutive from input_pos\[0\] with padding \(-1\) only at the end"),
        ([0, -1, 2], "only at the end"),
        ([-1, 0, 1], "must start with a real position"),
        ([-1, -1, -1], "a chunk of padding only"),
        ([8, 9, 10], "runs past the cache \\(10 slots\\); start it at most at 7"),
        ([10], "runs past the cache"),
    ],
)
def test_positions_outside_the_contract_are_refused_by_name(positions, match):
    """Eagerly (PyTorch) the cache write checks its positions; so does `generate` on the
    host before each LiteRT call (a compiled file could not: DYNAMIC_UPDATE_SLICE clamps)."""
    model = TinyLlama(TinyLlamaConfig(n_layers=1, max_seq_len=32)).eval()
    tokens = torch.zeros(1, len(positions), dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        model(tokens, torch.tensor(positions), model.empty_cache(10))
    with pytest.raises(ValueError, match=match):
        check_positions(np.array(positions, np.int32), 10)


@contextlib.contextmanager
def _decode_write(write: str):
    from litert_torch.generative import kv_cache

    before, kv_cache.DECODE_WRITE = kv_cache.DECODE_WRITE, write
    try:
        yield
    finally:
        kv_cache.DECODE_WRITE = before


@pytest.mark.parametrize(
    "window,chunks",
    [
        (4, [[0, 1, 2]]),
        (4, [[0, 1, 2], [3, 4, 5, -1]]),
        (3, [[0, 1, 2, 3, 4, 5, 6]]),
        (4, [[0, 1], [2], [3], [4], [5]]),
    ],
)
def test_ring_buffer_holds_the_last_window_positions(window, chunks):
    """After each chunk, slot p % window holds position p for the last `window` positions;
    the mask over [ring, chunk] shows each query exactly the keys of its window."""
    torch.manual_seed(0)
    values = torch.randn(1, 1, 32, 2)  # the "key" of position p is values[:, :, p]
    ring = torch.zeros(1, 1, window, 2)
    for chunk in chunks:
        pos = torch.tensor(chunk, dtype=torch.int32)
        new = values[:, :, pos.clamp(min=0).long()] * (pos >= 0).reshape(1, 1, -1, 1)
        bias = ring_attention_bias(pos, window)
        keys = torch.cat([ring, new], dim=2)
        for i, q in enumerate(chunk):
            if q < 0:
                continue
            seen = keys[0, 0, bias[i] == 0]  # ring slots come in slot order, not position order
            want = values[0, 0, max(0, q - window + 1) : q + 1]
            torch.testing.assert_close(seen[seen[:, 0].argsort()], want[want[:, 0].argsort()], rtol=0, atol=0)
        ring = write_ring(ring, new, pos)
        last = max(chunk)
        for p in range(max(0, last - window + 1), last + 1):
            torch.testing.assert_close(ring[0, 0, p % window], values[0, 0, p], rtol=0, atol=0)


def test_attention_bias_hides_slots_after_each_position():
    bias = attention_bias(torch.tensor([2, 3], dtype=torch.int32), 5)
    visible = bias == 0
    assert visible.tolist() == [[True, True, True, False, False], [True, True, True, True, False]]
    assert (bias[~visible] == MASKED_SCORE).all()


def test_cached_forward_equals_full_forward():
    """A prefill chunk then decode steps, each on the cache of the step before, give the
    logits of one causal pass over the whole sequence."""
    torch.manual_seed(0)
    model = TinyLlama(TinyLlamaConfig(max_seq_len=32)).eval()
    ids = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        full = model(ids)
        logits, cache = model(ids[:, :6], torch.arange(6), model.empty_cache(16))
        torch.testing.assert_close(logits, full[:, :6], rtol=1e-5, atol=1e-5)
        for i in range(6, 9):
            logits, cache = model(ids[:, i : i + 1], torch.tensor([i]), cache)
            torch.testing.assert_close(logits, full[:, i : i + 1], rtol=1e-5, atol=1e-5)


def test_export_arguments_are_checked():
    model = TinyLlama(TinyLlamaConfig(max_seq_len=32))
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len"):
        export_generative(model, prefill_len=8, cache_len=64)
    with pytest.raises(ValueError, match="prefill_len"):
        export_generative(model, prefill_len=16, cache_len=8)
    with pytest.raises(TypeError, match="not a transformers causal LM"):
        with_kv_cache(torch.nn.Linear(2, 2), 8)
    with pytest.raises(ValueError, match="prefill_logits"):
        export_generative(model, prefill_len=8, cache_len=16, prefill_logits="first")


@pytest.mark.parametrize(
    "family,match",
    [
        ("llama (dynamic rope)", "rope_type 'dynamic'"),
        ("gpt_neo (local attention)", "local attention layers"),
        ("falcon (alibi)", "config.alibi=True"),
    ],
)
def test_what_would_not_be_exact_is_refused_by_name(family, match):
    with pytest.raises(UnsupportedModelError, match=match):
        with_kv_cache(build(family), 32)


def test_an_unknown_layer_type_is_refused():
    model = build("gemma3 text")
    model.config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match="layer 1 has attention type 'chunked_attention'"):
        with_kv_cache(model, 32)


def test_a_window_the_model_does_not_use_is_refused():
    """The config and the attention layers disagree (here the config loses its window):
    the attention function sees the model's own sliding_window and refuses."""
    model = build("mistral (sliding_window)")
    lm = with_kv_cache(model, 32)
    lm.inner.plans[0].window, lm.inner.plans[0].ring = None, False
    with pytest.raises(UnsupportedModelError, match="attends with sliding_window=8, its config says None"):
        lm(torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), lm.empty_cache())


def test_a_window_longer_than_the_cache_is_full_attention():
    """Gemma 2's 4096-token window with a 24-slot cache: every position sees the whole
    cache, so the layer is planned as full attention, and the model's own sliding_window
    argument agrees with that plan (it used to be refused)."""
    model = build("gemma2")
    model.config.sliding_window = 4096
    for layer in model.model.layers:
        layer.self_attn.sliding_window = 4096 if layer.self_attn.sliding_window else None
    assert verify_cached_lm(model, cache_len=24, prefill_len=8) <= 1e-5


@pytest.mark.parametrize("experts", ["gather", "dense"])
def test_mixture_of_experts_is_exact_in_both_forms(experts):
    """Mixtral-style top-2 of 4 routing through transformers' ExpertsInterface: the gather
    form (transformers' batched_mm) and the dense all-experts form equal the model's own
    forward at every position."""
    assert verify_cached_lm(build("mixtral (MoE)"), cache_len=24, prefill_len=8, experts=experts) <= 1e-5


@pytest.mark.parametrize(
    "family", ["mistral (sliding_window)", "qwen2 (use_sliding_window)", "gemma2", "phi3 (sliding_window)"]
)
def test_sliding_window_models_are_exact_in_pytorch_beyond_the_window(family):
    """Every spelling of a window (sliding_window, use_sliding_window + max_window_layers,
    layer_types), soft-capping and query_pre_attn_scalar: the cached model's logits at
    every position of 40 (5x the window) equal the model's own forward."""
    assert verify_cached_lm(build(family), cache_len=40, prefill_len=8) <= 1e-5


def test_a_model_on_the_tpu_device_exports_and_stays_there():
    import tpu_backend  # noqa: F401  (registers the device)

    torch.manual_seed(0)
    reference = TinyLlama(TinyLlamaConfig(n_layers=1, max_seq_len=32)).eval()
    on_tpu = TinyLlama(TinyLlamaConfig(n_layers=1, max_seq_len=32)).to("tpu").eval()
    on_tpu.load_state_dict(reference.state_dict())
    edge = export_generative(on_tpu, prefill_len=4, cache_len=32, progress=False)
    assert all(p.device.type == "tpu" for p in on_tpu.parameters())
    prompt = [3, 1, 4, 1, 5, 9]
    assert generate(edge, prompt, 10) == reference_generate(reference, prompt, 10)


def test_grouped_attention_equals_attention_over_repeated_kv_heads():
    from litert_torch.generative.attention import grouped_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    bias = attention_bias(torch.arange(3, 8, dtype=torch.int32), 12)
    k4, v4 = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    expected = torch.softmax(q @ k4.transpose(2, 3) * 0.25 + bias, dim=-1) @ v4
    torch.testing.assert_close(grouped_attention(q, k, v, bias, 0.25), expected, rtol=1e-5, atol=1e-6)


def test_int8_export_agrees_with_the_float_model_in_logits_and_is_smaller():
    """Weight-only int8 on both signatures: under 0.35x the float file, and the logits of
    prefill and of every decode step within 2% (max relative) of PyTorch's float model."""
    from litert_torch import quantize

    torch.manual_seed(0)
    model = TinyLlama(TinyLlamaConfig(n_layers=1, dim=128, hidden_dim=256, max_seq_len=32)).eval()
    plain = export_generative(model, prefill_len=4, cache_len=32, progress=False, prefill_logits="all")
    small = export_generative(
        model,
        prefill_len=4,
        cache_len=32,
        progress=False,
        prefill_logits="all",
        quant_config=quantize.weight_only_int8(),
    )
    assert len(small) < 0.35 * len(plain), (len(small), len(plain))
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids.long()).numpy()[0]
    for edge, tolerance in ((plain, 1e-4), (small, 2e-2)):
        cache = [np.zeros(s.shape, np.float32) for s in edge.runtime.signature("decode").inputs[2:]]
        logits, *cache = edge.runtime.run([ids[:, :4].int().numpy(), np.arange(4, dtype=np.int32), *cache], "prefill")
        errors = [max_relative_error(logits[0], expected[:4])]
        for pos in range(4, 12):
            logits, *cache = edge.runtime.run(
                [ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache], "decode"
            )
            errors.append(max_relative_error(logits[0, -1], expected[pos]))
        assert max(errors) <= tolerance, (tolerance, errors)
