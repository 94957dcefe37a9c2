"""Tiny random-weight transformers decoders, one per family, for the family table
(docs/llm_families.md) and the generative tests. Windows are small (8) so that a short
generation goes beyond every one of them."""

from __future__ import annotations

import warnings

import torch

WINDOW = 8
VOCAB = 96


def _llama_like(**extra):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
    )
    base.update(extra)
    return base


# family -> (config class, model class, config kwargs)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _llama_like()),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _llama_like()),
    "mistral (sliding_window)": ("MistralConfig", "MistralForCausalLM", _llama_like(sliding_window=WINDOW)),
    "qwen2 (use_sliding_window)": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        _llama_like(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, num_hidden_layers=3),
    ),
    "qwen3 (use_sliding_window)": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        _llama_like(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    ),
    "phi3 (sliding_window)": ("Phi3Config", "Phi3ForCausalLM", _llama_like(sliding_window=WINDOW, pad_token_id=0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _llama_like()),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        _llama_like(
            sliding_window=WINDOW, attn_logit_softcapping=5.0, final_logit_softcapping=3.0, query_pre_attn_scalar=24
        ),
    ),
    "gemma3 text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        _llama_like(
            sliding_window=WINDOW,
            num_hidden_layers=3,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _llama_like()),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        _llama_like(embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0),
    ),
    "cohere": ("CohereConfig", "CohereForCausalLM", _llama_like(use_qk_norm=False)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _llama_like(head_dim=None)),
    "phi": (
        "PhiConfig",
        "PhiForCausalLM",
        {k: v for k, v in _llama_like(qk_layernorm=True).items() if k != "head_dim"},
    ),
    "starcoder2 (sliding_window)": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        _llama_like(head_dim=None, sliding_window=WINDOW),
    ),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    "gpt_bigcode (multi-query)": (
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, multi_query=True),
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            rotary_pct=0.5,
        ),
    ),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8),
    ),
    "codegen": (
        "CodeGenConfig",
        "CodeGenForCausalLM",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8),
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            word_embed_proj_dim=64,
        ),
    ),
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128),
    ),
    "falcon (alibi)": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
            alibi=True,
        ),
    ),
    "bloom (alibi)": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)),
    "gpt_neo (local attention)": (
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            max_position_embeddings=128,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
        ),
    ),
    "mpt (alibi)": (
        "MptConfig",
        "MptForCausalLM",
        dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=128),
    ),
    "mixtral (MoE)": (
        "MixtralConfig",
        "MixtralForCausalLM",
        _llama_like(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    ),
    "qwen3_moe (MoE)": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        _llama_like(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1),
    ),
    "llama (dynamic rope)": (
        "LlamaConfig",
        "LlamaForCausalLM",
        _llama_like(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    ),
}


def build(family: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    config_name, model_name, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = getattr(transformers, config_name)(**kwargs)
        model = getattr(transformers, model_name)(cfg)
    return model.eval()


def longest_window(model) -> int:
    from litert_torch.generative.transformers_lm import layer_windows

    cfg = model.config
    windows = [w for w in layer_windows(cfg, cfg.num_hidden_layers) if w]
    return max(windows, default=0)
