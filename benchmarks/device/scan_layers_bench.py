"""First-step (compile) time and step time of a Llama training step, layers unrolled vs
`scan_layers` (one `lax.scan` over the stacked blocks), under `torch.compile(backend="tpu")`.

    python -m benchmarks.device.scan_layers_bench                             # 4, 8, 16 layers, small Llama, CPU
    python -m benchmarks.device.scan_layers_bench --layers 8 --remat          # blocks checkpointed
    python -m benchmarks.device.scan_layers_bench --layers 8 --compile-for v5e  # + the programs compiled for a v5e

Each configuration runs in its own process (after an untimed two-layer warm-up there, so
that one-time costs such as building the decomposition table count for neither), with a
fresh compilation cache folder (no disk hits). A step is forward, backward and AdamW
(strict eager) on one fixed batch. Reported per configuration: the first step's wall
time (Dynamo + AOTAutograd + our lowering + XLA compile + the run), the seconds the
model's programs spent tracing to StableHLO and compiling (`compile_stats`), the median
of the following steps, the first loss (scan and unrolled must agree), and with
`--compile-for CHIP` the seconds the chip's compiler took for the model's programs
(`kernels.tpu.compile_for`: libtpu on this host, no TPU needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import module_command, repo_env


def _config(args, layers: int):
    import torch

    from benchmarks.models import LlamaConfig

    return LlamaConfig(
        vocab=args.vocab,
        context=args.context,
        width=args.width,
        heads=args.heads,
        layers=layers,
        ffn=args.ffn,
        checkpoint="full" if args.remat else "none",
        dtype=getattr(torch, args.dtype),
    )


def _step_function(config, scan: bool, batch: int):
    import torch

    from benchmarks.models import LlamaLM, make_optimizer, sequence_loss
    from tpu_backend.compile import scan_layers

    torch.manual_seed(0)
    model = LlamaLM(config).to("tpu")
    if scan:
        scan_layers(model.blocks)
    compiled = torch.compile(model, backend="tpu")
    optimizer = make_optimizer("adamw", model.parameters())
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab, (batch, config.context + 1), generator=generator)
    inputs, target = tokens[:, :-1].to("tpu"), tokens[:, 1:].to("tpu")

    def step() -> float:
        optimizer.zero_grad()
        loss = sequence_loss(compiled(inputs), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def _chip_compile_seconds(chip: str, names) -> dict[str, float]:
    """The programs `names` compiled again for `chip`."""
    import jax

    from kernels import tpu
    from tpu_backend.compile import programs
    from tpu_backend.compile.program import _abstract

    seconds = {}
    for program in programs():
        if program.name not in names:
            continue
        for matmul_precision, sig in list(program._executables):
            args = [_abstract(item) for item in sig]
            on_arrays, _ = program._array_function(args)
            arrays = [a for a in args if isinstance(a, jax.ShapeDtypeStruct)]
            start = time.perf_counter()
            with jax.default_matmul_precision(matmul_precision):
                tpu.compile_for(chip, on_arrays, *arrays)
            seconds[program.name] = seconds.get(program.name, 0.0) + time.perf_counter() - start
    return seconds


def measure(args, layers: int, scan: bool) -> dict:
    """One configuration, in this process."""
    import torch._dynamo

    import tpu_backend  # noqa: F401  (registers the device)
    import tpu_backend.compile as tpu_compile

    tpu_compile.set_cache_dir(tempfile.mkdtemp(prefix="scan_bench_xla_"))
    warm = argparse.Namespace(**{**vars(args), "width": 32, "ffn": 64, "heads": 4, "context": 16, "vocab": 64})
    _step_function(_config(warm, 2), scan, 2)()  # one-time costs (decomposition table, imports)
    torch._dynamo.reset()
    tpu_compile.compile_stats().reset()
    step = _step_function(_config(args, layers), scan, args.batch)
    start = time.perf_counter()
    loss = step()
    first = time.perf_counter() - start
    stats = tpu_compile.compile_stats()
    names = [name for name in stats.programs if name.startswith("torch_compile_")]
    model_programs = [stats.programs[name] for name in names]
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    result = {
        "layers": layers,
        "scan": scan,
        "first_step_s": first,
        "trace_s": sum(p.trace_seconds for p in model_programs),
        "compile_s": sum(p.compile_seconds for p in model_programs),
        "step_s": statistics.median(times) if times else float("nan"),
        "loss": loss,
    }
    if args.compile_for:
        per_program = _chip_compile_seconds(args.compile_for, names)
        result["chip_compile_s"] = sum(per_program.values())
        result["chip_compile_per_program_s"] = per_program
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="4,8,16", help="comma-separated layer counts")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=704)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--remat", action="store_true", help="each block under torch.utils.checkpoint")
    parser.add_argument("--compile-for", metavar="CHIP", help="also compile the programs for CHIP (e.g. v5e)")
    parser.add_argument("--modes", default="unrolled,scan")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "LAYERS,scan|unrolled": measure in this process
    args = parser.parse_args(argv)
    if args.one:
        layers, mode = args.one.split(",")
        print(json.dumps(measure(args, int(layers), mode == "scan")))
        return 0
    rows = []
    passthrough = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in vars(args).items()
        if name in ("width", "ffn", "heads", "context", "vocab", "batch", "steps", "dtype")
        or (name == "compile_for" and value)
    ] + (["--remat"] if args.remat else [])
    for layers in (int(n) for n in args.layers.split(",")):
        for mode in args.modes.split(","):
            command = module_command(__spec__.name, *passthrough, "--one", f"{layers},{mode}")
            done = subprocess.run(command, capture_output=True, text=True, env=repo_env())
            if done.returncode:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    chip = ["chip compile s"] if args.compile_for else []
    header = ["layers", "mode", "first step s", "trace s", "XLA compile s", *chip, "step ms", "loss"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        cells = [
            row["layers"],
            "scan" if row["scan"] else "unrolled",
            f"{row['first_step_s']:.2f}",
            f"{row['trace_s']:.2f}",
            f"{row['compile_s'] - row['trace_s']:.2f}",
            *([f"{row['chip_compile_s']:.2f}"] if args.compile_for else []),
            f"{1000 * row['step_s']:.1f}",
            f"{row['loss']:.6f}",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
