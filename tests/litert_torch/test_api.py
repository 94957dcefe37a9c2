"""The public API: convert / EdgeModel / load, used the way a user would."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import litert_torch
from litert_torch import EdgeModel


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def affine():
    torch.manual_seed(0)
    m = Affine()
    return m, litert_torch.convert(m, (torch.randn(2, 4),))


# ---- convert() arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, named",
    [
        ([torch.randn(2, 4)], "got a list"),
        ({"x": torch.randn(2, 4)}, "got a dict"),
        (None, "got None"),
        (3.0, "got a float"),
        (3, "got an int"),
    ],
)
def test_sample_args_must_be_a_tuple(bad, named):
    with pytest.raises(TypeError, match=named) as info:
        litert_torch.convert(Affine(), bad)
    assert "tuple" in str(info.value)


def test_numpy_sample_args_are_rejected_with_a_hint():
    with pytest.raises(TypeError, match="torch.from_numpy"):
        litert_torch.convert(Affine(), np.zeros((2, 4), np.float32))


def test_a_lone_tensor_is_wrapped(affine):
    m, _ = affine
    x = torch.randn(2, 4)
    edge = litert_torch.convert(m, x)
    np.testing.assert_allclose(edge(x), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_not_a_module():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        litert_torch.convert(lambda x: x, (torch.randn(2),))


# ---- EdgeModel ----------------------------------------------------------------------------------


def test_call_accepts_torch_and_numpy(affine):
    m, edge = affine
    x = torch.randn(2, 4)
    expected = m(x).detach().numpy()
    np.testing.assert_allclose(edge(x), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(edge(x.numpy()), expected, rtol=1e-5, atol=1e-6)
    assert isinstance(edge(x), np.ndarray)


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(16, 3)

    def forward(self, ids):
        return self.table(ids)


def test_inputs_are_cast_only_where_every_value_survives(affine):
    """float64 rounds into a float32 input and int64 ids fit an int32 one (the documented
    casts); integers into a float input, or ids beyond int32, are refused, as PyTorch's
    model refuses them, instead of being cast silently."""
    m, edge = affine
    x = torch.randn(2, 4, dtype=torch.float64)
    np.testing.assert_allclose(edge(x), m(x.float()).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError):
        m(torch.ones(2, 4, dtype=torch.int64))  # what PyTorch says to the same input
    with pytest.raises(TypeError, match="input 'x' expects float32, got int64"):
        edge(torch.ones(2, 4, dtype=torch.int64))
    lookup = Lookup().eval()
    ids = torch.tensor([[1, 15]])
    lookup_edge = litert_torch.convert(lookup, (ids.int(),))  # an int32 input, as generative exports take
    np.testing.assert_allclose(lookup_edge(ids), lookup(ids).detach().numpy(), rtol=1e-6)  # int64 ids fit
    with pytest.raises(ValueError, match=r"input 'ids' holds 4294967296, outside the int32 range"):
        lookup_edge(torch.tensor([[1, 2**32]]))
    with pytest.raises(TypeError, match="input 'ids' expects int32, got float32"):
        lookup_edge(torch.tensor([[1.0, 2.0]]))


def test_several_outputs_come_back_as_a_tuple_in_order():
    class Many(torch.nn.Module):
        def forward(self, x):
            return tuple(x * float(k) for k in range(12))  # more than 10: order must not be lexical

    x = torch.randn(3)
    outs = litert_torch.convert(Many(), (x,))(x)
    assert isinstance(outs, tuple) and len(outs) == 12
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out, (x * k).numpy(), rtol=1e-6)


class Returns(torch.nn.Module):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        return self.make(x)


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda x: {"a": x * 2, "b": None}, "output 'b' of forward() is None"),
        (lambda x: {"logits": x + 1, "label": "cat"}, "output 'label' of forward() is a str"),
        (lambda x: (x * 2, None), "output 1 of forward() is None"),
    ],
    ids=["dict-none", "dict-str", "tuple-none"],
)
def test_an_output_that_is_not_a_tensor_is_named_by_its_key(make, named):
    with pytest.raises(litert_torch.ConversionError, match=re.escape(named)) as info:
        litert_torch.convert(Returns(make), (torch.randn(3),))
    assert "only tensors (and numbers) can be model outputs" in str(info.value)


def test_signatures_and_bytes(affine):
    _, edge = affine
    (sig,) = edge.signatures
    assert sig.key == "serving_default"
    assert [(t.name, t.shape, t.dtype) for t in sig.inputs] == [("x", (2, 4), np.dtype(np.float32))]
    assert [(t.name, t.shape) for t in sig.outputs] == [("output_0", (2, 3))]
    assert edge.model_content()[4:8] == b"TFL3"
    assert "serving_default(x: float32[2, 4])" in repr(edge)


def test_wrong_number_of_inputs_is_a_clear_error():
    edge = litert_torch.convert(AddRelu(), (torch.randn(2), torch.randn(2)))
    with pytest.raises(ValueError, match=r"takes 2 input\(s\) \(x: float32\[2\], y: float32\[2\]\), got 1"):
        edge(torch.randn(2))


# ---- export / load ---------------------------------------------------------------------------------


def test_export_then_load_round_trip(tmp_path, affine):
    m, edge = affine
    path = tmp_path / "affine.tflite"
    assert edge.export(path) == str(path)
    assert os.listdir(tmp_path) == ["affine.tflite"]  # no temporary file left behind
    again = litert_torch.load(path)
    x = torch.randn(2, 4)
    np.testing.assert_array_equal(again(x), edge(x))
    assert again.signatures == edge.signatures


def test_export_to_a_missing_folder(tmp_path, affine):
    _, edge = affine
    with pytest.raises(FileNotFoundError, match="does not exist"):
        edge.export(tmp_path / "nope" / "m.tflite")


def test_failed_export_leaves_nothing_and_keeps_the_old_file(tmp_path, affine, monkeypatch):
    _, edge = affine
    path = tmp_path / "m.tflite"
    path.write_bytes(b"old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        edge.export(path)
    assert os.listdir(tmp_path) == ["m.tflite"]
    assert path.read_bytes() == b"old"


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such .tflite file"):
        litert_torch.load(tmp_path / "missing.tflite")
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ValueError, match="not a LiteRT/TFLite model"):
        litert_torch.load(junk)
    with pytest.raises(ValueError, match="TFL3"):
        EdgeModel(b"\0" * 32)


def test_unsupported_model_writes_nothing(tmp_path):
    class Det(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)

    with pytest.raises(litert_torch.UnsupportedOpsError):
        litert_torch.convert(Det(), (torch.randn(3),)).export(tmp_path / "det.tflite")
    assert os.listdir(tmp_path) == []


class TokenModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, ids, use_cache=False):
        y = self.embed(ids)
        return y * 2 if use_cache else y


def _batch_and_seq():
    from torch.export import Dim

    return Dim("batch", min=1, max=64), Dim("seq", min=4, max=512)


def test_signature_reads_as_a_call():
    """What `edge.signatures[0]` shows (the README's form): names, dtypes, ? for dynamic dims."""
    batch, seq = _batch_and_seq()
    ids = torch.randint(0, 50, (2, 8))
    edge = litert_torch.convert(TokenModel(), (ids,), dynamic_shapes=({0: batch, 1: seq},))
    assert repr(edge.signatures[0]) == "serving_default(ids: int64[?, ?]) -> (output_0: float32[?, ?, 8])"
    assert str(edge.signatures[0].inputs[0]) == "ids: int64[?, ?]"
    assert "serving_default(ids: int64[?, ?])" in repr(edge)


def test_tuple_dynamic_shapes_with_sample_kwargs():
    """One dynamic_shapes entry per positional arg also works when keyword inputs are given
    (torch.export itself wants one per input); the keyword inputs stay static."""
    batch, seq = _batch_and_seq()
    model = TokenModel().eval()
    edge = litert_torch.convert(
        model, (torch.randint(0, 50, (2, 8)),), {"use_cache": True}, dynamic_shapes=({0: batch, 1: seq},)
    )
    ids = torch.randint(0, 50, (3, 17))
    np.testing.assert_allclose(edge(ids), model(ids, use_cache=True).detach().numpy(), rtol=1e-6)


def test_dynamic_shapes_that_do_not_match_say_how_torch_wants_them():
    batch, _ = _batch_and_seq()
    ids = torch.randint(0, 50, (2, 8))
    with pytest.raises(litert_torch.ConversionError, match="one entry per input, keyword inputs included"):
        litert_torch.convert(TokenModel(), (ids,), {"use_cache": True}, dynamic_shapes=({0: batch}, None, None))


def test_metadata_entries_are_written_and_read_back(affine, tmp_path):
    module, _ = affine
    from runtimes.targets.model_view import metadata_entry

    edge = litert_torch.convert(module, (torch.randn(2, 4),), metadata={"my.runtime": b'{"steps": 3}'})
    path = edge.export(tmp_path / "m.tflite")
    with open(path, "rb") as f:
        content = f.read()
    assert metadata_entry(content, "my.runtime") == b'{"steps": 3}'
    assert metadata_entry(content, "absent") is None
    assert metadata_entry(content, "min_runtime_version") is not None  # the writer's own entry is kept
    with pytest.raises(TypeError, match="metadata maps names .* to bytes; got 'my.runtime': str"):
        litert_torch.convert(module, (torch.randn(2, 4),), metadata={"my.runtime": "text"})
