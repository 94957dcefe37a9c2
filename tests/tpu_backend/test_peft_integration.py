"""PEFT's LoRA on the "tpu" device: fine-tuning, dropout and `merge_and_unload` as on CPU.

Base models are a Llama and a Gemma built from tiny configs with random weights (nothing
downloads). The adapters start with `init_lora_weights=False` (lora_B random, not zero) so
that every LoRA matrix has a step-1 gradient worth comparing; a real fine-tune starts
with lora_B = 0, which changes nothing on the device's side.

Tolerances: `tests/tpu_backend/parity.py` (losses, step-1 gradients and final parameters
within 1e-4 norm-relative). Merged weights: 1e-6 norm-relative against the same merge
on CPU (one matmul and one add per weight).
"""

from __future__ import annotations

import pytest
import torch
import transformers

import tpu_backend  # noqa: F401  (registers the device)
from tests.tpu_backend.parity import assert_runs_match, assert_tensors_match, language_model_step, record_training

peft = pytest.importorskip("peft")

VOCAB = 96
STEPS = 3


def tiny_base(family: str):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **common))
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(head_dim=8, **common))


def with_lora(model, *, dropout: float = 0.0, dora: bool = False):
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,  # scaling alpha / r = 2
        lora_dropout=dropout,
        target_modules="all-linear",
        init_lora_weights=False,
        use_dora=dora,
    )
    torch.manual_seed(1)
    return peft.get_peft_model(model, config)


def batches(device: str):
    generator = torch.Generator().manual_seed(2)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (2, 12), generator=generator).to(device)
        out.append((ids, ids))
    return out


def train(model, data, *, compiled: bool = False):
    # SGD, whose step keeps each gradient's scale and sign: AdamW's step of lr * g / (|g| + eps)
    # turns an element's gradient below the chip's rounding into a whole step either way (one of
    # 4096 in Gemma's first step on a v5e: 2.4e-7 against CPU's -2.2e-7, so 1.9e-2 apart)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    forward = torch.compile(model, backend="tpu") if compiled else model
    model.train()
    return record_training(model, language_model_step(forward, optimizer), data)


def cpu_copy(model):
    """A CPU PEFT model holding `model`'s weights (base and adapters)."""
    family = "llama" if isinstance(model.get_base_model(), transformers.LlamaForCausalLM) else "gemma"
    copy = with_lora(tiny_base(family), dora=model.peft_config["default"].use_dora)
    copy.load_state_dict({name: t.cpu() for name, t in model.state_dict().items()})
    return copy


def merged_weights(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu() for name, t in model.state_dict().items()}


@pytest.mark.parametrize(
    "family,dora",
    [("llama", False), ("gemma", False), pytest.param("llama", True, marks=pytest.mark.slow)],
)
def test_lora_fine_tune_on_tpu_matches_cpu_then_merges_like_cpu(family, dora):
    want = train(with_lora(tiny_base(family), dora=dora), batches("cpu"))
    model = with_lora(tiny_base(family).to("tpu"), dora=dora)  # adapters follow their base layer to the device
    got = train(model, batches("tpu"))
    what = f"{family} {'DoRA' if dora else 'LoRA'} on tpu"
    assert_runs_match(got, want, what)
    trained = {name for name, g in got.first_gradients.items() if g is not None}
    assert trained and all("lora_" in name for name in trained), sorted(trained)  # the base stays frozen

    # merge_and_unload writes into the base weights in place, on the device (safe_merge: into a
    # clone, checked finite first)
    reference = cpu_copy(model).merge_and_unload()
    merged = model.merge_and_unload(safe_merge=family == "gemma")
    assert {p.device.type for p in merged.parameters()} == {"tpu"}
    assert not any("lora_" in name for name in merged.state_dict())
    assert_tensors_match(merged_weights(merged), merged_weights(reference), f"{what}: merged weights", rtol=1e-6)
    ids = batches("cpu")[0][0]
    with torch.no_grad():
        torch.testing.assert_close(
            merged.eval()(input_ids=ids.to("tpu")).logits.cpu(),
            reference.eval()(input_ids=ids).logits,
            rtol=1e-4,
            atol=1e-5,
        )


@pytest.mark.slow  # the compile of a LoRA Llama's forward and backward: ~1 min of CPU
def test_lora_fine_tune_under_torch_compile_on_tpu_matches_cpu():
    want = train(with_lora(tiny_base("llama")), batches("cpu"))
    got = train(with_lora(tiny_base("llama").to("tpu")), batches("tpu"), compiled=True)
    assert_runs_match(got, want, "llama LoRA under torch.compile(backend='tpu')")


class ReplayedDropout(torch.nn.Module):
    """Applies recorded dropout outputs' masks in order (the device's draws, replayed on CPU)."""

    def __init__(self, masks: list[torch.Tensor], p: float):
        super().__init__()
        self.masks, self.p = list(masks), p

    def forward(self, x):
        return x * self.masks.pop(0) / (1 - self.p)


def test_lora_dropout_on_tpu_drops_and_rescales_and_trains_like_cpu_with_the_same_masks():
    p = 0.25
    model = with_lora(tiny_base("llama").to("tpu"), dropout=p)
    dropouts = {name: m for name, m in model.named_modules() if name.endswith("lora_dropout.default")}
    assert dropouts
    masks = {name: [] for name in dropouts}

    def record(name):
        def hook(module, args, output):
            x = args[0].detach().cpu()
            kept = output.detach().cpu() != 0
            # the kept elements are scaled by 1 / (1 - p), the dropped ones are zero
            torch.testing.assert_close(output.detach().cpu()[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
            masks[name].append(kept.float())

        return hook

    for name, module in dropouts.items():
        module.register_forward_hook(record(name))
    got = train(model, batches("tpu"))
    dropped = 1 - torch.cat([m.flatten() for ms in masks.values() for m in ms]).mean().item()
    n = sum(m.numel() for ms in masks.values() for m in ms)
    assert abs(dropped - p) <= 5 * (p * (1 - p) / n) ** 0.5, (dropped, n)  # five standard deviations

    cpu_model = with_lora(tiny_base("llama"), dropout=p)
    for name, recorded in masks.items():
        cpu_model.get_submodule(name.removesuffix(".default"))["default"] = ReplayedDropout(recorded, p)
    want = train(cpu_model, batches("cpu"))
    assert_runs_match(got, want, "llama LoRA with dropout on tpu (its masks replayed on CPU)")


def test_adapter_saved_from_tpu_reloads_on_cpu_and_tpu(tmp_path):
    model = with_lora(tiny_base("llama").to("tpu"))
    adapters = {name: t.cpu() for name, t in model.state_dict().items() if "lora_" in name}
    # PEFT clones tensors that share a storage before saving; distinct tpu storages are distinct
    from peft.peft_model import id_tensor_storage

    assert len({id_tensor_storage(p) for name, p in model.named_parameters() if "lora_" in name}) == len(adapters)
    model.save_pretrained(tmp_path)
    for device in ("cpu", "tpu"):
        reloaded = peft.PeftModel.from_pretrained(tiny_base("llama").to(device), tmp_path)
        assert {p.device.type for p in reloaded.parameters()} == {device}
        got = {name: t.cpu() for name, t in reloaded.state_dict().items() if "lora_" in name}
        assert_tensors_match(got, adapters, f"adapters reloaded on {device}", rtol=0)
