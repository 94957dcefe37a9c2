"""Export safety: interrupted or failing exports leave no partial file, and paths that
cannot be written give an error naming the path and the reason.

`EdgeModel.export` writes a hidden temporary file in the target folder, fsyncs it and
`os.replace`s it over the target, so the target is either the old file or the new one.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import litert_torch
from litert_torch.edge_model import EdgeModel
from tests.reliability.hostile import ROOT


@pytest.fixture(scope="module")
def edge():
    torch.manual_seed(0)
    return litert_torch.convert(torch.nn.Linear(4, 3), (torch.randn(2, 4),), progress=False)


def _visible(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith("."))


def test_a_process_killed_mid_write_leaves_the_old_file(tmp_path, edge):
    src, target = tmp_path / "src.bin", tmp_path / "out" / "model.tflite"
    src.write_bytes(edge.model_content())
    target.parent.mkdir()
    target.write_bytes(b"the previous model")
    child = textwrap.dedent(f"""
        import os, sys, time
        from litert_torch.edge_model import EdgeModel
        edge = EdgeModel(open({str(src)!r}, "rb").read())
        def stall(fd):  # the bytes are written, not yet synced or renamed: die here
            print("writing", flush=True)
            time.sleep(600)
        os.fsync = stall
        edge.export({str(target)!r})
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"the previous model"
    assert _visible(target.parent) == ["model.tflite"]  # at most a hidden .litert_torch-*.tmp remains


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()], ids=["disk-full", "ctrl-c"]
)
def test_a_failing_write_leaves_nothing(tmp_path, edge, monkeypatch, failure):
    target = tmp_path / "model.tflite"

    def fail(fd):
        raise failure

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(type(failure)):
        edge.export(target)
    assert os.listdir(tmp_path) == []  # neither the target nor the temporary file


def test_export_then_load_is_byte_identical(tmp_path, edge):
    path = edge.export(tmp_path / "m.tflite")
    assert open(path, "rb").read() == edge.model_content()
    assert len(litert_torch.load(path)) == len(edge)


def test_unwritable_paths_are_named(tmp_path, edge):
    with pytest.raises(FileNotFoundError, match=r"missing.*does not exist \(create it first\)"):
        edge.export(tmp_path / "missing" / "m.tflite")
    plain = tmp_path / "plain.txt"
    plain.write_text("a file")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        edge.export(plain / "m.tflite")
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        edge.export(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["plain.txt"]


def test_a_folder_without_write_permission(tmp_path, edge):
    if os.geteuid() == 0:
        folder = "/sys/kernel"  # root ignores file modes; sysfs refuses new files even to root
        try:
            EdgeModel(edge.model_content()).export(os.path.join(folder, "probe.tflite"))
        except PermissionError:
            pass
        else:  # pragma: no cover - depends on the machine
            pytest.skip("running as root and /sys/kernel accepts files here: no unwritable folder to test")
    else:
        folder = str(tmp_path / "locked")
        os.mkdir(folder, 0o500)
    with pytest.raises(PermissionError, match=f"cannot write {folder}/m.tflite: no permission to create files"):
        edge.export(os.path.join(folder, "m.tflite"))


@pytest.fixture
def umask():
    """Sets the process umask for one test (`umask(0o077)`), restoring it afterwards."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, edge, umask, mask, mode):
    """As `open(path, "wb")` would: the atomic write's temporary file must not keep an owner-only mode."""
    from litert_torch.cli import main

    umask(mask)
    edge.export(tmp_path / "exported.tflite")
    converted = tmp_path / "converted.tflite"
    assert main(["convert", "tests.litert_torch.cli_models:build", "--args", "2,6", "-o", str(converted), "-q"]) == 0
    modes = {p.name: oct(os.stat(p).st_mode & 0o777) for p in tmp_path.iterdir()}
    assert modes == {"exported.tflite": oct(mode), "converted.tflite": oct(mode)}
