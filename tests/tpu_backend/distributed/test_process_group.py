"""The "tpu" torch.distributed backend: one process per (virtual) chip, launched by torchrun.

Every test launches `python -m torch.distributed.run` (torchrun) on a script next to this
file, with one JAX CPU device per process, and reads the JSON each rank writes:
- `torch_collectives.py`: every collective against gloo on CPU tensors (equal results);
- `torch_parallel.py`: DDP, FSDP2, DTensor tensor parallel and FSDP2 + TP training of a
  small transformer against single-process training (1e-5 relative loss, 10 steps), and
  DCP checkpoints saved on 4 processes restored on 2.
The default suite runs the 2-process collectives; the rest is `slow` (each launch
compiles every program once per process on a 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TIMEOUT = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_argv(nproc: int, script: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        os.path.join(HERE, script),
        *args,
    ]


def torchrun_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    for name in ("TPU_COORDINATOR", "XLA_FLAGS", "RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)  # one JAX device per process, a fresh rendezvous
    return env


def torchrun(nproc: int, script: str, *args: str) -> None:
    done = subprocess.run(
        torchrun_argv(nproc, script, *args), cwd=ROOT, env=torchrun_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, f"torchrun {script} {args} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"


def reports(folder, nproc: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_collectives(tmp_path, nproc: int) -> None:
    torchrun(nproc, "torch_collectives.py", str(tmp_path))
    for report in reports(tmp_path, nproc):
        assert report["backend"] == "tpu" and report["size"] == nproc
        assert report["mismatches"] == [], f"rank {report['rank']}: {report['mismatches']}"
        # every family was exercised: a case that silently stopped running would shrink this
        for case in (
            "all_reduce bxor torch.int64",
            "all_reduce avg float32",
            "all_gather_into_tensor",
            "reduce_scatter_tensor max",
            "all_to_all_single uneven",
            "send/recv ring",
            "scatter from rank 0",
            "barrier",
            "funcol reduce_scatter_tensor",
            "premul_sum error",
        ):
            assert case in report["checked"], f"rank {report['rank']} did not check {case!r}"


def test_two_processes_collectives_equal_gloo(tmp_path):
    check_collectives(tmp_path, 2)


@pytest.mark.slow
def test_four_processes_collectives_equal_gloo(tmp_path):
    check_collectives(tmp_path, 4)
