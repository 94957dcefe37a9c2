"""Full int8 on two transformer classifiers built from `transformers` configs with random
weights (`tests/zoo/classifiers.py`): top-1 agreement with the float PyTorch model,
measured in LiteRT on fresh inputs (issue #20's target: >= 97%), and `quantize.auto`
where full int8 alone misses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch
from litert_torch import quantize
from tests.converter.quantize.test_quantize import assert_fully_integer
from tests.zoo.classifiers import CLASSIFIERS, samples

pytest.importorskip("transformers")


def _agreement(edge, model, inputs) -> float:
    """Share of `inputs` (batch-1 samples) where LiteRT's top-1 class is PyTorch's; the
    float reference runs as one batch (a transformers forward costs ~40 ms per call)."""
    with torch.no_grad():
        expected = model(torch.cat([x for (x,) in inputs])).numpy().argmax(-1)
    actual = np.array([np.argmax(edge(*sample)) for sample in inputs])
    return float(np.mean(actual == expected))


def _convert(name: str, config):
    factory, make_inputs = CLASSIFIERS[name]
    model = factory()
    args = make_inputs(torch.Generator().manual_seed(0))
    edge = litert_torch.convert(model, args, quant_config=config, calibration_data=samples(name, 16, 0))
    return model, edge


def test_bert_classifier_full_int8_agrees_on_97_percent():
    """500 fresh token sequences; every op in int8 (embeddings, LayerNorm, attention, tanh pooler)."""
    model, edge = _convert("bert_classifier", quantize.full_int8())
    assert_fully_integer(edge)
    assert _agreement(edge, model, samples("bert_classifier", 500, 1)) >= 0.97


@pytest.mark.slow
def test_vit_classifier_auto_meets_the_budget_with_few_float_layers():
    """Full int8 alone misses 97% on the random ViT: the CLS token the head reads is ~15x
    smaller than the patch tokens it shares a per-tensor int8 scale with (max 0.08 vs 1.16,
    so ~3 int8 levels of std), and the logits' top-2 margin is ~0.05. `auto` keeps a few
    layers float (the embeddings and the residual adds) and
    then meets the budget on its 200-input decision set; on 500 held-out inputs it lands
    within about a point of it (95.8% measured, from 78% with full int8)."""
    model, edge = _convert("vit_classifier", quantize.full_int8())
    held_out = samples("vit_classifier", 500, 1)
    full = _agreement(edge, model, held_out)
    assert full < 0.97
    config = quantize.auto(quantize.full_int8(), min_agreement=0.97, eval_data=samples("vit_classifier", 200, 2))
    model, edge = _convert("vit_classifier", config)
    chosen = edge.quant_report.auto
    assert chosen["agreement"] >= 0.97
    assert 0 < chosen["float_layers"] <= chosen["layers"] // 5, chosen["keep_float"]
    assert _agreement(edge, model, held_out) >= 0.95 > full + 0.1
