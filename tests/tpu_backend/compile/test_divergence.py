"""`find_divergence`: the nodes of compiled graphs whose values eager, op by op on the same
device, does not give (how the TPU compiler's `arange` bug was found: docs/tpu.md)."""

from __future__ import annotations

import pytest
import torch

from tests.tpu_backend.test_transformers_integration import VOCAB, tiny_llama
from tpu_backend.compile import divergence, find_divergence


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    yield


def sequence_ids(x):
    """Transformers' packed-sequence check of position ids."""
    positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0).expand(x.shape[0], -1)
    shifted = torch.cat([positions[:, :1] - 1, positions], dim=-1)
    return ((shifted[:, 1:] - shifted[:, :-1]) != 1).cumsum(-1)


def test_a_training_steps_forward_and_backward_are_both_checked(monkeypatch):
    checked = []
    compile_for_tpu = divergence.compile_for_tpu

    def spy(gm, name, *args):
        checked.append(name)
        return compile_for_tpu(gm, name, *args)

    monkeypatch.setattr(divergence, "compile_for_tpu", spy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")

    def train_step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    assert find_divergence(train_step, torch.randn(3, 8).to("tpu")) == []
    every_node = [name.removesuffix("_every_node") for name in checked if name.endswith("_every_node")]
    assert sorted(name.rsplit("_", 1)[-1] for name in every_node) == ["backward", "forward"]
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.slow  # 16 s: each graph of a transformers Llama compiled twice, and run op by op
def test_a_hugging_face_llama_forward_and_backward_agree_with_eager():
    model = tiny_llama().to("tpu")
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0)).to("tpu")

    def train_step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    assert find_divergence(train_step, ids) == []
    assert all(p.grad is not None for p in model.parameters())


def test_a_wrong_compiled_value_is_reported_at_its_node(monkeypatch):
    # what the v5e did: a compiled slice of the concatenated positions read 128 off
    compile_for_tpu = divergence.compile_for_tpu

    def miscompiled(gm, name, *args):
        program = compile_for_tpu(gm, name, *args)
        if not name.endswith("_every_node"):
            return program
        names = [n.name for n in next(n for n in gm.graph.nodes if n.op == "output").args[0]]

        def run(inputs):
            values = program(inputs)
            return [v + 128 if n == "slice_2" else v for n, v in zip(names, values)]

        return run

    monkeypatch.setattr(divergence, "compile_for_tpu", miscompiled)
    found = find_divergence(sequence_ids, torch.zeros(2, 16, device="tpu"))
    first = found[0]
    assert (first.graph, first.node, first.op) == ("inference 0", "slice_2", "aten.slice.Tensor")
    assert first.difference == "32 of 32 values unequal"
    assert first.source.endswith("return ((shifted[:, 1:] - shifted[:, :-1]) != 1).cumsum(-1)"), first.source
    assert "test_divergence.py:" in first.source and str(first).startswith("inference 0: slice_2 = aten.slice.Tensor")
    assert [d.node for d in found] == ["slice_2"]  # later nodes were computed from the right values
