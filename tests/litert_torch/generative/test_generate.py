"""Generative export: prefill/decode signatures with a KV cache, greedy generation in
LiteRT matching PyTorch token for token, on TinyLlama and transformers Llama/Qwen3."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate, reference_generate
from runtimes.litert import max_relative_error

PREFILL, CACHE, NEW_TOKENS = 8, 40, 20
VOCAB = 256


def tiny_llama() -> TinyLlama:
    torch.manual_seed(0)
    return TinyLlama(TinyLlamaConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                     hidden_dim=128, max_seq_len=64)).eval()


def hf_model(family: str):
    import transformers
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    cfg = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_cls(cfg).eval()


def torch_logits(model, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = model(ids.long())
    return getattr(out, "logits", out).numpy()


@pytest.fixture(scope="module", params=["tiny_llama", "hf_llama", "hf_qwen3"])
def exported(request):
    model = tiny_llama() if request.param == "tiny_llama" else hf_model(request.param[3:])
    return model, export_generative(model, prefill_len=PREFILL, cache_len=CACHE, progress=False)


def test_two_signatures_with_the_cache_as_inputs_and_outputs(exported):
    model, edge = exported
    prefill, decode = (edge.runtime.signature(k) for k in ("prefill", "decode"))
    assert prefill.input_names[:2] == ["tokens", "input_pos"]
    assert prefill.inputs[0].shape == (1, PREFILL) and decode.inputs[0].shape == (1, 1)
    caches = prefill.inputs[2:]
    assert len(caches) == 4 and all(c.shape == (1, 2, CACHE, 16) for c in caches)  # 2 layers x (k, v)
    assert prefill.output_names == decode.output_names == ["logits"] + [c.name for c in caches]
    assert [o.shape for o in prefill.outputs[1:]] == [c.shape for c in caches]
    assert decode.outputs[0].shape == (1, 1, VOCAB)
    # one copy of the weights for both signatures
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert len(edge) < 1.15 * weights, (len(edge), weights)


def test_greedy_generation_matches_pytorch_token_for_token(exported):
    model, edge = exported
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1))  # two prefill chunks
    assert generate(edge, prompt, NEW_TOKENS) == reference_generate(model, prompt, NEW_TOKENS)


def test_prefill_and_decode_logits_match_pytorch(exported):
    model, edge = exported
    ids = torch.randint(0, VOCAB, (1, PREFILL + 1), generator=torch.Generator().manual_seed(2))
    expected = torch_logits(model, ids)
    cache = [np.zeros(s.shape, np.float32) for s in edge.runtime.signature("prefill").inputs[2:]]
    logits, *cache = edge(ids[:, :PREFILL].int(), torch.arange(PREFILL, dtype=torch.int32), cache,
                          signature_name="prefill")
    assert max_relative_error(logits, expected[:, :PREFILL]) <= 1e-4
    logits, *cache = edge(ids[:, PREFILL:].int(), torch.tensor([PREFILL], dtype=torch.int32), cache,
                          signature_name="decode")
    assert max_relative_error(logits, expected[:, PREFILL:]) <= 1e-4


def test_a_prompt_that_does_not_fit_the_cache_is_refused(exported):
    _, edge = exported
    with pytest.raises(ValueError, match="exceeds the exported cache length"):
        generate(edge, list(range(30)), max_new_tokens=20)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(edge, [], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate(edge, [1, 2], max_new_tokens=-1)
    assert generate(edge, [1, 2], max_new_tokens=0) == []
