"""`litert_torch.signature(...)`: several entry points in one model, weights stored once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
        self.fc2 = torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Head(torch.nn.Module):
    """A second module over the same first layer (shared parameters)."""

    def __init__(self, mlp: Mlp):
        super().__init__()
        self.fc1 = mlp.fc1

    def forward(self, x):
        return torch.tanh(self.fc1(x))


@pytest.fixture(scope="module")
def two_signatures():
    torch.manual_seed(0)
    mlp = Mlp().eval()
    edge = (
        litert_torch.signature("single", mlp, (torch.randn(1, 64),))
        .signature("batch", mlp, (torch.randn(4, 64),))
        .signature("features", Head(mlp), (torch.randn(2, 64),))
        .convert(progress=False)
    )
    return mlp, edge


def _weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_each_signature_runs_its_own_module(two_signatures):
    mlp, edge = two_signatures
    assert [s.key for s in edge.signatures] == ["single", "batch", "features"]
    for name, x, fn in [
        ("single", torch.randn(1, 64), mlp),
        ("batch", torch.randn(4, 64), mlp),
        ("features", torch.randn(2, 64), lambda t: torch.tanh(mlp.fc1(t))),
    ]:
        got = edge(x, signature_name=name)
        np.testing.assert_allclose(got, fn(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_signatures_share_one_copy_of_the_weights(two_signatures):
    mlp, edge = two_signatures
    single = litert_torch.convert(mlp, (torch.randn(1, 64),), progress=False)
    weights = _weight_bytes(mlp)  # 68 KiB; a second copy would add it again
    assert len(single) > weights
    assert len(edge) < len(single) + 0.1 * weights, (len(edge), len(single), weights)


def test_default_signature_from_convert_and_from_load(two_signatures, tmp_path):
    _, edge = two_signatures
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="pass signature_name="):
        edge(x)  # three signatures and no default: the error names them
    path = edge.export(tmp_path / "multi.tflite")
    loaded = litert_torch.load(path, signature_name="batch")
    assert loaded.signature_name == "batch"
    np.testing.assert_array_equal(loaded(x), edge(x, signature_name="batch"))
    chosen = litert_torch.EdgeModel(edge.model_content(), signature_name="batch")
    np.testing.assert_array_equal(chosen(x), loaded(x))
    # a per-call name still wins over the default
    assert chosen(torch.randn(1, 64), signature_name="single").shape == (1, 8)


def test_convert_picks_the_default_signature():
    m = Mlp().eval()
    edge = (
        litert_torch.signature("a", m, (torch.randn(1, 64),))
        .signature("b", m, (torch.randn(3, 64),))
        .convert(signature_name="b", progress=False)
    )
    assert edge(torch.randn(3, 64)).shape == (3, 8)


def test_bad_signatures_are_reported_before_any_work():
    m = Mlp()
    builder = litert_torch.signature("a", m, (torch.randn(1, 64),))
    with pytest.raises(ValueError, match="'a' is already defined"):
        builder.signature("a", m, (torch.randn(2, 64),))
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        builder.signature("b", lambda x: x, (torch.randn(2, 64),))
    with pytest.raises(TypeError, match="sample_args must be a tuple"):
        builder.signature("c", m, [torch.randn(2, 64)])
    with pytest.raises(KeyError, match="no signature named 'nope'"):
        builder.convert(signature_name="nope")
    edge = builder.convert(progress=False)
    with pytest.raises(KeyError, match="no signature named 'nope'"):
        litert_torch.EdgeModel(edge.model_content(), signature_name="nope")


def test_outputs_can_be_named():
    m = Mlp().eval()
    edge = litert_torch.signature("run", m, (torch.randn(1, 64),), output_names=["scores"]).convert(progress=False)
    assert edge.signatures[0].output_names == ["scores"]
    with pytest.raises(ValueError, match="output_names must be 1 distinct names"):
        litert_torch.signature("run", m, (torch.randn(1, 64),), output_names=["a", "b"]).convert(progress=False)
    with pytest.raises(TypeError, match="list of non-empty strings"):
        litert_torch.signature("run", m, (torch.randn(1, 64),), output_names="scores")
