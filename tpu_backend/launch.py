"""Start a multi-process run on this machine: `python -m tpu_backend.launch --nproc N script.py [args]`.

Each process gets the environment `tpu_backend.distributed` reads to join the run through
`jax.distributed.initialize` (TPU_COORDINATOR on loopback at a free port,
TPU_NUM_PROCESSES, TPU_PROCESS_ID, TPU_HEARTBEAT_TIMEOUT) plus torchrun's names (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so scripts written for
`torch.distributed` (`init_process_group("tpu")`) run under it as under torchrun. `--cpu-devices K` gives each process K
virtual CPU devices (XLA_FLAGS), for trying a pod-slice script on one machine; on a TPU
pod slice run the script directly on every host with TPU_AUTO_INITIALIZE=1 instead.

The launcher supervises its children: output lines are prefixed with the rank; when a
process fails (non-zero exit or a signal) it names it, stops the others (SIGTERM, then
SIGKILL after `--grace` seconds) and exits non-zero. A process blocked in a collective
cannot notice a dead peer by itself until JAX's heartbeat timeout aborts it; the
launcher does not wait for that. Children die with the launcher (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(
    rank: int, nproc: int, port: int, cpu_devices: int | None, heartbeat: int, master_port: int | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TPU_COORDINATOR=f"127.0.0.1:{port}",
        TPU_NUM_PROCESSES=str(nproc),
        TPU_PROCESS_ID=str(rank),
        TPU_HEARTBEAT_TIMEOUT=str(heartbeat),
        RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nproc),
        PYTHONUNBUFFERED="1",
    )
    if master_port is not None:  # torch.distributed's env:// rendezvous (init_process_group("tpu"))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    if cpu_devices:
        flags = [
            f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")
        ]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={cpu_devices}"])
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the launcher's own signal handling still stops children
        pass


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()
    stream.close()


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _stop(procs: dict[int, subprocess.Popen], grace: float) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(
    command: list[str],
    nproc: int,
    cpu_devices: int | None = None,
    heartbeat: int = 10,
    grace: float = 5.0,
    port: int | None = None,
) -> int:
    """Run `command` (argv after the Python interpreter) as `nproc` processes; returns the
    exit code (0 when every process succeeded)."""
    port = port or free_port()
    master_port = free_port()
    procs: dict[int, subprocess.Popen] = {}
    pumps = []
    for rank in range(nproc):
        proc = subprocess.Popen(
            [sys.executable, *command],
            env=child_env(rank, nproc, port, cpu_devices, heartbeat, master_port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        procs[rank] = proc
        print(f"tpu_backend.launch: rank {rank} pid {proc.pid}", file=sys.stderr, flush=True)
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            pump = threading.Thread(target=_pump, args=(stream, f"[rank {rank}] ", out), daemon=True)
            pump.start()
            pumps.append(pump)

    def forward(signum, _frame):
        print(f"tpu_backend.launch: got {signal.Signals(signum).name}; stopping all ranks", file=sys.stderr, flush=True)
        _stop(procs, grace)
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    code = 0
    while True:
        exits = {rank: proc.poll() for rank, proc in procs.items()}  # poll every child, every time
        if all(status is not None for status in exits.values()):
            break
        failed = [(rank, procs[rank]) for rank, status in exits.items() if status not in (None, 0)]
        if failed:
            rank, proc = failed[0]
            running = [r for r, p in procs.items() if p.poll() is None]
            print(
                f"tpu_backend.launch: rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)}; "
                f"stopping the other rank(s) {running}: a multi-process run cannot continue without every process",
                file=sys.stderr,
                flush=True,
            )
            _stop(procs, grace)
            code = 1
            break
        time.sleep(0.1)
    for pump in pumps:
        pump.join(timeout=2)
    if code == 0:
        failed = [(rank, proc) for rank, proc in procs.items() if proc.returncode != 0]
        for rank, proc in failed:
            print(f"tpu_backend.launch: rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)}", file=sys.stderr)
        code = 1 if failed else 0
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpu_backend.launch",
        description="Run a script as N processes of one JAX multi-process run on this machine.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="number of processes")
    parser.add_argument("--cpu-devices", type=int, default=None, help="virtual CPU devices per process (XLA_FLAGS)")
    parser.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=10,
        help="seconds after which JAX aborts a process whose peer stopped answering (default 10)",
    )
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping")
    parser.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("-m", dest="module", default=None, help="run a module (like python -m) instead of a script")
    parser.add_argument("script", nargs="?", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = parser.parse_args(argv)
    if ns.nproc < 1:
        parser.error("--nproc must be at least 1")
    if ns.module:
        command = ["-m", ns.module, *([ns.script] if ns.script else []), *ns.args]
    elif ns.script:
        command = [ns.script, *ns.args]
    else:
        parser.error("give a script (or -m module) to run")
    return launch(command, ns.nproc, ns.cpu_devices, ns.heartbeat_timeout, ns.grace, ns.port)


if __name__ == "__main__":
    sys.exit(main())
