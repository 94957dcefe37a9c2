"""LiteRT.js in headless Chromium gives the same outputs as ai-edge-litert.

One browser session runs every model of this file (start-up costs seconds). Skips, saying
what is missing, only where Chromium or the npm package is absent; `tools/setup.sh --web`
(run by .ci/run) installs both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch
from runtimes.litert import LiteRTModel, max_relative_error
from runtimes.web import WebRunError, run_in_browser, run_many_in_browser, web_unavailable

pytestmark = pytest.mark.skipif(web_unavailable() is not None, reason=str(web_unavailable()))

ZOO_MODELS = ("lenet5", "wide_resnet16_4", "unet_small")


def _embedding():
    torch.manual_seed(0)
    model = torch.nn.Embedding(16, 4).eval()
    ids = torch.tensor([[3, 0, 15]])
    edge = litert_torch.convert(model, (ids,), target="web", progress=False)  # int64 ids -> int32 input
    return edge.model_content(), [ids.numpy().astype(np.int32)], [model(ids).detach().numpy()]


@pytest.fixture(scope="module")
def session():
    """name -> (WebResult, expected outputs); one browser start for all."""
    from benchmarks.zoo import build
    from tests.runtimes.conftest import converted

    cases = {}
    for name in ZOO_MODELS:
        content = converted(name)
        inputs = [a.numpy() for a in build(name)[1]]
        cases[name] = (content, inputs, LiteRTModel(content).run(inputs))
    cases["embedding_int64_ids"] = _embedding()
    cases["broken"] = (b"\x00" * 64, [np.zeros((1, 4), np.float32)], None)
    results = run_many_in_browser([(c, x) for c, x, _ in cases.values()], runs=2)
    return {name: (result, case[2]) for (name, case), result in zip(cases.items(), results)}


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_browser_matches_litert_on_zoo_models(session, name):
    result, expected = session[name]
    assert result.error is None and len(result.outputs) == len(expected)
    for got, want in zip(result.outputs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert max_relative_error(got, want) < 1e-5
    assert len(result.times_ms) == 2 and result.first_ms > 0 and result.init_ms > 0
    assert "HeadlessChrome" in result.user_agent


def test_web_target_model_with_int64_ids_runs_in_the_browser(session):
    result, expected = session["embedding_int64_ids"]
    np.testing.assert_allclose(result.outputs[0], expected[0], rtol=1e-6)


def test_a_broken_model_reports_the_pages_error_and_the_others_still_run(session):
    result, _ = session["broken"]
    assert result.error and not result.outputs


def test_an_int64_input_is_refused_before_the_browser_starts():
    with pytest.raises(TypeError, match="convert with target='web'"):
        run_in_browser(b"TFL3", [np.zeros(3, np.int64)])


@pytest.mark.slow  # a browser start of its own; the session above covers the page's error path
def test_run_in_browser_raises_on_a_broken_model():
    with pytest.raises(WebRunError, match="LiteRT.js failed"):
        run_in_browser(b"\x00" * 64, [np.zeros((1, 4), np.float32)], timeout=60)


@pytest.mark.slow  # software WebGPU (no GPU here): correct but about 1 s per run on a small CNN
def test_webgpu_accelerator_matches_litert():
    from benchmarks.zoo import build
    from tests.runtimes.conftest import converted

    tasks, expected = [], []
    for name in ("lenet5", "unet_small"):
        content = converted(name)
        inputs = [a.numpy() for a in build(name)[1]]
        tasks.append((content, inputs))
        expected.append(LiteRTModel(content).run(inputs))
    for result, want in zip(run_many_in_browser(tasks, accelerator="webgpu", runs=1, timeout=300), expected):
        assert result.error is None, result.error
        assert max_relative_error(result.outputs[0], want[0]) < 1e-5
