"""What a LiteRT run prints: nothing of its own (LiteRT's XNNPACK notice is dropped), while
anything else the C++ runtime writes to stderr (real errors) still reaches the user."""

from __future__ import annotations

import os
import subprocess
import sys

from converter.writer import write_flatbuffer
from runtimes import litert
from tests.runtimes.int8_models import int8_mlp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTICE = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."

# a fresh process: LiteRT prints the notice once per process, at the first XNNPACK allocation
RUN = """
import sys, numpy as np
content = open(sys.argv[1], "rb").read()
if sys.argv[2] == "ours":
    from runtimes.litert import LiteRTModel
    model = LiteRTModel(content)
    print(model.run([np.ones(spec.shape, spec.dtype) for spec in model.signatures[0].inputs]))
else:
    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_content=content).get_signature_runner()
    print(runner(**{k: np.ones(d["shape"], d["dtype"]) for k, d in runner.get_input_details().items()}))
"""


def _run_in_a_fresh_process(path, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", RUN, path, how], capture_output=True, text=True, env=env, cwd=ROOT)


def test_a_run_prints_no_xnnpack_notice(tmp_path):
    path = tmp_path / "mlp.tflite"
    path.write_bytes(write_flatbuffer(int8_mlp(float_io=True)))
    raw = _run_in_a_fresh_process(str(path), "raw")
    assert raw.returncode == 0 and NOTICE in raw.stderr, raw.stderr  # what LiteRT alone prints
    ours = _run_in_a_fresh_process(str(path), "ours")
    assert ours.returncode == 0 and ours.stdout.strip() and ours.stderr == "", ours.stderr


def test_everything_else_on_stderr_still_shows(capfd, monkeypatch):
    monkeypatch.setattr(litert, "_xnnpack_notice_seen", False)
    with litert.without_xnnpack_notice():
        os.write(2, f"{NOTICE}\nERROR: a real problem\n".encode())
    assert capfd.readouterr().err == "ERROR: a real problem\n"
    assert litert._xnnpack_notice_seen  # dropped once: later runs capture nothing
    with litert.without_xnnpack_notice():
        os.write(2, b"ERROR: shown at once\n")
    assert capfd.readouterr().err == "ERROR: shown at once\n"


def test_errors_raised_while_capturing_keep_their_output(capfd, monkeypatch):
    monkeypatch.setattr(litert, "_xnnpack_notice_seen", False)
    try:
        with litert.without_xnnpack_notice():
            os.write(2, b"ERROR: the op failed to prepare\n")
            raise RuntimeError("prepare failed")
    except RuntimeError:
        pass
    assert capfd.readouterr().err == "ERROR: the op failed to prepare\n"
