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
from tpu_backend.integrations import when_imported

VOCAB = 96


def tiny_llama(tie: bool = True):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tie)
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


def test_fine_tune_on_tpu_then_save_pretrained_round_trips(tmp_path):
    """Training steps on "tpu" follow the same losses as on CPU, and the fine-tuned
    weights (tied embeddings included) save from the device and reload on CPU."""
    losses = {}
    models = {}
    for device in ("cpu", "tpu"):
        model = tiny_llama().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(2)).to(device)
        losses[device] = []
        for _ in range(4):  # one batch, memorised: the loss must fall
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[device].append(loss.item())
        models[device] = model
    torch.testing.assert_close(torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"]), rtol=1e-4, atol=1e-5)
    assert losses["tpu"][-1] < losses["tpu"][0]

    tuned = models["tpu"]
    tuned.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # still tied
    for name, param in reloaded.state_dict().items():
        torch.testing.assert_close(param, tuned.state_dict()[name].cpu(), rtol=0, atol=0, msg=name)


def test_when_imported_applies_after_a_later_import(tmp_path, monkeypatch):
    """The hook that teaches transformers about tpu storages runs whether the library is
    imported before or after tpu_backend."""
    (tmp_path / "late_library.py").write_text(textwrap.dedent("""
        def id_tensor_storage(tensor):
            return "original"
    """))
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
