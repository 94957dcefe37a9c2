"""The cache building blocks in PyTorch, the export's argument checks, and a model
whose parameters live on the "tpu" device."""

from __future__ import annotations

import pytest
import torch

from litert_torch.generative import (
    TinyLlama,
    TinyLlamaConfig,
    export_generative,
    generate,
    reference_generate,
    with_kv_cache,
)
from litert_torch.generative.kv_cache import MASKED_SCORE, attention_bias, write_cache


@pytest.mark.parametrize("positions", [[5], [0, 1, 2], [7, 3, 9, 0]])
def test_write_cache_equals_index_copy(positions):
    torch.manual_seed(0)
    cache = torch.randn(1, 2, 10, 4)
    new = torch.randn(1, 2, len(positions), 4)
    pos = torch.tensor(positions, dtype=torch.int32)
    expected = cache.index_copy(2, pos.long(), new)
    torch.testing.assert_close(write_cache(cache, new, pos), expected, rtol=0, atol=0)


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
            logits, cache = model(ids[:, i:i + 1], torch.tensor([i]), cache)
            torch.testing.assert_close(logits, full[:, i:i + 1], rtol=1e-5, atol=1e-5)


def test_export_arguments_are_checked():
    model = TinyLlama(TinyLlamaConfig(max_seq_len=32))
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len"):
        export_generative(model, prefill_len=8, cache_len=64)
    with pytest.raises(ValueError, match="prefill_len"):
        export_generative(model, prefill_len=16, cache_len=8)
    with pytest.raises(TypeError, match="Llama layout"):
        with_kv_cache(torch.nn.Linear(2, 2), 8)


def test_sliding_window_models_are_refused():
    import transformers
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   use_sliding_window=True, sliding_window=4, max_window_layers=1)
    model = transformers.Qwen3ForCausalLM(cfg)
    with pytest.raises(NotImplementedError, match="sliding_attention"):
        with_kv_cache(model, 16)


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


@pytest.mark.slow
def test_convert_options_reach_both_signatures():
    from litert_torch import quantize

    torch.manual_seed(0)
    model = TinyLlama(TinyLlamaConfig(n_layers=1, max_seq_len=32)).eval()
    plain = export_generative(model, prefill_len=4, cache_len=32, progress=False)
    small = export_generative(model, prefill_len=4, cache_len=32, progress=False,
                              quant_config=quantize.weight_only_int8())
    assert len(small) < 0.5 * len(plain), (len(small), len(plain))
    new = generate(small, [3, 1, 4, 1, 5, 9], 10)
    assert len(new) == 10 and all(0 <= t < 256 for t in new)
