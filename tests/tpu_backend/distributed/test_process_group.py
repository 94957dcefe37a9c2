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
import re
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
        torchrun_argv(nproc, script, *args),
        cwd=ROOT,
        env=torchrun_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, (
        f"torchrun {script} {args} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    )


def reports(folder, nproc: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_collectives(tmp_path, nproc: int, backend: str = "tpu") -> None:
    torchrun(nproc, "torch_collectives.py", str(tmp_path), backend)
    for report in reports(tmp_path, nproc):
        assert report["group"] == "ProcessGroupTPU" and report["size"] == nproc
        assert report["backend"] == {"none": "undefined"}.get(backend, backend)
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
            "compiled funcol graph",
            "premul_sum error",
        ):
            assert case in report["checked"], f"rank {report['rank']} did not check {case!r}"


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_two_processes_collectives_equal_gloo(tmp_path):
    check_collectives(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu:gloo,tpu:tpu", "none"])
def test_four_processes_collectives_equal_gloo(tmp_path, backend):
    """Also the backend spellings: per device, and none at all ("tpu" is the default for tpu tensors)."""
    check_collectives(tmp_path, 4, backend)


# --------------------------------------------------------------------- PyTorch's parallelism, unchanged

LOSS_RTOL = 1e-5
STRATEGIES = "ddp,fsdp,tp,fsdp_tp"


def assert_runs_continue_reference(folder, nproc: int, strategies: str, steps: int = 10) -> None:
    """Every rank's losses equal the single-process reference's at the same steps; sharded
    strategies really shard (a rank holds less than the model)."""
    for report in reports(folder, nproc):
        reference = report["reference"]
        assert len(reference) == steps
        for name in strategies.split(","):
            run = report["runs"][name]
            start, losses = run["start"], run["losses"]
            assert len(losses) == steps - start, f"{name}: trained {len(losses)} steps from step {start}"
            for step, (got, want) in enumerate(zip(losses, reference[start:]), start=start + 1):
                assert abs(got - want) <= LOSS_RTOL * abs(want), (
                    f"rank {report['rank']} {name} step {step}: loss {got} vs single-process {want}"
                )
            if name != "ddp":
                assert run["local_elements"] < run["model_elements"], f"{name} did not shard: {run}"


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_fsdp2_tp_and_fsdp2_tp_train_like_one_process(tmp_path, nproc):
    torchrun(nproc, "torch_parallel.py", "--strategy", STRATEGIES, "--out", str(tmp_path))
    assert_runs_continue_reference(tmp_path, nproc, STRATEGIES)


@pytest.mark.slow
def test_dcp_checkpoint_saved_on_4_processes_continues_on_2(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    saved, loaded = tmp_path / "saved", tmp_path / "loaded"
    saved.mkdir()
    loaded.mkdir()
    torchrun(4, "torch_parallel.py", "--strategy", "fsdp_tp", "--out", str(saved), "--save", str(checkpoint))
    assert (checkpoint / ".metadata").exists()
    assert_runs_continue_reference(saved, 4, "fsdp_tp")
    # a (2, 2) FSDP2 + TP layout restored as plain FSDP2 over 2 ranks, optimizer state included
    torchrun(2, "torch_parallel.py", "--strategy", "fsdp", "--out", str(loaded), "--load", str(checkpoint))
    assert_runs_continue_reference(loaded, 2, "fsdp")
    assert reports(loaded, 2)[0]["runs"]["fsdp"]["start"] == 5


# --------------------------------------------------------------------- a rank that fails


def launch_failing_run(argv: list[str], timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=torchrun_env(), capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.slow
def test_torchrun_reports_a_dead_rank_and_stops_the_others():
    code, output, seconds = launch_failing_run(torchrun_argv(2, "torch_rank_dies.py", "exit"), timeout=240)
    assert code != 0
    # torchrun's failure report names the rank and its exit code
    assert "rank      : 1 (local_rank: 1)\n  exitcode  : 7" in output, output[-3000:]
    # rank 0 (blocked in an all_reduce with the dead rank) got a clear error, then left
    assert "ProcessGroupTPU: collective all_reduce over processes [0, 1] failed" in output, output[-3000:]
    assert "second all_reduce returned" not in output
    assert seconds < 120, f"the run took {seconds:.0f} s to stop"


@pytest.mark.slow
def test_a_silent_rank_ends_the_run_at_the_groups_timeout():
    code, output, seconds = launch_failing_run(torchrun_argv(2, "torch_rank_dies.py", "stall"), timeout=240)
    assert code != 0
    assert "did not finish within the group's timeout (20 s)" in output, output[-3000:]
    assert "rank      : 0 (local_rank: 0)\n  exitcode  : 124" in output, output[-3000:]
    assert seconds < 150, f"the run took {seconds:.0f} s to stop"


@pytest.mark.slow
def test_tpu_backend_launch_runs_torch_distributed_scripts():
    argv = [
        sys.executable,
        "-m",
        "tpu_backend.launch",
        "--nproc",
        "2",
        os.path.join(HERE, "torch_rank_dies.py"),
        "exit",
    ]
    code, output, seconds = launch_failing_run(argv, timeout=240)
    assert "rank 0: first all_reduce 8" in output and "rank 1: first all_reduce 8" in output, output[-3000:]
    assert code != 0 and re.search(r"rank 1 \(pid \d+\) exited with code 7", output), output[-3000:]
    assert seconds < 120


# --------------------------------------------------------------------- the TorchTitan-shaped example


@pytest.mark.slow
def test_llama_example_trains_fsdp2_tp_compiled_resumes_from_dcp_and_exports(tmp_path):
    """examples/llama_fsdp_tp.py on a 2 x 2 mesh: compiled blocks with activation
    checkpointing train, a DCP checkpoint resumes, the gathered weights convert to LiteRT."""
    example = os.path.join(ROOT, "examples", "llama_fsdp_tp.py")
    checkpoint, tflite = tmp_path / "ckpt", tmp_path / "llama.tflite"
    common = ["--checkpoint", str(checkpoint), "--save-every", "2", "--out", str(tflite)]

    def launch(steps: int) -> str:
        argv = torchrun_argv(4, example, "--steps", str(steps), *common)  # an absolute path: not joined to HERE
        done = subprocess.run(argv, cwd=ROOT, env=torchrun_env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        return done.stdout

    first = launch(2)
    losses = [float(v) for v in re.findall(r"step \d+: loss ([\d.]+)", first)]
    assert len(losses) == 2 and all(4.0 < v < 4.6 for v in losses), first  # ln(64) = 4.16 at random init
    assert (checkpoint / "step-2" / ".metadata").exists()
    second = launch(3)
    assert "resuming from" in second and "step-2" in second, second
    assert re.findall(r"step (\d+): loss", second) == ["3"], second
    exported = re.search(r"LiteRT: (\S+) \(([\d,]+) bytes\), max \|logits - PyTorch\| = (\S+)", second)
    assert exported, second
    assert os.path.exists(exported.group(1)) and float(exported.group(3)) < 1e-4
