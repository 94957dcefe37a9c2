"""The model zoo converts: each model runs in the LiteRT interpreter and matches PyTorch.

Float32, seeded random weights (batch-norm statistics randomized so folding is exercised),
max relative error (max|litert - torch| / max|torch|) at most 1e-4 on every output.

    .venv/bin/python -m pytest -q tests/converter/test_zoo.py            # fast subset
    .venv/bin/python -m pytest -q tests/converter/test_zoo.py -m slow    # every model, full size

A model the converter cannot handle yet carries `known_issue=` in its zoo entry and is
expected to fail here (xfail, naming the missing op) until the gap is closed.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.zoo import FAMILIES, ZOO, build, entries
from tests.helpers import assert_converts

RTOL = 1e-4


def zoo_params(selected):
    params = []
    for entry in selected:
        marks = [pytest.mark.xfail(reason=entry.known_issue, strict=False)] if entry.known_issue else []
        params.append(pytest.param(entry.name, id=entry.name, marks=marks))
    return params


@pytest.mark.parametrize("name", zoo_params(entries(fast=True)))
def test_fast_zoo_model_matches_pytorch(name):
    model, args = build(name)
    assert_converts(model, args, rtol=RTOL, atol=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo_params(entries()))
def test_zoo_model_matches_pytorch(name):
    model, args = build(name)
    assert_converts(model, args, rtol=RTOL, atol=0.0)


def test_zoo_has_sixty_architectures_across_families():
    assert len(ZOO) >= 60
    assert {e.family for e in ZOO.values()} == set(FAMILIES)
    assert len([e for e in ZOO.values() if e.name.startswith("timm_")]) >= 20
    fast = entries(fast=True)
    assert 5 <= len([e for e in fast if e.family != "transformers"]) <= 10
    assert 3 <= len([e for e in fast if e.family == "transformers"]) <= 4
    for entry in ZOO.values():
        assert entry.summary, f"zoo model {entry.name} needs a docstring saying what it is"


TRANSFORMER_FAMILIES = {
    "bert",
    "distilbert",
    "gpt2",
    "llama",
    "qwen3",
    "t5_encoder",
    "vit",
    "whisper_encoder",
    "clip_text",
    "mobilevit",
    "segformer",
    "wav2vec2",
    # ALiBi, multi-query, sliding-window, disentangled relative position, state-space, NeoX
    "bloom",
    "gpt_bigcode",
    "mistral",
    "deberta_v2",
    "mamba",
    "gpt_neox",
}


def test_zoo_has_the_transformers_families_with_token_inputs():
    names = {e.name for e in entries() if e.family == "transformers"}
    assert {f"hf_{family}" for family in TRANSFORMER_FAMILIES} <= names
    _, (ids,) = build("hf_bert")
    assert ids.dtype == torch.int64 and ids.shape == ZOO["hf_bert"].inputs[0]
    assert int(ids.min()) >= 0 and int(ids.max()) < 128


def test_build_gives_the_same_model_and_inputs_for_the_same_seed():
    model_a, args_a = build("wide_resnet16_4", seed=3)
    model_b, args_b = build("wide_resnet16_4", seed=3)
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(args_a[0], args_b[0])
    _, args_c = build("wide_resnet16_4", seed=4)
    assert not torch.equal(args_a[0], args_c[0])


def test_build_randomizes_batch_norm_statistics():
    model, _ = build("wide_resnet16_4")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not model.training
    for norm in norms:
        assert not torch.allclose(norm.running_var, torch.ones_like(norm.running_var))
        assert not torch.allclose(norm.running_mean, torch.zeros_like(norm.running_mean))


def test_timm_and_transformers_vision_models_build_in_one_process():
    """timm's stand-in torchvision (common/timm_compat.py) is gone once timm is imported:
    transformers' vision models, which ask torchvision's version, still build afterwards
    (they raised "Invalid version: 'N/A'" while the stand-in stayed)."""
    import sys

    from common.timm_compat import _StandInTorchvision

    build("timm_resnet10t")
    assert not any(isinstance(finder, _StandInTorchvision) for finder in sys.meta_path)
    model, inputs = build("hf_vit")
    assert model(*inputs) is not None
