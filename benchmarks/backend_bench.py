"""Training step time and per-op dispatch overhead of the "tpu" device against PyTorch CPU.

    python benchmarks/backend_bench.py                          # small transformer, cpu-eager vs tpu-strict
    python benchmarks/backend_bench.py --model mingpt --steps 5 # minGPT size (6x384, 6 heads, ctx 128, batch 8)
    python benchmarks/backend_bench.py --modes cpu-eager,tpu-strict,tpu-compile,cpu-inductor
    python benchmarks/backend_bench.py --json results.json      # also write the figures as JSON ('-': stdout)

Every mode runs IN THE SAME PROCESS, one after the other, so their ratio is meaningful even
on a loaded machine (absolute times are not: compare only within one run). A step is
forward + backward + AdamW on one fixed batch; the figure is the median of `--steps`
timed steps after `--warmup` untimed ones (which include compilation; the first step's
time is reported separately). Every step ends with a device synchronisation.

Dispatch overhead: the time of one small op ((64, 64) add and mm, a sum) issued
back to back (`pipelined`: synchronise once after many calls) and one at a time
(`latency`: synchronise after every call), on tpu versus torch CPU.

Absolute numbers depend on the machine's load: small CPU ops suffer most from OpenMP
oversubscription when other processes share the cores (`--threads 1` avoids it).

Adding an execution mode (part 2: fused eager, more compile variants) is one entry in
MODES.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

if __package__ in (None, ""):
    # Run as a script: make the repository root importable for `tests.tpu_backend.models`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.tpu_backend.models import MODEL_CASES, make_optimizer, train_step  # noqa: E402


def _eager(model: nn.Module) -> nn.Module:
    return model


def _compiled(backend: str) -> Callable[[nn.Module], nn.Module]:
    def prepare(model: nn.Module) -> nn.Module:
        if backend == "tpu":
            import tpu_backend.compile  # noqa: F401 - registers the "tpu" Dynamo backend
        torch._dynamo.reset()
        return torch.compile(model, backend=backend)

    return prepare


@dataclass(frozen=True)
class Mode:
    """How to run a training step: the device, the device's eager mode, a model wrapper."""

    device: str
    description: str
    eager_mode: str | None = None  # tpu_backend.set_eager_mode(...) for tpu modes
    prepare: Callable[[nn.Module], nn.Module] = _eager


MODES: dict[str, Mode] = {
    "cpu-eager": Mode("cpu", "native PyTorch CPU eager (the reference)"),
    "cpu-inductor": Mode("cpu", 'torch.compile(backend="inductor") on CPU', prepare=_compiled("inductor")),
    "tpu-strict": Mode("tpu", "tpu device, strict eager (one jit-cached JAX program per op)", eager_mode="strict"),
    "tpu-debug": Mode("tpu", "tpu device, debug eager (synchronous, checked)", eager_mode="debug"),
    "tpu-compile": Mode("tpu", 'torch.compile(backend="tpu") (AOTAutograd graphs in one jax.jit)', eager_mode="strict", prepare=_compiled("tpu")),
}
DEFAULT_MODES = "cpu-eager,tpu-strict"
REFERENCE_MODE = "cpu-eager"


def synchronize(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def set_eager_mode(mode: Mode) -> None:
    if mode.eager_mode is not None:
        import tpu_backend

        tpu_backend.set_eager_mode(mode.eager_mode)


@dataclass
class StepResult:
    mode: str
    median_s: float | None = None
    first_step_s: float | None = None
    steps: list[float] | None = None
    final_loss: float | None = None
    error: str | None = None


def bench_training(model_name: str, mode_name: str, steps: int, warmup: int) -> StepResult:
    """Median step time of forward + backward + AdamW in one mode (a fresh model per mode,
    built from the same seed, so every mode trains the same weights on the same batch)."""
    mode = MODES[mode_name]
    case = MODEL_CASES[model_name]
    result = StepResult(mode_name)
    try:
        set_eager_mode(mode)
        torch.manual_seed(0)
        model = copy.deepcopy(case.build()).to(mode.device)
        runner = mode.prepare(model)
        optimizer = make_optimizer("adamw", model.parameters())
        inputs, target = (t.to(mode.device) for t in case.batch(torch.Generator().manual_seed(0)))
        times = []
        for index in range(warmup + steps):
            start = time.perf_counter()
            loss = train_step(runner, optimizer, case, inputs, target)
            synchronize(mode.device)
            times.append(time.perf_counter() - start)
        result.first_step_s = times[0]
        result.steps = times[warmup:]
        result.median_s = statistics.median(result.steps)
        result.final_loss = loss.item()
    except Exception as error:  # noqa: BLE001 - report the mode as failed and go on
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    return result


OP_CASES: dict[str, Callable] = {
    "add (64,64)": lambda a, b: a + b,
    "mm (64,64)": torch.mm,
    "sum (64,64)": lambda a, b: a.sum(),
}


@dataclass
class OpResult:
    op: str
    device: str
    pipelined_us: float
    latency_us: float


def _time_per_call(fn, a, b, device: str, calls: int, sync_each: bool) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(a, b)
        if sync_each:
            synchronize(device)
    synchronize(device)
    return (time.perf_counter() - start) / calls


def bench_op(name: str, device: str, iterations: int, rounds: int = 5) -> OpResult:
    """Microseconds per call of a small op: back to back (one sync at the end of a round)
    and synchronised after every call; the median over `rounds` rounds, which keeps
    the figure stable when other processes share the cores."""
    fn = OP_CASES[name]
    a = torch.randn(64, 64).to(device)
    b = torch.randn(64, 64).to(device)
    for _ in range(20):  # compile and warm caches
        fn(a, b)
    synchronize(device)
    calls = max(1, iterations // rounds)
    pipelined = statistics.median(_time_per_call(fn, a, b, device, calls, False) for _ in range(rounds))
    latency = statistics.median(_time_per_call(fn, a, b, device, calls, True) for _ in range(rounds))
    return OpResult(name, device, pipelined * 1e6, latency * 1e6)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer", choices=["mlp", "cnn", "transformer", "mingpt"])
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, from: {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--op-iterations", type=int, default=2000, help="calls per dispatch-overhead figure")
    parser.add_argument("--skip-ops", action="store_true", help="no dispatch-overhead figures")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: torch's choice; on a machine shared with other processes, "
        "1 avoids OpenMP oversubscription that can slow small CPU ops 10-100x)",
    )
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    return args


def print_tables(model_name: str, steps: list[StepResult], ops: list[OpResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    reference = next((s.median_s for s in steps if s.mode == REFERENCE_MODE and s.median_s), None)
    table = Table(title=f"Training step ({model_name}: forward + backward + AdamW), median")
    for column in ("mode", "step ms", f"x {REFERENCE_MODE}", "first step ms", "final loss"):
        table.add_column(column, no_wrap=True)
    for s in steps:
        if s.error:
            table.add_row(s.mode, "[red]failed[/]", "-", "-", "-")
            continue
        ratio = f"{s.median_s / reference:.2f}" if reference else "-"
        table.add_row(s.mode, f"{s.median_s * 1e3:.1f}", ratio, f"{s.first_step_s * 1e3:.0f}", f"{s.final_loss:.4f}")
    console.print(table)
    for s in steps:
        console.print(f"  {s.mode}: {MODES[s.mode].description}")
        if s.error:
            console.print(f"    [red]{s.error}[/]", soft_wrap=True)
    if not ops:
        return
    table = Table(title="Per-op dispatch overhead (us per call)")
    for column in ("op", "device", "pipelined us", "latency us", "x cpu (latency)"):
        table.add_column(column, no_wrap=True)
    cpu_latency = {o.op: o.latency_us for o in ops if o.device == "cpu"}
    for o in ops:
        ratio = o.latency_us / cpu_latency[o.op] if o.op in cpu_latency else float("nan")
        table.add_row(o.op, o.device, f"{o.pipelined_us:.1f}", f"{o.latency_us:.1f}", f"{ratio:.1f}")
    console.print(table)


def main(argv=None) -> int:
    args = parse_args(argv)
    modes = args.modes.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    if any(MODES[m].device == "tpu" for m in modes) or not args.skip_ops:
        import tpu_backend  # noqa: F401 - registers the device

    config = MODEL_CASES[args.model]
    print(f"benchmarking {config.name}: modes {modes}, {args.warmup} warm-up + {args.steps} timed steps", file=sys.stderr)
    steps = [bench_training(args.model, m, args.steps, args.warmup) for m in modes]
    ops = [] if args.skip_ops else [bench_op(name, d, args.op_iterations) for name in OP_CASES for d in ("cpu", "tpu")]
    print_tables(args.model, steps, ops)

    if args.json:
        payload = {
            "model": args.model,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "steps": [vars(s) for s in steps],
            "ops": [vars(o) for o in ops],
        }
        text = json.dumps(payload, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0 if all(s.error is None for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
