"""One training step of many Hugging Face architectures on "tpu", against CPU (slow).

Each model is built from a tiny config with random weights, copied to the device, and run
forward (with labels) and backward in strict eager mode and under
`torch.compile(backend="tpu")`: the loss and every gradient as on CPU. The models are in
eval mode, so that no dropout draws (gradients still flow). The 29 decoder families of the
generative tests are here too (`families.py`). This sweep found what the default suite now
checks on one model each: MoE experts under compile (`torch._grouped_mm`), batch norm in
eval mode under compile, and CPU index tensors (BEiT). The causal ones also train under
`torch.compile(dynamic=True)` at three lengths (GPT-2's crash there: a slice's start padded).

    python -m pytest -q -m slow tests/tpu_backend/test_hf_architectures.py
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as hf

import tpu_backend.compile  # noqa: F401 - registers the "tpu" Dynamo backend
from benchmarks.families import causal_lm as families
from tests.tpu_backend.parity import GRADIENT_RTOL, LOSS_RTOL, ZERO_GRADIENT_FLOOR, assert_tensors_match

pytestmark = pytest.mark.slow

VOCAB = families.VOCAB
TEXT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
DECODER = dict(**TEXT, num_key_value_heads=2, max_position_embeddings=128)
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
SEQ2SEQ_LAYERS = dict(encoder_layers=2, decoder_layers=2, encoder_ffn_dim=96, decoder_ffn_dim=96)


def _decoder(config: str, model: str, **extra):
    return lambda: getattr(hf, model)(getattr(hf, config)(**{**DECODER, **extra}))


# name -> (model builder, the inputs it trains on: `batch`)
ARCHITECTURES = {
    **{family: (lambda family=family: families.build(family), "causal") for family in families.FAMILIES},
    "deepseek_v3 (MoE, MLA)": (
        _decoder(
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            num_key_value_heads=4,  # multi-head latent attention: as many as the query heads
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        "causal",
    ),
    "gpt_oss (MoE, sinks)": (
        _decoder(
            "GptOssConfig",
            "GptOssForCausalLM",
            num_local_experts=4,
            num_experts_per_tok=2,
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "causal",
    ),
    "qwen2_moe (shared expert)": (
        _decoder(
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        ),
        "causal",
    ),
    "olmoe": (_decoder("OlmoeConfig", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2), "causal"),
    "mamba": (
        lambda: hf.MambaForCausalLM(
            hf.MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, conv_kernel=4)
        ),
        "causal",
    ),
    "jamba (attention, Mamba, MoE)": (
        _decoder(
            "JambaConfig",
            "JambaForCausalLM",
            num_experts=4,
            num_experts_per_tok=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=8,
            use_mamba_kernels=False,
        ),
        "causal",
    ),
    "bert": (lambda: hf.BertForSequenceClassification(hf.BertConfig(**TEXT, num_labels=3)), "classes"),
    "deberta_v2 (relative attention)": (
        lambda: hf.DebertaV2ForSequenceClassification(
            hf.DebertaV2Config(**TEXT, num_labels=3, relative_attention=True, pos_att_type=["p2c", "c2p"])
        ),
        "classes",
    ),
    "modernbert": (
        lambda: hf.ModernBertForMaskedLM(
            hf.ModernBertConfig(**TEXT, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
        ),
        "causal",
    ),
    "electra (tokens)": (
        lambda: hf.ElectraForTokenClassification(hf.ElectraConfig(**TEXT, embedding_size=32, num_labels=4)),
        "tokens",
    ),
    "t5": (
        lambda: hf.T5ForConditionalGeneration(
            hf.T5Config(
                vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4, decoder_start_token_id=0
            )
        ),
        "seq2seq",
    ),
    "bart": (
        lambda: hf.BartForConditionalGeneration(hf.BartConfig(**SEQ2SEQ, **SEQ2SEQ_LAYERS, max_position_embeddings=64)),
        "seq2seq",
    ),
    "whisper": (
        lambda: hf.WhisperForConditionalGeneration(
            hf.WhisperConfig(
                **SEQ2SEQ,
                **SEQ2SEQ_LAYERS,
                num_mel_bins=16,
                max_source_positions=16,
                max_target_positions=32,
                decoder_start_token_id=1,
                pad_token_id=0,
            )
        ),
        "speech",
    ),
    "vit": (
        lambda: hf.ViTForImageClassification(hf.ViTConfig(**TEXT, image_size=32, patch_size=8, num_labels=5)),
        "image",
    ),
    "beit (relative position bias)": (
        lambda: hf.BeitForImageClassification(
            hf.BeitConfig(**TEXT, image_size=32, patch_size=8, num_labels=5, use_relative_position_bias=True)
        ),
        "image",
    ),
    "swin": (
        lambda: hf.SwinForImageClassification(
            hf.SwinConfig(
                image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=5
            )
        ),
        "image",
    ),
    "resnet (batch norm)": (
        lambda: hf.ResNetForImageClassification(
            hf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
        ),
        "image",
    ),
    "convnext": (
        lambda: hf.ConvNextForImageClassification(
            hf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
        ),
        "image",
    ),
    "wav2vec2": (
        lambda: hf.Wav2Vec2ForSequenceClassification(
            hf.Wav2Vec2Config(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=8,
                num_conv_pos_embedding_groups=4,
                num_labels=3,
            )
        ),
        "audio",
    ),
}


def batch(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB - 6, (2, 12), generator=generator)
    if kind == "causal":
        return dict(input_ids=ids, labels=ids.clone())
    if kind == "classes":
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 2]))
    if kind == "tokens":
        return dict(input_ids=ids, labels=torch.randint(0, 4, (2, 12), generator=generator))
    if kind == "seq2seq":
        return dict(input_ids=ids, labels=torch.randint(3, VOCAB - 6, (2, 7), generator=generator))
    if kind == "speech":
        features = torch.randn(2, 16, 32, generator=generator)
        return dict(input_features=features, labels=torch.randint(3, VOCAB - 6, (2, 6), generator=generator))
    if kind == "image":
        return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=generator), labels=torch.tensor([1, 4]))
    assert kind == "audio"
    return dict(input_values=torch.randn(2, 400, generator=generator), labels=torch.tensor([0, 2]))


def loss_and_gradients(model, inputs, compiled: bool = False, forward=None):
    """The loss and every gradient of one step of `model` (through `forward` if given: a
    compiled model kept across steps)."""
    if forward is None:
        forward = torch.compile(model, backend="tpu") if compiled else model
    model.zero_grad()
    loss = forward(**inputs).loss
    loss.backward()
    gradients = {name: p.grad.detach().cpu() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), gradients


@pytest.mark.parametrize("mode", ["strict", "compile"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_one_training_step_as_on_cpu(name, mode):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny configs: transformers' notes on token ids
        model = make().eval()
    on_device = copy.deepcopy(model).to("tpu")
    inputs = batch(kind)
    want_loss, want = loss_and_gradients(model, inputs, compiled=False)
    torch._dynamo.reset()
    got_loss, got = loss_and_gradients(on_device, {k: v.to("tpu") for k, v in inputs.items()}, mode == "compile")
    assert abs(got_loss - want_loss) <= LOSS_RTOL * abs(want_loss), f"{name}: loss {got_loss} vs {want_loss} on cpu"
    assert_tensors_match(got, want, f"{name} ({mode}): gradients", rtol=GRADIENT_RTOL, floor=ZERO_GRADIENT_FLOOR)


@pytest.mark.parametrize("name", [name for name, (_, kind) in ARCHITECTURES.items() if kind == "causal"])
def test_training_under_dynamic_true_as_on_cpu(name):
    """`torch.compile(..., dynamic=True)`: one compiled model, three sequence lengths (the
    sizes padded to buckets where the graph allows it), each step's loss and every
    gradient as on CPU. GPT-2 and the dynamic-rope Llama crashed here in the backward."""
    make, _ = ARCHITECTURES[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make().eval()
    on_device = copy.deepcopy(model).to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(on_device, backend="tpu", dynamic=True)
    for length in (10, 13, 21):
        ids = torch.randint(3, VOCAB - 6, (2, length), generator=torch.Generator().manual_seed(length))
        want_loss, want = loss_and_gradients(model, dict(input_ids=ids, labels=ids))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sizes kept exact are named by a warning
            inputs = dict(input_ids=ids.to("tpu"), labels=ids.to("tpu"))
            got_loss, got = loss_and_gradients(on_device, inputs, forward=compiled)
        assert abs(got_loss - want_loss) <= LOSS_RTOL * abs(want_loss), f"{name} at {length}: loss"
        assert_tensors_match(got, want, f"{name} at {length}", rtol=GRADIENT_RTOL, floor=ZERO_GRADIENT_FLOOR)


def without_random_masks(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout, stochastic depth, LayerDrop and SpecAugment off: the device draws other
    dropout masks than CPU, and wav2vec2 draws its SpecAugment masks with NumPy and its
    skipped layers with a host read at every step, sizes and graphs that compile new
    programs (left as they are: the model's own host-side randomness). `nn.Dropout`
    modules, and the float rates modules and the config keep (`attention_dropout`,
    `drop_prob`, `layerdrop`, `mask_time_prob`)."""
    for holder in (*model.modules(), model.config):
        if isinstance(holder, torch.nn.Dropout):
            holder.p = 0.0
        for attribute, value in list(vars(holder).items()):
            if ("drop" in attribute or attribute == "mask_time_prob") and isinstance(value, float):
                setattr(holder, attribute, 0.0)
    return model


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_trainer_with_default_arguments_as_on_cpu(name, tmp_path):
    """`Trainer(model, TrainingArguments(...)).train()` as users call it, one architecture
    after the other in one process (the second Trainer of a process failed for ModernBERT
    and ELECTRA): the model, clipping and AdamW compiled, nothing falling back to op by
    op, nothing compiled after the third step (wav2vec2 compiles a per-op program in its
    third), and the losses of 6 steps as on CPU."""
    from tests.tpu_backend.test_trainer_compiled_step import StepCounters
    from tests.tpu_backend.test_trainer_integration import logged_losses

    make, kind = ARCHITECTURES[name]
    rows = []
    for seed in range(6):
        torch.manual_seed(seed)
        rows += [{key: value[row] for key, value in batch(kind).items()} for row in range(2)]
    trainers = {}
    for device in ("tpu", "cpu"):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = without_random_masks(make())
        args = hf.TrainingArguments(
            output_dir=str(tmp_path / device), use_cpu=device == "cpu", per_device_train_batch_size=2, max_steps=6,
            learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, seed=0,
        )  # fmt: skip
        trainers[device] = hf.Trainer(model, args, train_dataset=rows)
        counters = StepCounters()
        trainers[device].add_callback(counters)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainers[device].train()
        if device == "tpu":
            fell_back = [str(w.message) for w in seen if "could not be compiled" in str(w.message)]
            assert not fell_back, fell_back
            assert counters.per_step(3, 6)[2] == 0, "programs compiled after the third step"
    got, want = logged_losses(trainers["tpu"]), logged_losses(trainers["cpu"])
    assert len(got) == len(want) == 6
    for step, (a, b) in enumerate(zip(got, want), 1):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"{name}: step {step} loss {a} vs {b} on cpu"
