"""Training on many (virtual) devices: data parallel, FSDP, tensor parallel, several
processes, the launcher's supervision and sharded checkpoints.

JAX reads the virtual device count (`--xla_force_host_platform_device_count=8`) once,
when it starts, so every multi-device run happens in a subprocess running
`train_gpt.py` (or `collective_loop.py`) next to this file; the test reads its JSON
report. Losses must match single-device training of the same model on the same batches
to 1e-4 relative at every step; the MLP and GPT runs also compare the gradients after
step 1 and the parameters after the last step (`tests/tpu_backend/parity.py`), and train
with SGD (momentum) besides AdamW: SGD passes a gradient's scale (a sum instead of a mean
across replicas) straight into the parameters, where Adam would divide it out.

The default suite trains the MLP (cheap to compile) under every strategy and checks the
launcher on a tiny collective loop; the small GPT runs (every strategy, two processes,
checkpoint from a 4x2 mesh onto 8x1) are `slow`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from jax.sharding import AbstractMesh, PartitionSpec

from tests.tpu_backend.parity import GRADIENT_RTOL, ZERO_GRADIENT_FLOOR, assert_parameters_match, assert_tensors_match
from tpu_backend.distributed import Replicate, Shard, partition_spec
from tpu_backend.launch import child_env, describe_exit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TRAIN = os.path.join(HERE, "train_gpt.py")
RELATIVE_TOLERANCE = 1e-4
SUBPROCESS_TIMEOUT = 900


def _env(devices: int | None = 8) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    env.pop("TPU_COORDINATOR", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def run(argv: list[str], devices: int | None = 8) -> subprocess.CompletedProcess:
    """Run `python argv...` from the repository root; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=_env(devices), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert done.returncode == 0, (
        f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    )
    return done


def train(tmp_path, *args: str, launcher: list[str] | None = None, name: str = "report") -> dict:
    out = str(tmp_path / f"{name}.json")
    argv = [*(launcher or []), TRAIN, *args, "--out", out]
    run(argv, devices=None if launcher else 8)
    with open(out) as f:
        return json.load(f)


def train_with_tensors(tmp_path, *args: str, name: str = "report") -> tuple[dict, dict]:
    """The report and, per run, its gradients after step 1 and final parameters."""
    path = tmp_path / f"{name}.pt"
    report = train(tmp_path, *args, "--tensors", str(path), name=name)
    return report, torch.load(path)


def assert_strategies_match_single(report: dict, tensors: dict, strategies, optimizer: str, what: str) -> None:
    """Losses, gradients after step 1 and parameters after the last step, per strategy."""
    key = f"single:{optimizer}"
    single = report[key]["losses"]
    assert single[-1] < single[0], f"{what}: single-device {optimizer} run did not train: {single}"
    for strategy in strategies:
        run_key = f"{strategy}:{optimizer}"
        label = f"{what} {strategy} {optimizer}"
        assert_same_losses(report[run_key]["losses"], single, label)
        assert_tensors_match(
            tensors[run_key]["first_gradients"],
            tensors[key]["first_gradients"],
            f"{label}: gradients after step 1",
            rtol=GRADIENT_RTOL,
            floor=ZERO_GRADIENT_FLOOR,
        )
        assert_parameters_match(
            tensors[run_key]["final_parameters"],
            tensors[key]["final_parameters"],
            tensors[key]["first_gradients"],
            f"{label}: final parameters",
        )


def assert_same_losses(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} losses vs {len(want)}"
    for step, (g, w) in enumerate(zip(got, want)):
        relative = abs(g - w) / max(abs(w), 1e-12)
        assert relative <= RELATIVE_TOLERANCE, (
            f"{what}, step {step}: loss {g:.8g} vs single-device {w:.8g} (relative {relative:.1e})\n{got}\n{want}"
        )


def assert_sharded_one_eighth(report: dict, what: str) -> None:
    """Per-device bytes of parameters, gradients and optimizer state <= 1/8 + 5% of the total."""
    for kind, total_key in (
        ("param", "param_bytes_total"),
        ("grad", "param_bytes_total"),
        ("state", "state_bytes_total"),
    ):
        per_device = report[f"{kind}_bytes_per_device"]
        assert len(per_device) == 8, f"{what}: {kind} bytes on {len(per_device)} devices"
        limit = report[total_key] / 8 * 1.05
        worst = max(per_device.values())
        assert worst <= limit, f"{what}: a device holds {worst} {kind} bytes of {report[total_key]} (limit {limit:.0f})"


# ----------------------------------------------------------------------------- in process


def test_placements_map_to_partition_specs():
    mesh = AbstractMesh((4, 2), ("data", "model"))
    assert partition_spec([Shard(0), Replicate()], mesh, 2) == PartitionSpec("data")
    assert partition_spec([Replicate(), Shard(1)], mesh, 2) == PartitionSpec(None, "model")
    assert partition_spec([Shard(0), Shard(0)], mesh, 2) == PartitionSpec(("data", "model"))
    assert partition_spec([Replicate(), Replicate()], mesh, 3) == PartitionSpec()
    assert partition_spec([Shard(-1), Replicate()], mesh, 3) == PartitionSpec(None, None, "data")
    with pytest.raises(ValueError, match="one per axis"):
        partition_spec([Shard(0)], mesh, 2)
    with pytest.raises(ValueError, match="has 2 dim"):
        partition_spec([Shard(2), Replicate()], mesh, 2)


def test_launcher_environment_and_exit_descriptions():
    env = child_env(rank=1, nproc=2, port=12345, cpu_devices=4, heartbeat=7)
    assert env["TPU_COORDINATOR"] == "127.0.0.1:12345"
    assert (env["TPU_PROCESS_ID"], env["TPU_NUM_PROCESSES"], env["RANK"], env["WORLD_SIZE"]) == ("1", "2", "1", "2")
    assert env["TPU_HEARTBEAT_TIMEOUT"] == "7"
    assert "--xla_force_host_platform_device_count=4" in env["XLA_FLAGS"]
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


def test_checkpoint_round_trip_on_one_device(tmp_path):
    """Save, train on, restore: parameters and AdamW state come back bit for bit; the
    folder is complete (index last, no .tmp left) and a half-written one is refused."""
    import torch

    from benchmarks.models import MLP
    from tpu_backend.distributed import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = MLP().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step():
        optimizer.zero_grad()
        model(torch.randn(4, 32).to("tpu")).square().mean().backward()
        optimizer.step()

    step()
    folder = tmp_path / "ckpt"
    save_checkpoint(str(folder), model, optimizer, extra={"step": 1})
    saved = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    saved_state = {k: v.cpu().clone() for k, v in optimizer.state[model.layers[0].weight].items()}
    step()
    assert not torch.equal(model.layers[0].weight.cpu(), saved["layers.0.weight"])
    assert load_checkpoint(str(folder), model, optimizer) == {"step": 1}
    for name, value in model.state_dict().items():
        assert torch.equal(value.cpu(), saved[name]), name
    for name, value in optimizer.state[model.layers[0].weight].items():
        assert torch.equal(value.cpu(), saved_state[name]), name
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    save_checkpoint(str(folder), model, optimizer, extra={"step": 2})  # replaces the old one whole
    assert load_checkpoint(str(folder), model) == {"step": 2}
    os.remove(folder / "index.json")
    with pytest.raises(FileNotFoundError, match="not a complete tpu checkpoint"):
        load_checkpoint(str(folder), model)


def test_mesh_and_plan_errors_name_the_problem():
    import torch

    import tpu_backend.distributed as dist

    with pytest.raises(ValueError, match="needs 16 devices, but JAX sees"):
        dist.init_mesh((16,), ("data",))
    mesh = dist.init_mesh((-1,), ("model",))
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to("tpu")
        with pytest.raises(ValueError, match="plan key 'blocks.*' matches no module"):
            dist.parallelize_module(model, mesh, {"blocks.*": dist.ColwiseParallel()})
        with pytest.raises(TypeError, match="AttentionParallel applies to nn.MultiheadAttention"):
            dist.parallelize_module(model, mesh, {"0": dist.AttentionParallel()})
    finally:
        dist.set_mesh(None)


# ----------------------------------------------------------------------------- one process, 8 devices


def test_mlp_data_parallel_fsdp_tensor_parallel_match_single_device(tmp_path):
    # SGD under every strategy (a gradient's scale shows); AdamW where its state is sharded
    runs = "single:sgd,dp:sgd,fsdp:sgd,tp:sgd,single:adamw,fsdp:adamw"
    report, tensors = train_with_tensors(tmp_path, "--model", "mlp", "--strategy", runs, "--mesh", "8")
    assert len(report["single:sgd"]["losses"]) == 10
    # one process, 8 CPU devices: eager programs run one at a time once a mesh exists (XLA's
    # CPU client deadlocked in a collective under load otherwise; tensor.SYNC_EACH_COMPUTATION)
    assert not report["single:sgd"]["sync_each_computation"] and report["dp:sgd"]["sync_each_computation"]
    assert_strategies_match_single(report, tensors, ("dp", "fsdp", "tp"), "sgd", "mlp")
    assert_strategies_match_single(report, tensors, ("fsdp",), "adamw", "mlp")
    assert_sharded_one_eighth(report["fsdp:adamw"], "mlp fsdp")
    # data parallel: every device holds the whole model; tensor parallel: the planned layers split
    dp = report["dp:sgd"]
    assert set(dp["param_bytes_per_device"].values()) == {dp["param_bytes_total"]}
    assert report["tp:sgd"]["specs"]["layers.0.weight"] == "P('data',)"
    assert report["tp:sgd"]["specs"]["layers.2.weight"] == "P(None, 'data')"


@pytest.mark.slow
def test_gpt_data_parallel_fsdp_tensor_parallel_match_single_device(tmp_path):
    runs = ",".join(
        f"{strategy}:{optimizer}" for optimizer in ("sgd", "adamw") for strategy in ("single", "dp", "fsdp", "tp")
    )
    report, tensors = train_with_tensors(tmp_path, "--model", "transformer", "--strategy", runs, "--mesh", "8")
    for optimizer in ("sgd", "adamw"):
        assert_strategies_match_single(report, tensors, ("dp", "fsdp", "tp"), optimizer, "gpt")
    assert_sharded_one_eighth(report["fsdp:adamw"], "gpt fsdp")
    tp_specs = report["tp:adamw"]["specs"]
    assert tp_specs["blocks.0.attention.in_proj_weight"] == "P('data',)"
    assert tp_specs["blocks.0.mlp.2.weight"] == "P(None, 'data')"


@pytest.mark.slow
def test_gpt_strategies_in_fused_mode_match_single_device(tmp_path):
    """Fused eager (one program per step) on a mesh: the step program is compiled for
    its inputs' shardings, and gradients and optimizer state stay sharded inside it."""
    report = train(tmp_path, "--strategy", "single,dp,fsdp,tp", "--mesh", "8", "--eager-mode", "fused")
    single = report["single"]["losses"]
    for strategy in ("dp", "fsdp", "tp"):
        assert_same_losses(report[strategy]["losses"], single, f"fused gpt {strategy}")
    assert_sharded_one_eighth(report["fsdp"], "fused gpt fsdp")


@pytest.mark.slow
def test_gpt_checkpoint_from_4x2_mesh_restores_on_8x1(tmp_path):
    folder = str(tmp_path / "checkpoint")
    saved = train(tmp_path, "--strategy", "fsdp", "--mesh", "4x2", "--save-at", "5", "--checkpoint", folder, name="a")
    files = sorted(os.listdir(folder))
    assert "index.json" in files and "skeleton.pt" in files and not os.path.exists(folder + ".tmp")
    assert len([f for f in files if f.startswith("shard-")]) == 4  # parameters split 4 ways, replicated 2
    resumed = train(tmp_path, "--strategy", "fsdp", "--mesh", "8x1", "--resume", folder, name="b")
    assert resumed["fsdp"]["first_step"] == 5
    assert_same_losses(resumed["fsdp"]["losses"], saved["fsdp"]["losses"][5:], "resumed on 8x1")


# ----------------------------------------------------------------------------- several processes

LAUNCH = ["-m", "tpu_backend.launch", "--nproc", "2", "--cpu-devices", "4"]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    single = train(tmp_path, "--strategy", "single", name="single")["single"]["losses"]
    for strategy in ("dp", "fsdp"):
        report = train(tmp_path, "--strategy", strategy, "--mesh", "8", launcher=LAUNCH, name=strategy)[strategy]
        assert report["processes"] == 2
        assert_same_losses(report["losses"], single, f"two processes, {strategy}")


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_killing_one_process_stops_the_run_with_a_clear_error(tmp_path):
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, *LAUNCH, os.path.join(HERE, "collective_loop.py"), "100000"],
            cwd=ROOT,
            env=_env(None),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        text = lambda: log.read_text()  # noqa: E731
        _wait_for(lambda: "[rank 0] step 2:" in text() and "[rank 1] step 2:" in text(), 300, "both ranks to reduce")
        assert "[rank 0] step 2: 192" in text()  # 2 x (8 rows x 4 of 1.0 + 8 rows x 4 of 2.0): both processes' data
        pids = {
            int(line.split()[2]): int(line.split()[4])
            for line in text().splitlines()
            if line.startswith("tpu_backend.launch: rank")
        }
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        launcher.wait(timeout=60)
        stopped_after = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
    output = log.read_text()
    assert launcher.returncode != 0
    assert f"rank 1 (pid {pids[1]}) was killed by SIGKILL" in output and "stopping the other rank(s) [0]" in output
    assert not _pid_alive(pids[0]), "rank 0 survived its peer"
    assert stopped_after < 30
