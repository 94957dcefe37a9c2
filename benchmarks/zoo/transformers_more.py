"""More transformers architectures (attention variants and state-space models), tiny configs,
random weights, nothing downloaded; `transformers` is imported inside the factories."""

from __future__ import annotations

from .registry import zoo_model
from .transformers_models import SEQ, VOCAB, HiddenStates, token_ids


@zoo_model("hf_bloom", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_bloom():
    """BLOOM LM (2 layers, hidden 64, 4 heads): ALiBi attention biases (no position embeddings)."""
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
    return HiddenStates(BloomForCausalLM(config).eval(), "logits", use_cache=False)


@zoo_model("hf_gpt_bigcode", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_gpt_bigcode():
    """GPTBigCode (SantaCoder-style) LM: multi-query attention (one shared key/value head)."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    config = GPTBigCodeConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=True)
    return HiddenStates(GPTBigCodeForCausalLM(config).eval(), "logits", use_cache=False)


@zoo_model("hf_mistral", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_mistral():
    """Mistral LM with a sliding window (8) shorter than the sequence: banded causal mask, GQA, RoPE."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=8,
    )
    return HiddenStates(MistralForCausalLM(config).eval(), "logits", use_cache=False)


@zoo_model("hf_deberta_v2", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_deberta_v2():
    """DeBERTa-v2 encoder: disentangled (content-to-position, position-to-content) relative attention."""
    from transformers import DebertaV2Config, DebertaV2Model

    config = DebertaV2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        relative_attention=True,
        position_buckets=8,
        pos_att_type=["p2c", "c2p"],
    )
    return HiddenStates(DebertaV2Model(config).eval())


@zoo_model("hf_mamba", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_mamba():
    """Mamba LM (2 layers, hidden 32, state 8): causal depthwise conv1d, selective scan (state-space)."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=4
    )
    return HiddenStates(MambaForCausalLM(config).eval(), "logits", use_cache=False)


@zoo_model("hf_gpt_neox", [(1, SEQ)], "transformers", make_inputs=token_ids(1, SEQ))
def hf_gpt_neox():
    """GPT-NeoX LM: partial rotary embeddings, parallel attention + MLP residual."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rotary_pct=0.5,
    )
    return HiddenStates(GPTNeoXForCausalLM(config).eval(), "logits", use_cache=False)
