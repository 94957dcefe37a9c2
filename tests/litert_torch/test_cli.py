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


def test_check_says_what_constant_folding_removed(tmp_path, capsys):
    """A model smaller than its code (zero-initialised residual branches) is explained."""
    out = tmp_path / "zero.tflite"
    factory = "tests.litert_torch.cli_models:build_zero_init_residual"
    assert main(["convert", factory, "-o", str(out), "--check", "-q"]) == 0
    err = capsys.readouterr().err
    assert "among them 2 residual branches whose output is always zero" in err, err
    assert "max relative error" in err
    from litert_torch.cli import inspect_model

    convs = sum(n for (name, _), n in inspect_model(out.read_bytes())["ops"].items() if name == "CONV_2D")
    assert convs == 1  # the stem's: both blocks' are gone


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


@pytest.mark.parametrize("command", [["inspect"], ["check", "--target", "android"], ["bench"], ["bench", "--compare"]])
def test_every_subcommand_reports_a_bad_model_file_in_one_line_with_the_same_exit_code(tmp_path, capsys, command):
    """No such file or a folder: exit 2; a file that is not a valid model: exit 1; one line
    on stderr, no traceback, for inspect, check and bench alike."""
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"hello world, not a flatbuffer")
    good = tmp_path / "good.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(good), "-q"]) == 0
    capsys.readouterr()
    for bad, code, message in (
        (tmp_path / "missing.tflite", 2, "no such file: "),
        (tmp_path, 2, "is a folder, not a .tflite file"),
        (junk, 1, "is not a LiteRT/TFLite model (no TFL3 identifier)"),
    ):
        argv = [command[0], str(good), "--compare", str(bad)] if "--compare" in command else [*command, str(bad)]
        assert main(argv) == code, (argv, capsys.readouterr())
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "output, message",
    [("nodir/m.tflite", "folder .*nodir does not exist"), (".", "it is a folder")],
    ids=["missing-folder", "a-folder"],
)
def test_convert_checks_its_output_path_before_converting(tmp_path, capsys, monkeypatch, output, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(ROOT)

    def never(*args, **kwargs):
        raise AssertionError("converted before checking the output path")

    monkeypatch.setattr(litert_torch, "convert", never)
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", output]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert re.search(f"error: cannot write {re.escape(output)}: {message}", err), err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_convert_refuses_an_unwritable_folder_before_converting(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    out = folder / "m.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(out)]) == 2
    assert "is not writable" in capsys.readouterr().err


TIMM_FACTORY = """
import timm
import torch


def make():
    torch.manual_seed(0)
    return timm.create_model("resnet10t", pretrained=False, num_classes=10).eval(), (torch.randn(1, 3, 32, 32),)
"""


@pytest.mark.slow  # the default suite's time budget: run with -m slow
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


def _calibration(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 6, generator=g) for _ in range(n)]


def test_convert_full_int8_with_calibration_files_is_the_api_model(tmp_path):
    """--quantize full_int8 --calibration-data gives the bytes the API gives for the same
    samples, from a .npy stack [N, 2, 6] and from a .npz cut along dim 0 [N * 2, 6] alike."""
    from litert_torch import quantize
    from tests.litert_torch.cli_models import build

    samples = _calibration()
    np.save(tmp_path / "stack.npy", torch.stack(samples).numpy())
    np.savez(tmp_path / "cut.npz", torch.cat(samples).numpy())
    expected = litert_torch.convert(
        build(), (torch.randn(2, 6),), quant_config=quantize.full_int8(), calibration_data=[(s,) for s in samples]
    ).model_content()
    for name in ("stack.npy", "cut.npz"):
        out = tmp_path / f"{name}.tflite"
        argv = ["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(out), "-q"]
        assert main(argv + ["--quantize", "full_int8", "--calibration-data", str(tmp_path / name)]) == 0
        assert out.read_bytes() == expected, name


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--quantize", "full_int8"], "full_int8 needs calibration_data=.*from the command line: --calibration-data"),
        (
            ["--quantize", "full_int8", "--calibration-data", "{bad_shape}"],
            "calibration sample 0, input 0 has shape \\(2, 5\\)",
        ),
        (["--quantize", "full_int8", "--calibration-data", "{missing}"], "--calibration-data: no such file"),
        (["--quantize", "full_int8", "--calibration", "best"], "calibration='best': choose one of"),
        (
            ["--quantize", "weight_only_int4", "--block-size", "32"],
            "block_size=32 does not divide the 6 input features",
        ),
        (["--calibration-data", "{bad_shape}"], "--calibration-data needs --quantize SCHEME"),
        (["--target", "toaster"], "unknown target 'toaster'; known targets: android-cpu"),
    ],
)
def test_convert_quantization_and_target_errors_are_the_apis(tmp_path, capsys, flags, message):
    np.save(tmp_path / "bad.npy", np.zeros((4, 2, 5), np.float32))
    files = {"bad_shape": str(tmp_path / "bad.npy"), "missing": str(tmp_path / "none.npy")}
    out = tmp_path / "x.tflite"
    argv = ["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(out), "-q"]
    assert main(argv + [f.format(**files) for f in flags]) == 2
    assert re.search(message, " ".join(capsys.readouterr().err.split())), message
    assert not out.exists()


def test_convert_for_a_microcontroller(tmp_path, capsys):
    """--target micro: the float model breaks its rules (one row per op type, nothing
    written); quantized to int8 with integer I/O it converts."""
    np.save(tmp_path / "calibration.npy", torch.stack([s[:1] for s in _calibration()]).numpy())
    out = tmp_path / "deep.tflite"
    argv = ["convert", "tests.litert_torch.cli_models:build_deep", "-o", str(out), "-q", "--target", "micro"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "NOT compatible: 10 error(s)" in err and "--target-check warn" in err
    rows = [line for line in err.splitlines() if "FULLY_CONNECTED" in line and "│" in line]
    assert len(rows) == 1 and "│    10 │" in rows[0], err
    first = "".join(line.split("│")[4].strip() for line in err.splitlines() if line.count("│") == 7)
    assert first.startswith("serving_default: op #0layers.0,tests/litert_torch/cli_models.py:"), (
        first
    )  # layer, source line
    assert not out.exists()
    quantized = ["--quantize", "full_int8", "--io", "int8", "--calibration-data", str(tmp_path / "calibration.npy")]
    assert main(argv + quantized) == 0
    edge = litert_torch.load(out)
    assert edge.signatures[0].inputs[0].dtype == np.int8


def test_check_groups_violations_by_op_type(tmp_path, capsys):
    """A float model checked for a microcontroller: one row per op type with its count and
    first op, not one row per op."""
    out = tmp_path / "deep.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build_deep", "-o", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["check", str(out), "--target", "micro"]) == 1
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("│ error")]
    assert len(rows) == 1, text  # ten FULLY_CONNECTED ops, one kind
    assert "FULLY_CONNECTED" in rows[0] and "│    10 │" in rows[0] and "op #0" in rows[0], rows
