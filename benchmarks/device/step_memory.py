"""What our compiled training step needs in a TPU's memory, program by program, beside the
figure `jax_llama_late_reads` gives for JAX's one-program step (XLA's `memory_analysis()`).

    python -m benchmarks.device.step_memory --model llama-374m --remat matmuls   # ~6 min on 2 cores

Runs one `backend_bench` step of mode `tpu-compile` here, on JAX's CPU backend (the
`--scan-layers --compile-optimizer` step; any `backend_bench` model flag passes through),
then compiles each program the step ran (`Program.export`, the kernel choices made on this
host) for one chip of `--chip` with libtpu and reads XLA's memory analysis. The step's peak is
the largest of its programs' footprints while the optimizer's moments stay resident:

- forward and backward: arguments + temporaries + outputs + the moments (AdamW keeps two
  tensors per parameter);
- the optimizer's program: arguments + temporaries (it updates its arguments in place).

On this host the kernels are off, so attention and cross-entropy are the XLA path's; on a
chip they take the Pallas kernels, which keep less for the backward.
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    from benchmarks.device import backend_bench
    from kernels.tpu import CHIPS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="v5e", choices=tuple(CHIPS), help="the TPU the programs are compiled for")
    args, rest = parser.parse_known_args(argv)
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
