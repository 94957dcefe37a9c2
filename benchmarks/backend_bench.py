"""Training step time and per-op dispatch overhead of the "tpu" device against PyTorch CPU.

    python benchmarks/backend_bench.py                          # small transformer, cpu-eager vs tpu-strict
    python benchmarks/backend_bench.py --model mingpt --steps 5 # minGPT size (6x384, 6 heads, ctx 128, batch 8)
    python benchmarks/backend_bench.py --modes cpu-eager,tpu-strict,tpu-compile,cpu-inductor
    python benchmarks/backend_bench.py --model mingpt --modes all --skip-ops   # every mode, targets checked
    python benchmarks/backend_bench.py --model mingpt --modes all --skip-inductor # ... without inductor's long compile
    python benchmarks/backend_bench.py --json results.json      # also write the figures as JSON ('-': stdout)
    python benchmarks/backend_bench.py --profile runs/bench      # trace the steps (torch.tpu.profiler): TensorBoard/Perfetto

Every mode runs IN THE SAME PROCESS: each is built and warmed up in turn (`--warmup`
untimed steps, which include compilation; the first step's time is reported
separately), then `--steps` timed rounds each run one step of every mode, in a rotating
order, so that load from other processes hits every mode alike and their ratios stay
meaningful on a loaded machine (absolute times are not: compare only within one run; the
load average before and after is printed and saved). `--sequential` times each mode in
one block instead. A step is forward + backward + AdamW on one fixed batch; the figure is
the median of the timed steps.
Every step ends with a device synchronisation. Every mode starts from the same weights
and batch, so the final losses agree (a check that each mode computes the same step).

Modes: native PyTorch CPU eager (the reference) and `torch.compile` with inductor; the
tpu device in strict, debug and fused eager and under `torch.compile(backend="tpu")`;
and `jax`, the same step written directly in JAX (`benchmarks/jax_mingpt.py`, GPT models
only): the ceiling of running through JAX. Ratios are given against native eager and
against JAX, and the project's targets are checked: compiled <= 1.1x JAX and <= 1.1x
native eager, fused <= 1.3x compiled, strict <= 2x native eager.

For the GPT models the model FLOPs of a step (6 * parameters * tokens plus attention)
give GFLOP/s per mode and, when JAX runs on a TPU, the MFU (model FLOPs utilisation:
achieved FLOP/s over the chip's peak bf16 FLOP/s).

Dispatch overhead: the time of one small op ((64, 64) add and mm, a sum) issued
back to back (`pipelined`: synchronise once after many calls) and one at a time
(`latency`: synchronise after every call), on tpu versus torch CPU.

Absolute numbers depend on the machine's load: small CPU ops suffer most from OpenMP
oversubscription when other processes share the cores (`--threads 1` avoids it).

Adding an execution mode is one entry in MODES.
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

from tests.tpu_backend.models import MODEL_CASES, TinyGPT, make_optimizer, train_step  # noqa: E402


def _eager(model: nn.Module) -> nn.Module:
    return model


def _compiled(backend: str) -> Callable[[nn.Module], nn.Module]:
    def prepare(model: nn.Module) -> nn.Module:
        if backend == "tpu":
            import tpu_backend.compile  # noqa: F401 - registers the "tpu" Dynamo backend
        return torch.compile(model, backend=backend)

    return prepare


@dataclass(frozen=True)
class Mode:
    """How to run a training step: the device, the device's eager mode, a model wrapper.

    Device "jax" is the hand-written JAX step of `benchmarks/jax_mingpt.py` (no torch)."""

    device: str
    description: str
    eager_mode: str | None = None  # tpu_backend.set_eager_mode(...) for tpu modes
    prepare: Callable[[nn.Module], nn.Module] = _eager


MODES: dict[str, Mode] = {
    "cpu-eager": Mode("cpu", "native PyTorch CPU eager (the reference)"),
    "cpu-inductor": Mode("cpu", 'torch.compile(backend="inductor") on CPU', prepare=_compiled("inductor")),
    "tpu-strict": Mode("tpu", "tpu device, strict eager (one jit-cached JAX program per op)", eager_mode="strict"),
    "tpu-debug": Mode("tpu", "tpu device, debug eager (synchronous, checked)", eager_mode="debug"),
    "tpu-fused": Mode(
        "tpu", "tpu device, fused eager (each step recorded, run as one XLA program)", eager_mode="fused"
    ),
    "tpu-compile": Mode(
        "tpu",
        'torch.compile(backend="tpu") (AOTAutograd graphs in one jax.jit)',
        eager_mode="strict",
        prepare=_compiled("tpu"),
    ),
    "jax": Mode("jax", "the same step written directly in JAX (benchmarks/jax_mingpt.py): the ceiling"),
}
DEFAULT_MODES = "cpu-eager,tpu-strict"
# `--modes all`: everything that makes the acceptance comparison (debug mode is a checker, not a speed).
ALL_MODES = "cpu-eager,cpu-inductor,tpu-strict,tpu-fused,tpu-compile,jax"
REFERENCE_MODE = "cpu-eager"
CEILING_MODE = "jax"


@dataclass(frozen=True)
class Target:
    """`mode`'s step time must be at most `max_ratio` times `reference`'s."""

    mode: str
    reference: str
    max_ratio: float


TARGETS = (
    Target("tpu-compile", CEILING_MODE, 1.1),
    Target("tpu-compile", REFERENCE_MODE, 1.1),
    Target("tpu-fused", "tpu-compile", 1.3),
    Target("tpu-strict", REFERENCE_MODE, 2.0),
)

# Peak dense bf16 FLOP/s per chip by JAX `device_kind` (vendors' published figures), for MFU.
TPU_PEAK_FLOPS = {
    "TPU v2": 45e12,
    "TPU v3": 123e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "TPU7x": 2307e12,
}


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


def _describe_error(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


def make_step(model_name: str, mode_name: str) -> Callable[[], float]:
    """A fresh model in `mode_name` (built from the same seed in every mode, so every mode
    trains the same weights on the same batch) and a function that runs one synchronised
    forward + backward + AdamW step and returns the loss."""
    mode = MODES[mode_name]
    case = MODEL_CASES[model_name]
    if mode.device == "jax":
        from benchmarks.jax_mingpt import JaxTrainer

        trainer = JaxTrainer(model_name)
        return lambda: float(trainer.step())
    set_eager_mode(mode)
    torch.manual_seed(0)
    model = copy.deepcopy(case.build()).to(mode.device)
    runner = mode.prepare(model)
    optimizer = make_optimizer("adamw", model.parameters())
    inputs, target = (t.to(mode.device) for t in case.batch(torch.Generator().manual_seed(0)))

    def step() -> float:
        set_eager_mode(mode)  # interleaved modes share the device's eager mode
        loss = train_step(runner, optimizer, case, inputs, target)
        synchronize(mode.device)
        return loss.item()

    return step


def leave_lazy_modes() -> None:
    """Back to strict eager after fused/debug modes (fused runs its pending work now)."""
    if "tpu_backend" in sys.modules:
        set_eager_mode(MODES["tpu-strict"])


def _timed(step: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    loss = step()
    return time.perf_counter() - start, loss


def _finish(result: StepResult, times: list[float], loss: float) -> None:
    result.steps = times
    result.median_s = statistics.median(times)
    result.final_loss = loss


def bench_training(model_name: str, mode_name: str, steps: int, warmup: int) -> StepResult:
    """Median step time of forward + backward + AdamW in one mode, `warmup` untimed steps
    first (the first step, compiles included, is reported separately)."""
    result = StepResult(mode_name)
    try:
        torch._dynamo.reset()  # no graph compiled for an earlier mode's model is reused
        step = make_step(model_name, mode_name)
        times = []
        for _ in range(warmup + steps):
            seconds, loss = _timed(step)
            times.append(seconds)
        result.first_step_s = times[0]
        _finish(result, times[warmup:], loss)
    except Exception as error:  # noqa: BLE001 - report the mode as failed and go on
        result.error = _describe_error(error)
    finally:
        leave_lazy_modes()
    return result


def bench_interleaved(model_name: str, mode_names: list[str], steps: int, warmup: int) -> list[StepResult]:
    """Like `bench_training` for every mode, but timed in rounds: each mode is built and
    warmed up in turn (`warmup` >= 1 steps: compiles happen here), then each of `steps`
    rounds runs one step of every mode, in an order that rotates from round to round.
    Load from other processes then hits all modes alike, which keeps their ratios
    meaningful on a shared machine (the default)."""
    results = {m: StepResult(m) for m in mode_names}
    runners: dict[str, Callable[[], float]] = {}
    times: dict[str, list[float]] = {m: [] for m in mode_names}
    losses: dict[str, float] = {}
    torch._dynamo.reset()
    for m in mode_names:
        try:
            step = make_step(model_name, m)
            for index in range(max(warmup, 1)):
                seconds, losses[m] = _timed(step)
                if index == 0:
                    results[m].first_step_s = seconds
            runners[m] = step
        except Exception as error:  # noqa: BLE001 - report the mode as failed and go on
            results[m].error = _describe_error(error)
        print(
            f"  {m}: warmed up ({results[m].error or f'first step {results[m].first_step_s:.1f} s'})", file=sys.stderr
        )
    for round_index in range(steps):
        shift = round_index % max(len(runners), 1)
        order = list(runners)[shift:] + list(runners)[:shift]
        for m in order:
            try:
                seconds, losses[m] = _timed(runners[m])
                times[m].append(seconds)
            except Exception as error:  # noqa: BLE001
                results[m].error = _describe_error(error)
                del runners[m]
    leave_lazy_modes()
    for m in runners:
        _finish(results[m], times[m], losses[m])
    return [results[m] for m in mode_names]


def step_flops(model_name: str) -> int | None:
    """Model FLOPs of one training step for the GPT models (None for the others)."""
    case = MODEL_CASES[model_name]
    model = case.build()
    if not isinstance(model, TinyGPT):
        return None
    from benchmarks.jax_mingpt import step_flops as gpt_step_flops

    inputs, _ = case.batch(torch.Generator().manual_seed(0))
    return gpt_step_flops(model.config, inputs.shape[0])


def tpu_peak_flops() -> float | None:
    """The JAX default device's peak FLOP/s if it is a TPU we know, else None."""
    import jax

    if jax.default_backend() != "tpu":
        return None
    kind = jax.devices()[0].device_kind
    return next(
        (peak for name, peak in sorted(TPU_PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])) if kind.startswith(name)),
        None,
    )


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
    parser.add_argument(
        "--modes", default=DEFAULT_MODES, help=f"comma-separated, from: {', '.join(MODES)}; or 'all' ({ALL_MODES})"
    )
    parser.add_argument(
        "--skip-inductor", action="store_true", help="leave cpu-inductor out (its compile is slow here)"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="time each mode's steps in one block, mode after mode (default: warm every mode up, then "
        "time rounds of one step per mode, so load from other processes hits all modes alike)",
    )
    parser.add_argument("--op-iterations", type=int, default=2000, help="calls per dispatch-overhead figure")
    parser.add_argument("--skip-ops", action="store_true", help="no dispatch-overhead figures")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; on a machine shared with other processes, "
        "1 avoids OpenMP oversubscription that can slow small CPU ops 10-100x)",
    )
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    parser.add_argument(
        "--profile", metavar="DIR", help="trace the training steps into DIR with torch.tpu.profiler (slows them)"
    )
    args = parser.parse_args(argv)
    if args.modes == "all":
        args.modes = ALL_MODES
    if args.skip_inductor:
        args.modes = ",".join(m for m in args.modes.split(",") if m != "cpu-inductor")
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)} or 'all'")
    if CEILING_MODE in args.modes.split(",") and args.model not in ("transformer", "mingpt"):
        parser.error(f"mode {CEILING_MODE!r} exists for the GPT models only ('transformer', 'mingpt')")
    return args


def _ratio(steps: list[StepResult], mode: str, reference: str) -> float | None:
    times = {s.mode: s.median_s for s in steps if s.median_s}
    return times[mode] / times[reference] if mode in times and reference in times else None


def check_targets(steps: list[StepResult]) -> list[dict]:
    """Each target whose two modes ran: the measured ratio and whether it is met."""
    checked = []
    ran = {s.mode for s in steps}
    for target in TARGETS:
        if target.mode in ran and target.reference in ran:
            ratio = _ratio(steps, target.mode, target.reference)
            met = ratio is not None and ratio <= target.max_ratio
            checked.append(dict(vars(target), ratio=ratio, met=met))
    return checked


def print_tables(
    model_name: str, steps: list[StepResult], ops: list[OpResult], flops: int | None, peak: float | None, load: dict
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or redirected: rich would wrap at 80 columns
        console = Console(width=160)
    ran = {s.mode for s in steps}
    reference = next((s.median_s for s in steps if s.mode == REFERENCE_MODE and s.median_s), None)
    loss_reference = next((s.final_loss for s in steps if s.mode == REFERENCE_MODE and s.median_s), None)
    columns = ["mode", "step ms", f"x {REFERENCE_MODE}"]
    columns += [f"x {CEILING_MODE}"] if CEILING_MODE in ran else []
    columns += ["first step ms", "final loss"]
    columns += ["GFLOP/s"] if flops else []
    columns += ["MFU"] if flops and peak else []
    table = Table(title=f"Training step ({model_name}: forward + backward + AdamW), median")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for s in steps:
        if s.error:
            table.add_row(s.mode, "[red]failed[/]", *["-"] * (len(columns) - 2))
            continue
        row = [s.mode, f"{s.median_s * 1e3:.1f}", f"{s.median_s / reference:.2f}" if reference else "-"]
        if CEILING_MODE in ran:
            ratio = _ratio(steps, s.mode, CEILING_MODE)
            row.append(f"{ratio:.2f}" if ratio else "-")
        loss = f"{s.final_loss:.4f}"
        if loss_reference is not None and abs(s.final_loss - loss_reference) > 1e-3 * abs(loss_reference):
            loss = f"[red]{loss} (differs)[/]"  # a mode that does not compute the same step
        row += [f"{s.first_step_s * 1e3:.0f}", loss]
        if flops:
            row.append(f"{flops / s.median_s / 1e9:.3g}")
        if flops and peak:
            row.append(f"{flops / s.median_s / peak:.1%}")
        table.add_row(*row)
    console.print(table)
    for s in steps:
        console.print(f"  {s.mode}: {MODES[s.mode].description}")
        if s.error:
            console.print(f"    [red]{s.error}[/]", soft_wrap=True)
    if flops:
        mfu = (
            "MFU: on a TPU only (JAX runs on a TPU we know the peak of)"
            if not peak
            else f"TPU peak {peak / 1e12:.0f} TFLOP/s"
        )
        console.print(f"  model FLOPs per step: {flops / 1e9:.2f} GFLOP; {mfu}")
    if CEILING_MODE in ran:
        from benchmarks.jax_mingpt import torchax_status

        console.print(f"  {torchax_status()}")
    console.print(
        f"  load average (1 min) before / after: {load['before'][0]:.1f} / {load['after'][0]:.1f} on {load['cpus']} CPUs"
    )
    targets = check_targets(steps)
    if targets:
        table = Table(title="Targets (step time ratios)")
        for column in ("mode", "vs", "ratio", "target", "met"):
            table.add_column(column, no_wrap=True)
        for t in targets:
            ratio = f"{t['ratio']:.2f}" if t["ratio"] is not None else "failed"
            met = "[green]yes[/]" if t["met"] else "[red]no[/]"
            table.add_row(t["mode"], t["reference"], ratio, f"<= {t['max_ratio']}", met)
        console.print(table)
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
    if any(MODES[m].device == "tpu" for m in modes) or not args.skip_ops or args.profile:
        import tpu_backend  # noqa: F401 - registers the device

    config = MODEL_CASES[args.model]
    print(
        f"benchmarking {config.name}: modes {modes}, {args.warmup} warm-up + {args.steps} timed steps", file=sys.stderr
    )
    load = {"cpus": os.cpu_count(), "before": os.getloadavg()}
    profile = torch.tpu.profiler.profile(args.profile).start() if args.profile else None
    if args.sequential:
        steps = [bench_training(args.model, m, args.steps, args.warmup) for m in modes]
    else:
        steps = bench_interleaved(args.model, modes, args.steps, args.warmup)
    if profile is not None:
        print(f"profile (steps timed under the profiler): {profile.stop()}", file=sys.stderr)
    ops = [] if args.skip_ops else [bench_op(name, d, args.op_iterations) for name in OP_CASES for d in ("cpu", "tpu")]
    load["after"] = os.getloadavg()
    flops = step_flops(args.model)
    peak = tpu_peak_flops() if flops else None
    print_tables(args.model, steps, ops, flops, peak, load)

    if args.json:
        payload = {
            "model": args.model,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average": load,
            "flops_per_step": flops,
            "tpu_peak_flops": peak,
            "steps": [vars(s) for s in steps],
            "targets": check_targets(steps),
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
