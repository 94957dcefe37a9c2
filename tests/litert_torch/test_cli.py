"""`litert-torch convert` and `litert-torch inspect`, run as a user would."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import litert_torch
from litert_torch.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_convert_with_shape_args_then_run(tmp_path, capsys):
    out = tmp_path / "small.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(out), "--check"]) == 0
    edge = litert_torch.load(out)
    assert edge.signatures[0].inputs[0].shape == (2, 6)
    from tests.litert_torch.cli_models import build

    x = torch.randn(2, 6)
    np.testing.assert_allclose(edge(x), build()(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    err = capsys.readouterr().err
    assert "wrote" in err and "max relative error" in err


def test_convert_with_args_from_the_factory(tmp_path):
    out = tmp_path / "small.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build_with_args", "-o", str(out), "-q"]) == 0
    assert out.read_bytes()[4:8] == b"TFL3"


@pytest.mark.parametrize(
    "factory, message",
    [
        ("tests.litert_torch.cli_models:build", "no sample inputs"),
        ("tests.litert_torch.cli_models:not_a_module", "must return an nn.Module"),
        ("tests.litert_torch.cli_models:missing", "has no attribute 'missing'"),
        ("no_such_package.models:build", "cannot import"),
        ("tests.litert_torch.cli_models", "expected MODULE:FACTORY"),
    ],
)
def test_convert_usage_errors(tmp_path, factory, message):
    with pytest.raises(SystemExit, match=message):
        main(["convert", factory, "-o", str(tmp_path / "x.tflite")])
    assert not (tmp_path / "x.tflite").exists()


def test_failed_conversion_reports_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build_unsupported", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "conversion failed" in err and "aten.special_bessel_j0.default" in err
    assert os.listdir(tmp_path) == []


def test_inspect_lists_ops_signatures_and_sizes(tmp_path):
    out = tmp_path / "small.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(out), "-q"]) == 0
    # A separate process: the installed entry point's module, as a user runs it.
    result = subprocess.run(
        [sys.executable, "-m", "litert_torch.cli", "inspect", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Signatures" in text and "serving_default" in text and "[2, 6]" in text
    assert "FULLY_CONNECTED" in text
    assert "Largest buffers" in text and "72" in text  # the 3x6 float32 weight
    assert f"{out.stat().st_size:,} bytes" in text


def test_inspect_rejects_a_non_model(tmp_path, capsys):
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"hello world, not a flatbuffer")
    assert main(["inspect", str(junk)]) == 2
    assert "not a LiteRT/TFLite model" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.tflite")]) == 2


TIMM_FACTORY = """
import timm
import torch


def make():
    torch.manual_seed(0)
    return timm.create_model("resnet10t", pretrained=False, num_classes=10).eval(), (torch.randn(1, 3, 32, 32),)
"""


@pytest.mark.skipif(
    importlib.util.find_spec("timm") is None, reason="timm is not installed (tools/setup.sh installs it)"
)
def test_convert_a_timm_model_from_the_command_line(tmp_path):
    """As a README user does: a factory module that imports timm, where setup installs no
    torchvision; a fresh process, so nothing imported timm before the CLI."""
    (tmp_path / "mymodels.py").write_text(TIMM_FACTORY)
    out = tmp_path / "resnet10t.tflite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "litert_torch.cli", "convert", "mymodels:make", "-o", str(out), "--check", "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    error = float(re.search(r"max relative error (\S+)", result.stderr).group(1))
    assert error < 1e-4, result.stderr
    assert out.read_bytes()[4:8] == b"TFL3"
