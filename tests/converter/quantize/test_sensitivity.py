"""Sensitivity report and mixed precision for a budget: the layer the report ranks first
is the one worth keeping in float (it lowers the error more than a random layer does),
the report prints, saves JSON and a PNG, and `auto` keeps the fewest layers float that
meet the budget, measured on LiteRT."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import litert_torch
from benchmarks.zoo import ZOO, build
from converter.quantize.select import ROOT
from converter.quantize.sensitivity import relative_error
from litert_torch import quantize
from litert_torch.cli import main as cli_main
from tests.converter.quantize.test_quantize import TinyBlock


class TinyEncoder(torch.nn.Module):
    """BERT-style classifier: token + position embeddings, 2 pre-norm blocks, pooled head."""

    def __init__(self, vocab: int = 100, dim: int = 64, seq: int = 8):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Parameter(torch.randn(1, seq, dim) * 0.1)
        self.blocks = torch.nn.Sequential(TinyBlock(dim, 4), TinyBlock(dim, 4))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, ids):
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions)).mean(1))


def _tiny_encoder():
    torch.manual_seed(0)
    return TinyEncoder().eval(), (torch.randint(0, 100, (1, 8)),)


def _samples(name: str, count: int, offset: int, shape=None):
    if name == "tiny_encoder":
        return [
            (torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(offset + i)),) for i in range(count)
        ]
    entry = ZOO[name]
    out = []
    for i in range(count):
        gen = torch.Generator().manual_seed(offset + i)
        if entry.make_inputs is not None:
            out.append(tuple(entry.make_inputs(gen)))
        else:
            out.append(tuple(torch.randn(shape or s, generator=gen) for s in entry.inputs))
    return out


def _output_error(edge, model, evals) -> float:
    errors = []
    for sample in evals:
        with torch.no_grad():
            expected, _ = torch.utils._pytree.tree_flatten(model(*sample))
        actual = edge(*sample)
        actual = actual if isinstance(actual, tuple) else (actual,)
        errors.append(relative_error(actual, [e.numpy().astype(np.float64) for e in expected]))
    return float(np.mean(errors))


def _check_top_layer_matters_most(name: str, shape=None, randoms: int = 3):
    model, args = _tiny_encoder() if name == "tiny_encoder" else build(name)
    if shape is not None:
        args = (torch.randn(shape),)
    calibration, evals = _samples(name, 8, 50, shape), _samples(name, 6, 500, shape)
    report = quantize.analyze(model, args, quantize.full_int8(), calibration, evals)
    ranking = [s.name for s in report.ranking() if s.name != ROOT]
    top = ranking[0]
    edge = litert_torch.convert(
        model, args, quant_config=quantize.full_int8(keep_float=["=" + top]), calibration_data=calibration
    )
    keep_top = _output_error(edge, model, evals)
    assert keep_top < report.full_error, (top, keep_top, report.full_error)
    for other in random.Random(0).sample(ranking[1:], randoms):
        edge = litert_torch.convert(
            model, args, quant_config=quantize.full_int8(keep_float=["=" + other]), calibration_data=calibration
        )
        assert keep_top < _output_error(edge, model, evals), (top, other)
    return report


def test_bert_style_top_ranked_layer_in_float_lowers_the_error_most(tmp_path):
    report = _check_top_layer_matters_most("tiny_encoder", randoms=1)
    assert len(report.layers) > 10 and all(s.in_full is not None for s in report.layers if s.name != ROOT)
    report.to_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["layers"][0]["name"] == report.layers[0].name and data["full_error"] == report.full_error
    report.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_hf_bert_top_ranked_layer_in_float_lowers_the_error_most():
    _check_top_layer_matters_most("hf_bert")


@pytest.mark.slow
def test_mobilenet_v2_top_ranked_layer_in_float_lowers_the_error_most():
    _check_top_layer_matters_most("mobilenet_v2", shape=(1, 3, 96, 96))


def test_auto_keeps_the_fewest_layers_float_that_meet_the_budget():
    model, args = _tiny_encoder()
    calibration, evals = _samples("tiny_encoder", 8, 50), _samples("tiny_encoder", 6, 500)
    full = litert_torch.convert(model, args, quant_config=quantize.full_int8(), calibration_data=calibration)
    budget = 0.6 * _output_error(full, model, evals)
    edge = litert_torch.convert(
        model,
        args,
        calibration_data=calibration,
        quant_config=quantize.auto(quantize.full_int8(), max_error=budget, eval_data=evals),
    )
    auto = edge.quant_report.auto
    k = auto["float_layers"]
    assert auto["met"] and 0 < k < auto["layers"]
    assert _output_error(edge, model, evals) <= budget  # measured again, through the user's call
    assert auto["measured"][k - 1][0] > budget  # one float layer fewer misses it
    kept = {f.layer or "(model)" for f in edge.quant_report.float_ops}
    assert kept == {name.removeprefix("=") for name in auto["keep_float"]}
    assert all(f.requested for f in edge.quant_report.float_ops)
    assert f"auto: {k} of {auto['layers']} layers kept float" in str(edge.quant_report)
    # the reported list, pinned, gives the very model auto measured
    pinned = litert_torch.convert(
        model, args, quant_config=quantize.full_int8(keep_float=auto["keep_float"]), calibration_data=calibration
    )
    assert [(f.op, f.layer) for f in pinned.quant_report.float_ops] == [
        (f.op, f.layer) for f in edge.quant_report.float_ops
    ]
    for sample in evals[:20]:
        np.testing.assert_array_equal(pinned(*sample), edge(*sample))


def test_keep_float_own_ops_and_top_level_forward():
    """ "=layer" keeps a layer's own ops but not its children's; "(model)" the top-level
    forward's; a bare name covers the children too."""
    model, args = _tiny_encoder()
    calibration = _samples("tiny_encoder", 8, 50)

    def float_layers(keep_float):
        edge = litert_torch.convert(
            model, args, quant_config=quantize.full_int8(keep_float=keep_float), calibration_data=calibration
        )
        return {f.layer or "(model)" for f in edge.quant_report.float_ops}

    parent = "blocks.0"  # a TinyBlock: residual adds of its own, attention and MLP children
    whole = float_layers([parent])
    assert parent in whole and any(layer.startswith(parent + ".") for layer in whole)
    assert float_layers(["=" + parent]) == {parent}
    assert float_layers(["(model)"]) <= {"(model)"}
    with pytest.raises(ValueError, match="'=nope' is neither a layer"):
        float_layers(["=nope"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one budget"),
        ({"max_error": 0.1, "min_agreement": 0.9}, "exactly one budget"),
        ({"max_error": -1, "eval_data": [1]}, "max_error=-1"),
        ({"min_agreement": 1.5, "eval_data": [1]}, "min_agreement=1.5"),
        ({"max_error": 0.1}, "eval_data= is required"),
    ],
)
def test_auto_bad_budgets_fail_at_once(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize.auto(quantize.full_int8(), **kwargs)
    with pytest.raises(ValueError, match="scheme must be"):
        quantize.auto(quantize.dynamic_int8(), max_error=0.1, eval_data=[1])


def test_quantize_report_cli(tmp_path, capsys):
    code = cli_main(
        [
            "quantize-report",
            "tests.converter.quantize.test_quantize:SmallCNN",
            "--args",
            "1,3,16,16",
            "--samples",
            "4",
            "--eval-samples",
            "2",
            "--calibration",
            "mse",
            "-q",
            "--json",
            str(tmp_path / "r.json"),
            "--png",
            str(tmp_path / "r.png"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "error alone" in out and "calibration=mse" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["layers"] and all(layer["alone"] >= 0 for layer in data["layers"])
    assert (tmp_path / "r.png").stat().st_size > 1000
