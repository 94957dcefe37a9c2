"""Sentence embedders exported with one dynamic `embed` signature: the LiteRT file's
embeddings equal the transformers model's (its own forward on each sentence alone, then
mean or CLS pooling and L2 normalisation) at several batch sizes and lengths, padding
included (max relative error <= 1e-4); dynamic int8 within a bound and smaller; what is
refused says why."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from benchmarks.families.embedder import BATCHES, CASES, bert, reference, sentences
from litert_torch import quantize
from litert_torch.generative import UnsupportedModelError, embed, export_embedder
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4
SLOW = {"embedding-gemma2 mean", "embedding-gemma mean + dense"}  # the default suite's time budget


@pytest.fixture(scope="module", params=[pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else []) for c in CASES])
def exported(request):
    build, pooling, head = CASES[request.param]
    model, head = build(), head() if head else None
    edge = export_embedder(model, pooling=pooling, head=head, max_len=64, progress=False)
    return model, pooling, head, edge


def test_one_dynamic_signature(exported):
    model, _, head, edge = exported
    (sig,) = edge.signatures
    assert sig.key == "embed"
    assert sig.input_names == ["input_ids", "attention_mask"] and sig.output_names == ["embeddings"]
    dim = 48 if head is not None else getattr(model.config, "embedding_dim", 64)
    assert edge.runtime.signature("embed").outputs[0].shape_signature == (-1, dim)
    assert edge.embedder_error <= TOLERANCE


@pytest.mark.parametrize("lengths", BATCHES, ids=lambda b: "x".join(map(str, b)))
def test_embeddings_match_transformers_with_padding(exported, lengths):
    model, pooling, head, edge = exported
    seqs = sentences(lengths)
    got = embed(edge, seqs)
    expected = reference(model, seqs, pooling, head)
    assert got.shape == expected.shape
    assert max_relative_error(got, expected) <= TOLERANCE
    assert np.allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)


def test_an_explicit_mask_and_padding_with_any_id():
    model = bert()
    edge = export_embedder(model, max_len=32, progress=False)
    seqs = sentences([5, 11])
    ids = np.full((2, 11), 77, np.int32)  # padding ids need not be 0: the mask decides
    mask = np.zeros((2, 11), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    assert max_relative_error(embed(edge, ids, mask), reference(model, seqs)) <= TOLERANCE


def test_dynamic_int8_is_smaller_within_a_bound():
    model = bert()
    full = export_embedder(model, max_len=64, progress=False)
    int8 = export_embedder(model, max_len=64, quant_config=quantize.dynamic_int8(), progress=False)
    seqs = sentences([9, 20, 3], seed=3)
    error = max_relative_error(embed(int8, seqs), reference(model, seqs))
    print(f"bert embedder: float {len(full)} B, dynamic int8 {len(int8)} B, max rel. error {error:.2e}")
    assert len(int8) < 0.5 * len(full)
    assert 0 < int8.embedder_error < 0.05 and error < 0.05


class _IgnoresMask(nn.Module):
    """A model whose forward takes attention_mask and drops it."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids)


def test_refusals_say_why():
    with pytest.raises(UnsupportedModelError, match="padding changes the embeddings"):
        export_embedder(_IgnoresMask(bert()), max_len=32, progress=False)
    with pytest.raises(ValueError, match="pooling must be one of"):
        export_embedder(bert(), pooling="max")
    with pytest.raises(ValueError, match=r"max_len \(256\) exceeds the model's max_position_embeddings \(128\)"):
        export_embedder(bert(), max_len=256)
    with pytest.raises(TypeError, match="not a transformers model"):
        export_embedder(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="sequences must be"):
        embed(None, [[]])
