"""transformers models on the "tpu" device: load with device_map="tpu", train, save.

Models are built from small configs with random weights (nothing downloads) and saved
locally with `save_pretrained`, as a user's fine-tuned checkpoint would be.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import transformers

import tpu_backend
from tests.tpu_backend.parity import assert_runs_match, language_model_step, record_training
from tpu_backend.integrations import when_imported

VOCAB = 96


def tiny_llama(tie: bool = True):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    model = tiny_llama()
    model.save_pretrained(folder)
    return folder, model


def test_from_pretrained_device_map_tpu_matches_cpu(saved_llama):
    folder, cpu_model = saved_llama
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, device_map="tpu")
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = cpu_model(input_ids=ids).logits
        actual = model(input_ids=ids.to("tpu")).logits.cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def _fine_tune(device: str, optimizer_name: str):
    model = tiny_llama().to(device)
    optimizer = {
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
        "sgd": lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
    }[optimizer_name](model.parameters())
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(2)).to(device)
    step = language_model_step(model, optimizer)
    return model, record_training(model, step, [(ids, ids)] * 4)  # one batch, memorised: the loss must fall


# SGD passes a gradient's scale into the weights (Adam divides it out): it is the default case
@pytest.mark.parametrize("optimizer_name", ["sgd", pytest.param("adamw", marks=pytest.mark.slow)])
def test_fine_tune_on_tpu_then_save_pretrained_round_trips(tmp_path, optimizer_name):
    """Training steps on "tpu" follow CPU's losses, gradients after step 1 and final
    parameters (SGD: a gradient's scale reaches the weights), and the fine-tuned weights
    (tied embeddings included) save from the device and reload on CPU."""
    models, runs = {}, {}
    for device in ("cpu", "tpu"):
        models[device], runs[device] = _fine_tune(device, optimizer_name)
    assert_runs_match(runs["tpu"], runs["cpu"], f"llama {optimizer_name}")
    assert runs["tpu"].losses[-1] < runs["tpu"].losses[0]

    tuned = models["tpu"]
    tuned.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # still tied
    for name, param in reloaded.state_dict().items():
        torch.testing.assert_close(param, tuned.state_dict()[name].cpu(), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", ["mixtral (MoE)", pytest.param("qwen3_moe (MoE)", marks=pytest.mark.slow)])
def test_mixture_of_experts_trains_compiled_as_cpu(family):
    """transformers' experts are grouped matrix products (`torch._grouped_mm`, ragged by
    the tokens each expert takes). Under torch.compile(backend="tpu") PyTorch's meta
    kernel refused them in float32 (a limit of CUDA's kernel: `tpu_backend/fake_rules.py`),
    so every MoE model crashed. Compiled on "tpu": losses, gradients after step 1 and
    parameters after 3 SGD steps as in CPU eager."""
    from benchmarks.families import causal_lm as families

    ids = torch.randint(0, families.VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    runs = {}
    for device in ("cpu", "tpu"):
        model = families.build(family).train().to(device)
        forward = torch.compile(model, backend="tpu") if device == "tpu" else model
        step = language_model_step(forward, torch.optim.SGD(model.parameters(), lr=0.5))
        runs[device] = record_training(model, step, [(ids.to(device), ids.to(device))] * 3)
    assert_runs_match(runs["tpu"], runs["cpu"], family)


def test_when_imported_applies_after_a_later_import(tmp_path, monkeypatch):
    """The hook that teaches transformers about tpu storages runs whether the library is
    imported before or after tpu_backend."""
    (tmp_path / "late_library.py").write_text(
        textwrap.dedent("""
        def id_tensor_storage(tensor):
            return "original"
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("late_library", lambda module: seen.append(module.__name__))
    assert seen == []
    import late_library  # noqa: F401

    assert seen == ["late_library"]
    when_imported("late_library", lambda module: seen.append("again"))  # already imported: now
    assert seen == ["late_library", "again"]
    sys.modules.pop("late_library")


def test_tpu_storages_have_distinct_identities():
    from transformers.pytorch_utils import id_tensor_storage

    a, b = torch.ones(4, device="tpu"), torch.ones(4, device="tpu")
    assert id_tensor_storage(a) != id_tensor_storage(b)
    assert id_tensor_storage(a) == id_tensor_storage(a.view(2, 2))
    assert tpu_backend  # the import installs the integration
