"""Dynamo's cache (`dynamo_cache.py`, opt-in): a second process installs Dynamo's output
instead of tracing, and never a wrong one: a changed shape, dtype, source, function
attribute or backend option misses (each checked against the same model on CPU).

Subprocess pairs are expensive: one cheap pair here, the rest in the slow suite."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.chip import child_env
from tpu_backend.compile import dynamo_cache

CHILD = Path(__file__).resolve().parent / "dynamo_cache_child.py"
ROOT = Path(__file__).resolve().parents[3]

MODEL = """
import torch
from torch import nn


def scale(x):
    return x * 0.5


class TinyModel(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.out = nn.Linear(32, 8)
        self.act = act

    def forward(self, x):
        return self.out(scale(self.act(self.inp(x))))
"""


def model_dir(tmp_path: Path, source: str = MODEL) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny_model.py").write_text(source)
    return folder


def run(cache: Path, models: Path, *options: str) -> dict:
    command = [sys.executable, str(CHILD), "--module-dir", str(models), *options]
    env = child_env(TPU_CACHE_DIR=str(cache), TPU_DYNAMO_CACHE="on")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for step in report["steps"]:  # never a wrong graph: every step matches CPU
        assert step["error"] < 1e-5, report
    return report


@pytest.mark.slow  # the default suite's time budget: a second process, and the cache is opt-in (TPU_DYNAMO_CACHE)
def test_second_process_skips_dynamo_and_a_new_shape_still_traces(tmp_path):
    cache, models = tmp_path / "cache", model_dir(tmp_path)
    first = run(cache, models, "--batches", "4")
    assert first["frames_traced"] == 1 and first["dynamo_cache"]["saved"] == 1
    second = run(cache, models, "--batches", "4,6")
    assert second["dynamo_cache"]["hit"] == 1
    # batch 4 ran from the installed entry; batch 6 failed its shape guard and was traced
    assert second["frames_traced"] == 1
    assert second["steps"][0]["loss"] == first["steps"][0]["loss"]


@pytest.mark.slow  # several processes: the slow suite
def test_changes_miss(tmp_path):
    cache, models = tmp_path / "cache", model_dir(tmp_path)
    run(cache, models)
    hit = run(Path(shutil.copytree(cache, tmp_path / "hit")), models)
    assert hit["frames_traced"] == 0 and hit["dynamo_cache"]["hit"] == 1

    # another function in a module attribute: a dropped identity guard, checked by us
    gelu = run(Path(shutil.copytree(cache, tmp_path / "gelu")), models, "--act", "gelu")
    assert gelu["dynamo_cache"]["identity_miss"] == 1 and gelu["frames_traced"] == 1

    # the compiled function's source changed: PyTorch's own check refuses the entry
    forward = "return self.out(scale(self.act(self.inp(x))))"
    edited = model_dir(tmp_path / "edited", MODEL.replace(forward, forward + " * 2"))
    changed = run(Path(shutil.copytree(cache, tmp_path / "source")), edited)
    assert changed["dynamo_cache"]["rejected"] == 1 and changed["frames_traced"] == 1

    # a global function it calls changed: its code hash (our check) differs first
    edited = model_dir(tmp_path / "edited_global", MODEL.replace("x * 0.5", "x * 0.25"))
    changed = run(Path(shutil.copytree(cache, tmp_path / "global")), edited)
    assert changed["dynamo_cache"]["identity_miss"] == 1 and changed["frames_traced"] == 1

    # another dtype: the tensor guards (kept) fail, Dynamo traces
    double = run(Path(shutil.copytree(cache, tmp_path / "dtype")), models, "--dtype", "float64")
    assert double["frames_traced"] == 1

    # another backend option: another key
    options = run(Path(shutil.copytree(cache, tmp_path / "options")), models, "--options", '{"buckets": null}')
    assert options["dynamo_cache"]["miss"] == 1 and options["frames_traced"] == 1


# --------------------------------------------------------------------- in process


def test_objects_are_described_by_what_they_are():
    import torch.nn.functional as F

    assert dynamo_cache.describe(F.silu) == dynamo_cache.describe(F.silu)
    assert dynamo_cache.describe(F.silu) != dynamo_cache.describe(F.gelu)
    assert dynamo_cache.describe(torch) == ("module", "torch")
    assert dynamo_cache.describe(torch.cat)[0] == "builtin"

    def f(x):
        return x + 1

    def g(x):
        return x + 2

    g.__qualname__ = f.__qualname__  # same name, other code
    assert dynamo_cache.describe(f) != dynamo_cache.describe(g)
    assert dynamo_cache.describe(object()) is None  # not storable
    assert dynamo_cache.describe(types.SimpleNamespace()) is None


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_code_hash_and_config_text_are_the_same_in_another_process():
    script = (
        "import torch.nn.functional as F, torch; from tpu_backend.compile import dynamo_cache as d;"
        "print(d._code_hash(F.rms_norm.__code__), d._config_text(torch._dynamo.config))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env=child_env(PYTHONHASHSEED=str(seed)),
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.strip()
        for seed in (1, 2)
    }
    assert len(outputs) == 1 and outputs != {""}


def test_empty_like_on_another_device_is_made_there():
    import tpu_backend  # noqa: F401

    x = torch.ones(3, 2, device="tpu")
    assert torch.empty_like(x, device="meta").device.type == "meta"  # Dynamo's guard pickler
    assert torch.zeros_like(x, device="cpu").equal(torch.zeros(3, 2))
    assert x.new_full((2,), 3.0, device="cpu").equal(torch.full((2,), 3.0))
    assert torch.zeros_like(x).device.type == "tpu"
