"""First-step time of a fresh process, cold cache against warm cache (issue 32).

    python -m benchmarks.device.compile_time_bench --model llama --modes tpu-compile,tpu-fused,tpu-compile-step
    python -m benchmarks.device.compile_time_bench --model llama --layers 8 --modes tpu-compile
    python -m benchmarks.device.compile_time_bench --model llama-374m --remat --modes tpu-compile   # on a TPU
    python -m benchmarks.device.compile_time_bench --model llama-374m --remat --scan-layers --modes tpu-compile \
        --layers 8 --context 128 --batch 1     # the host's share (Dynamo, AOTAutograd) at a cheap shape
    python -m benchmarks.device.compile_time_bench --model llama --json results.json            # also as JSON ('-': stdout)
    python -m benchmarks.device.compile_time_bench --model llama --xla-cache-only   # the baseline: JAX's disk cache alone
    python -m benchmarks.device.compile_time_bench --model llama --dynamo-cache     # Dynamo's output cached too (opt-in)

For each mode, the first training step (forward + backward + AdamW, `backend_bench.py`'s
model cases and step functions) runs in a fresh Python process twice, one after the
other (on a TPU only one process can hold the chip), with one fresh cache folder
(`TPU_CACHE_DIR`): the first process fills it, the second should find everything there.
The target: the second process's first step takes at most 10% of the first's.

Each process reports where its first step went:

- Dynamo: bytecode tracing and guards (`torch._dynamo`'s own timers, minus the backend);
- AOTAutograd: the backend call: AOTAutograd's trace and partition, or its cache lookup
  (`graph_cache.py`), and building our callables;
- lowering: tracing our programs through the lowerings to StableHLO (JAX's trace);
- XLA: compiling the programs, or loading them from disk (XLA's store, or the
  lowered-program store, which skips the lowering too: `program_cache.py`);
- strict ops: strict eager's per-op programs (the optimizer outside `torch.compile`):
  their tracing and compiling or loading;
- run + other: what is left: running the step, recording (fused mode), Python.

Dynamo and AOTAutograd also as the thread's CPU time (steadier than wall time on a
shared machine).

Then the steady step time (a later step, nothing compiled) and the caches' counters:
programs compiled / loaded, XLA store and lowered-program store hits and misses,
AOTAutograd cache hits and misses, corrupt entries replaced, the while loops in the
`torch.compile` programs (`--scan-layers`: one per program, also when loaded from disk).
The two losses must agree.

`--dynamo-cache` turns on Dynamo's cache (`TPU_DYNAMO_CACHE=on`, `dynamo_cache.py`): the
second process installs Dynamo's output when `torch.compile` is called (counted in
"build + torch.compile", before the first step) instead of tracing in the first step.

`--child MODE` is one such process (it prints one JSON line); the tests use it too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import ROOT, module_command, repo_env, write_json

_STARTED = time.perf_counter()


TARGET_RATIO = 0.10
DEFAULT_MODES = "tpu-compile,tpu-fused,tpu-compile-step"
PHASES = (
    ("dynamo_s", "Dynamo"),
    ("aot_s", "AOTAutograd (or its cache)"),
    ("lowering_s", "lowering (JAX trace)"),
    ("xla_s", "XLA compile / disk load"),
    ("strict_ops_s", "strict per-op programs"),
    ("other_s", "run + other"),
)


# --------------------------------------------------------------------- one process


_DYNAMO_TIMERS = ("_compile.compile_inner", "OutputGraph.call_user_compiler")


def _timer_total(metrics: dict, name: str) -> float:
    return float(sum(metrics.get(name, ())))


def _while_loops() -> dict[str, int]:
    """Per `torch.compile` program, the while loops in its executables (`scan_layers`' runs)."""
    from tpu_backend.compile import programs

    loops: dict[str, int] = {}
    for program in programs():
        if program.name.startswith("torch_compile_"):
            found = sum(text.count(" while(") for text in program.compiled_texts())
            loops[program.name] = loops.get(program.name, 0) + found
    return loops


class _CpuClock:
    """The calling thread's CPU time inside Dynamo's frame compiles and inside its backend
    calls (AOTAutograd): on a machine shared with other jobs, wall time varies 2x between
    identical runs while CPU time varies far less."""

    def __init__(self):
        import torch._dynamo.convert_frame as convert_frame
        import torch._dynamo.output_graph as output_graph

        self.dynamo_total = self.backend = 0.0
        compile_frame, call_user_compiler = convert_frame._compile, output_graph.OutputGraph.call_user_compiler

        def timed_compile(*args, **kwargs):
            start = time.thread_time()
            try:
                return compile_frame(*args, **kwargs)
            finally:
                self.dynamo_total += time.thread_time() - start

        def timed_backend(graph, *args, **kwargs):
            start = time.thread_time()
            try:
                return call_user_compiler(graph, *args, **kwargs)
            finally:
                self.backend += time.thread_time() - start

        convert_frame._compile = timed_compile
        output_graph.OutputGraph.call_user_compiler = timed_backend


def child(args: argparse.Namespace) -> dict:
    """Build the mode's model, run its first step and one more, and say where the time went."""
    from benchmarks.device import backend_bench as bench

    bench._layers, bench._context, bench._remat, bench._batch_size = args.layers, args.context, args.remat, args.batch
    bench._scan_layers, bench._compile_optimizer = args.scan_layers, args.compile_optimizer
    bench._fused_optimizer = args.fused_optimizer
    from torch._dynamo.utils import compilation_time_metrics

    import tpu_backend  # noqa: F401 - registers the device
    from tpu_backend.compile import compile_stats, disk_cache, dynamo_cache, graph_cache, program_cache
    from tpu_backend.eager.runner import CACHE_STATS, finish_background_compiles

    cpu = _CpuClock()
    imported = time.perf_counter()
    step = bench.make_step(args.model, args.child)
    built = time.perf_counter()
    # Dynamo's timers so far: installing a cached entry at torch.compile (--dynamo-cache)
    at_build = {name: _timer_total(compilation_time_metrics, name) for name in _DYNAMO_TIMERS}
    loss = step()[0]
    first = time.perf_counter() - built
    programs = compile_stats().total()
    strict_seconds, strict_compiles = CACHE_STATS.compile_seconds, CACHE_STATS.misses
    waited = time.perf_counter()
    finish_background_compiles()  # the fused optimizer's one program (TPU_OPTIMIZER_PROGRAMS=auto)
    waited = time.perf_counter() - waited
    steady = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        steady.append(time.perf_counter() - start)

    from torch._dynamo.utils import counters

    metrics = compilation_time_metrics
    dynamo_total = _timer_total(metrics, "_compile.compile_inner") - at_build["_compile.compile_inner"]
    backend = _timer_total(metrics, "OutputGraph.call_user_compiler") - at_build["OutputGraph.call_user_compiler"]
    xla_store, prog_store = disk_cache(), program_cache.store()
    result = {
        "mode": args.child,
        "model": args.model,
        "layers": args.layers,
        "context": args.context,
        "imports_s": imported - _STARTED,
        "build_s": built - imported,
        "dynamo_install_s": at_build["_compile.compile_inner"],
        "first_step_s": first,
        "dynamo_s": dynamo_total - backend,
        "aot_s": backend,
        "dynamo_cpu_s": cpu.dynamo_total - cpu.backend,
        "aot_cpu_s": cpu.backend,
        "lowering_s": programs.trace_seconds,
        "xla_s": programs.compile_seconds - programs.trace_seconds,
        "strict_ops_s": strict_seconds,
        "background_s": waited,
        "steady_step_s": min(steady) if steady else None,
        "programs_built": programs.disk_hits + programs.misses,
        "programs_compiled": programs.misses,
        "programs_from_disk": programs.disk_hits,
        "programs_loaded": programs.loaded,
        "strict_ops_traced": strict_compiles,
        "xla_store": {"hits": xla_store.hits, "misses": xla_store.misses} if xla_store else None,
        "program_store": {"hits": prog_store.hits, "misses": prog_store.misses} if prog_store else None,
        "aot_cache": graph_cache.counters(),
        "dynamo_cache": dynamo_cache.counters() if dynamo_cache.enabled() else None,
        "graphs_traced": int(counters["stats"]["unique_graphs"]),
        "corrupt_entries": compile_stats().corrupt_entries,
        "while_loops": _while_loops(),
        "loss": loss,
    }
    accounted = sum(result[key] for key, _ in PHASES if key != "other_s")
    result["other_s"] = first - accounted
    return result


# --------------------------------------------------------------------- the two processes


def run_child(mode: str, args: argparse.Namespace, cache_dir: str) -> dict:
    command = module_command(__spec__.name, "--child", mode, "--model", args.model)
    command += ["--steps", str(args.steps)]
    if args.layers:
        command += ["--layers", str(args.layers)]
    if args.batch:
        command += ["--batch", str(args.batch)]
    if args.context:
        command += ["--context", str(args.context)]
    if args.remat:
        command += ["--remat", args.remat]
    for flag in ("scan_layers", "compile_optimizer", "fused_optimizer"):
        if getattr(args, flag):
            command.append("--" + flag.replace("_", "-"))
    env = repo_env(TPU_CACHE_DIR=cache_dir)
    if args.xla_cache_only:  # the state before issue 32: JAX's persistent cache alone
        env.update(TPU_AOT_CACHE="off", TPU_PROGRAM_CACHE="off")
    env["TPU_DYNAMO_CACHE"] = "on" if args.dynamo_cache else "off"
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{mode}: the child process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1])
    result["process_s"] = wall
    return result


def _fmt(value) -> str:
    return "-" if value is None else f"{value:9.2f}"


def print_table(mode: str, first: dict, second: dict) -> None:
    print(f"\n{mode}: {first['model']}" + (f", {first['layers']} layers" if first["layers"] else ""))
    print(f"{'seconds':34s} {'first':>9s} {'second':>9s}")
    rows = [
        ("process (wall, imports included)", "process_s"),
        ("imports", "imports_s"),
        ("build + torch.compile", "build_s"),
        ("  of which Dynamo cache install", "dynamo_install_s"),
        ("first step", "first_step_s"),
    ]
    for key, label in [(k, "  " + label) for k, label in PHASES]:
        rows.append((label, key))
    rows.append(("  Dynamo, CPU time", "dynamo_cpu_s"))
    rows.append(("  AOTAutograd, CPU time", "aot_cpu_s"))
    rows.append(("background compiles left after it", "background_s"))
    rows.append(("steady step (later, no compile)", "steady_step_s"))
    for label, key in rows:
        print(f"{label:34s} {_fmt(first.get(key))} {_fmt(second.get(key))}")
    for label, key in (
        ("programs compiled by XLA", "programs_compiled"),
        ("programs from disk", "programs_from_disk"),
        ("  of which loaded, not traced", "programs_loaded"),
        ("strict per-op programs traced", "strict_ops_traced"),
        ("corrupt entries replaced", "corrupt_entries"),
    ):
        print(f"{label:34s} {first[key]:9d} {second[key]:9d}")
    loops = [sum(report["while_loops"].values()) for report in (first, second)]
    print(f"{'while loops in the programs':34s} {loops[0]:9d} {loops[1]:9d}")
    for label, key in (("XLA store", "xla_store"), ("lowered-program store", "program_store")):
        a, b = first[key] or {}, second[key] or {}
        print(
            f"{label + ' hits/misses':34s} {a.get('hits', 0):4d}/{a.get('misses', 0):<4d} {b.get('hits', 0):4d}/{b.get('misses', 0):<4d}"
        )
    a, b = first["aot_cache"], second["aot_cache"]
    print(f"{'AOTAutograd cache hits/misses':34s} {a['hit']:4d}/{a['miss']:<4d} {b['hit']:4d}/{b['miss']:<4d}")
    if first.get("dynamo_cache") and second.get("dynamo_cache"):
        a, b = first["dynamo_cache"], second["dynamo_cache"]
        print(f"{'Dynamo cache installed/misses':34s} {a['hit']:4d}/{a['miss']:<4d} {b['hit']:4d}/{b['miss']:<4d}")
    print(f"{'graphs Dynamo traced':34s} {first.get('graphs_traced', 0):9d} {second.get('graphs_traced', 0):9d}")
    ratio = second["first_step_s"] / first["first_step_s"]
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    print(f"second / first, first step: {ratio:.3f} ({verdict} the target <= {TARGET_RATIO:.2f})")
    with_build = (second["build_s"] + second["first_step_s"]) / (first["build_s"] + first["first_step_s"])
    print(f"second / first, build + torch.compile + first step: {with_build:.3f}")
    print(f"second / first, whole process: {second['process_s'] / first['process_s']:.3f}")
    same = first["loss"] == second["loss"]
    print(f"losses: {first['loss']!r} / {second['loss']!r} ({'equal' if same else 'DIFFERENT'})")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama", help="a model case of backend_bench.py (default: llama)")
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated tpu modes (default: {DEFAULT_MODES})")
    parser.add_argument("--layers", type=int, help="the Llama models' layer count (default: the model's)")
    parser.add_argument("--batch", type=int, help="the token models' batch size")
    parser.add_argument(
        "--context", type=int, help="the Llama models' sequence length (compile time does not depend on it)"
    )
    parser.add_argument(
        "--remat",
        nargs="?",
        const="full",
        choices=("full", "matmuls"),
        help="Llama models: recompute each block in the backward (all of it, or all but its matrix products)",
    )
    parser.add_argument(
        "--scan-layers", action="store_true", help="tpu-compile: the blocks as one lax.scan (backend_bench's flag)"
    )
    parser.add_argument(
        "--compile-optimizer",
        action="store_true",
        help="tpu-compile: the AdamW step compiled too (backend_bench's flag)",
    )
    parser.add_argument(
        "--fused-optimizer",
        action="store_true",
        help="AdamW(fused=True): the update per parameter, then one program (backend_bench's flag)",
    )
    parser.add_argument("--steps", type=int, default=2, help="steps after the first (the steady step time)")
    parser.add_argument(
        "--xla-cache-only",
        action="store_true",
        help="turn off AOTAutograd's cache and the lowered-program store (JAX's persistent cache alone: the baseline)",
    )
    parser.add_argument(
        "--dynamo-cache",
        action="store_true",
        help="turn on Dynamo's cache (TPU_DYNAMO_CACHE=on): the second process skips Dynamo's trace",
    )
    parser.add_argument("--cache-dir", help="use (and keep) this folder, one sub-folder per mode; default: temporary")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-' for stdout)")
    parser.add_argument("--child", metavar="MODE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    results, failed = [], False
    for mode in args.modes.split(","):
        folder = os.path.join(args.cache_dir, mode) if args.cache_dir else tempfile.mkdtemp(prefix=f"tpu-cache-{mode}-")
        if args.cache_dir:
            shutil.rmtree(folder, ignore_errors=True)
        try:
            first = run_child(mode, args, folder)
            second = run_child(mode, args, folder)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            failed = True
            continue
        finally:
            if not args.cache_dir:
                shutil.rmtree(folder, ignore_errors=True)
        print_table(mode, first, second)
        ratio = second["first_step_s"] / first["first_step_s"]
        results.append(
            {"mode": mode, "first": first, "second": second, "ratio": ratio, "meets_target": ratio <= TARGET_RATIO}
        )
        failed |= first["loss"] != second["loss"]
    if args.json:
        write_json(
            args.json, {"model": args.model, "layers": args.layers, "target_ratio": TARGET_RATIO, "modes": results}
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
