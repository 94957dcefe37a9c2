"""Full int8 on two transformer classifiers built from `transformers` configs with random
weights (`benchmarks/zoo/classifiers.py`): top-1 agreement with the float PyTorch model,
measured in LiteRT on fresh inputs (issue #20's target: >= 97%), and `quantize.auto`
where full int8 alone misses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch
from benchmarks.zoo.classifiers import CLASSIFIERS, samples
from litert_torch import quantize
from tests.converter.quantize.test_quantize import assert_fully_integer

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


@pytest.mark.slow
def test_lenet5_auto_reaches_99_percent_with_its_last_layers_float():
    """LeNet-5 (zoo) misses 99% under full int8 (int8 TANH has a fixed 1/128 step);
    `auto(min_agreement=0.99)` deciding on 200 inputs keeps some of its 12 layers float
    (8 with these seeds, 5 in quant_bench's; the sensitivity order is data-dependent) and
    agrees on >= 99% of 200 held-out inputs."""
    from benchmarks.zoo import ZOO, build

    model, args = build("lenet5")

    def inputs(count, seed):
        return [
            (torch.randn(ZOO["lenet5"].inputs[0], generator=torch.Generator().manual_seed(seed + i)),)
            for i in range(count)
        ]

    calibration, decide, held_out = inputs(16, 0), inputs(200, 1000), inputs(200, 2000)
    full = litert_torch.convert(
        model, args, quant_config=quantize.full_int8(calibration="mse"), calibration_data=calibration
    )
    config = quantize.auto(quantize.full_int8(calibration="mse"), min_agreement=0.99, eval_data=decide)
    edge = litert_torch.convert(model, args, quant_config=config, calibration_data=calibration)
    chosen = edge.quant_report.auto
    assert chosen["agreement"] >= 0.99 and 0 < chosen["float_layers"] <= 8, chosen["keep_float"]
    assert _agreement(edge, model, held_out) >= 0.99 > _agreement(full, model, held_out)
