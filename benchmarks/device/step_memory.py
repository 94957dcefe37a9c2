"""What a training step needs in a TPU's memory, beside JAX's own step of the same model and
remat policy: both programs compiled for one chip by libtpu on this host (no chip needed),
XLA's `memory_analysis()` read the same way for both.

    python -m benchmarks.device.step_memory --model 374m --policies full,matmuls,none   # ~15 min on 2 cores
    python -m benchmarks.device.step_memory --step torch-compile --model llama-374m --remat matmuls

`--step train-step` (default): ours is `tpu_backend.TrainStep`'s program, the one the pod
planner compiles (`tpu_backend.aot.compile_step`, mesh dp=1, the Pallas kernels on): forward,
backward and AdamW in one program, parameters and moments donated, the repeated blocks
checkpointed per policy (full / matmuls / none). JAX's is `jax_llama_reference.py`'s step
(splash attention, `jax.checkpoint` per layer with its `nothing_saveable` / `dots` policy).
A program's footprint: arguments + outputs - aliased + temporaries + its code.

`--step torch-compile`: the step `torch.compile` runs (`backend_bench`'s `tpu-compile` step
with `--scan-layers --compile-optimizer`, run once here on JAX's CPU backend), program by
program: the forward and backward while AdamW's moments stay resident, then the optimizer's.
On this host its kernels are off (attention and cross-entropy take the XLA path).
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgramMemory:
    name: str
    arguments: int
    temporaries: int
    outputs: int

    @property
    def is_optimizer(self) -> bool:  # torch.compile(optimizer.step) is an inference graph
        return self.name.endswith("_inference")

    def footprint(self, moments: int) -> int:
        if self.is_optimizer:
            return self.arguments + self.temporaries
        return self.arguments + self.temporaries + self.outputs + moments


def step_peak(programs: list[ProgramMemory], parameter_bytes: int) -> int:
    """The largest footprint, AdamW's two moments per parameter held throughout."""
    moments = 2 * parameter_bytes
    return max(p.footprint(moments) for p in programs)


def program_memory(programs, chip: str) -> list[ProgramMemory]:
    """Every compiled signature of `programs` (`tpu_backend.compile.programs()`), compiled for one `chip`."""
    import jax

    sharding = jax.sharding.SingleDeviceSharding(one_chip(chip))
    found = []
    for program in programs:
        for exported in program.export(platforms=("tpu",), chip=chip):
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
            memory = jax.jit(exported.call).lower(*args).compile().memory_analysis()
            found.append(
                ProgramMemory(
                    program.name,
                    memory.argument_size_in_bytes,
                    memory.temp_size_in_bytes,
                    memory.output_size_in_bytes,
                )
            )
    return found


def one_chip(chip: str):
    """A compile-only device of `chip` (libtpu's compiler, no chip attached)."""
    from kernels.tpu import compile_only_devices

    return compile_only_devices(f"{chip}:1x1")[0]


# our policy names -> jax_llama_reference.py's
JAX_POLICIES = {"full": "full", "matmuls": "dots", "none": "none"}
BATCH = 4  # the sequences per step of `backend_bench --model llama-374m` and of the JAX reference's rows


def footprint(memory) -> int:
    """What the chip holds while a program runs (XLA's `memory_analysis()`)."""
    return (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.generated_code_size_in_bytes
    )


def train_step_bytes(config, policy: str, chip: str) -> int:
    """The footprint of `TrainStep`'s program for the `benchmarks.models` Llama `config`."""
    import torch

    import tpu_backend.aot as aot
    from benchmarks.models import LlamaLM, sequence_loss

    with torch.device("meta"):
        model = LlamaLM(config)
    tokens = ((BATCH, config.context), torch.long)
    report = aot.compile_step(
        model, [tokens], [tokens], sequence_loss, topology=f"{chip}:1x1", mesh="dp=1", kernels=True, remat=policy
    )
    return report.total_bytes


def jax_step_bytes(config, policy: str, chip: str) -> int:
    """The footprint of `jax_llama_reference.py`'s step of the same shape and policy."""
    import jax

    from benchmarks.device.jax_llama_late_reads import _reference

    ref = _reference()
    # as it runs on the chip by itself: the device turns 64-bit types and "highest" matmul precision on
    with jax.enable_x64(False), jax.default_matmul_precision("default"):
        return _jax_step_bytes(ref, config, policy, chip)


def _jax_step_bytes(ref, config, policy: str, chip: str) -> int:
    import jax
    import jax.numpy as jnp

    dims = (config.vocab, config.width, config.layers, config.heads, config.ffn)
    sharding = jax.sharding.SingleDeviceSharding(one_chip(chip))
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
    params = jax.eval_shape(lambda: ref.init(jax.random.PRNGKey(0), *dims, jnp.bfloat16))
    params = jax.tree.map(spec, params)
    scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding)
    tokens = jax.ShapeDtypeStruct((BATCH, config.context), jnp.int32, sharding=sharding)
    ref.prebuild("splash", config.heads, config.context)
    step = ref.make_step(*dims, "splash", JAX_POLICIES[policy])
    return footprint(step.lower(params, params, params, scalar, tokens, tokens).compile().memory_analysis())


def or_refusal(footprint_of) -> int | str:
    """`footprint_of()`, or what the compiler said when the program does not fit the chip."""
    from tpu_backend.aot.report import StepDoesNotFit, is_out_of_memory

    try:
        return footprint_of()
    except StepDoesNotFit as refused:
        return _refusal(refused.required_temp_bytes)
    except Exception as error:  # JAX's own program, refused by libtpu
        if not is_out_of_memory(error):
            raise
        found = re.search(r"HLO temporaries \(([\d.]+)G\)", str(error))
        return _refusal(float(found.group(1)) * 2**30 if found else None)


def _refusal(temporaries: float | None) -> str:
    return "does not fit" + (f" (temporaries {temporaries / 2**30:.2f} GiB)" if temporaries else "")


def compare_policies(model: str, policies: list[str], chip: str) -> list[tuple[str, int | str, int | str]]:
    """(policy, ours, JAX's) footprints, one policy after the other, with progress; a program
    the chip cannot hold is named so instead."""
    from rich.progress import Progress

    from benchmarks.models import LLAMA_374M, LLAMA_950M

    config = {"374m": LLAMA_374M, "950m": LLAMA_950M}[model]
    rows = []
    with Progress(transient=True) as progress:
        task = progress.add_task("compiling for the chip", total=2 * len(policies))
        for policy in policies:
            progress.update(task, description=f"ours, remat {policy}")
            ours = or_refusal(functools.partial(train_step_bytes, config, policy, chip))
            progress.advance(task)
            progress.update(task, description=f"JAX's, remat {JAX_POLICIES[policy]}")
            theirs = or_refusal(functools.partial(jax_step_bytes, config, policy, chip))
            progress.advance(task)
            rows.append((policy, ours, theirs))
    return rows


def main(argv=None) -> int:
    from kernels.tpu import CHIPS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="v5e", choices=tuple(CHIPS), help="the TPU the programs are compiled for")
    parser.add_argument("--step", default="train-step", choices=("train-step", "torch-compile"))
    parser.add_argument("--policies", default="full,matmuls,none", help="train-step: remat policies to compare")
    args, rest = parser.parse_known_args(argv)
    if args.step == "train-step":
        return main_train_step(args, rest)
    return main_torch_compile(args, rest)


def main_train_step(args, rest) -> int:
    from rich.console import Console
    from rich.table import Table

    from tpu_backend.aot.report import gib

    sizes = argparse.ArgumentParser(prog="step_memory --step train-step")
    sizes.add_argument("--model", default="374m", choices=("374m", "950m"), help="the Llama of versus_jax")
    model = sizes.parse_args(rest).model  # anything else in `rest` is refused here, by name
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in JAX_POLICIES]
    if unknown:
        raise SystemExit(f"--policies from {', '.join(JAX_POLICIES)} (got {', '.join(unknown)})")
    one_chip(args.chip)  # no libtpu: say so first
    table = Table(title=f"Llama {model}, batch {BATCH}, one {args.chip}: the step's program")
    for column in ("remat", "ours (TrainStep)", "JAX's step", "ours / JAX"):
        table.add_column(column, justify="right")
    for policy, ours, theirs in compare_policies(model, policies, args.chip):
        both = isinstance(ours, int) and isinstance(theirs, int)
        cells = [gib(x) if isinstance(x, int) else x for x in (ours, theirs)]
        table.add_row(f"{policy} / {JAX_POLICIES[policy]}", *cells, f"{ours / theirs:.2f}" if both else "-")
    Console().print(table)
    return 0


def main_torch_compile(args, rest) -> int:
    from benchmarks.device import backend_bench

    bench = backend_bench.parse_args([*rest, "--modes", "tpu-compile", "--scan-layers", "--compile-optimizer"])
    backend_bench.configure(bench)
    one_chip(args.chip)  # no libtpu: say so before the step runs
    import torch

    import tpu_backend  # noqa: F401  (registers the device)
    from tpu_backend.aot.report import gib
    from tpu_backend.compile import programs

    before = set(programs())
    step = backend_bench.make_step(bench.model, "tpu-compile")
    print(f"running one {bench.model} step on JAX's CPU backend ...", file=sys.stderr)
    step()
    with torch.device("meta"):
        parameters = backend_bench.model_case(bench.model).build().parameters()
        parameter_bytes = sum(p.numel() * p.element_size() for p in parameters)
    found = program_memory([p for p in programs() if p not in before], args.chip)
    print(f"{'program':32}{'arguments':>12}{'temporaries':>12}{'outputs':>12}{'footprint':>12}")
    moments = 2 * parameter_bytes  # AdamW's two per parameter
    for p in found:
        sizes = (p.arguments, p.temporaries, p.outputs, p.footprint(moments))
        print(f"{p.name:32}" + "".join(f"{gib(b):>12}" for b in sizes))
    peak = step_peak(found, parameter_bytes)
    print(f"step peak on one {args.chip}: {gib(peak)} (parameters {gib(parameter_bytes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
