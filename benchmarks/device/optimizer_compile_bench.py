"""How long the TPU compiler takes for the fused AdamW update: runtime hyperparameters shared by
every tensor's update against one copy per tensor (separate program arguments).

    python -m benchmarks.device.optimizer_compile_bench                  # the 374M Llama's 219 tensors
    python -m benchmarks.device.optimizer_compile_bench --tensors 60 --chip v5e
    TPU_CACHE_DIR=off python -m benchmarks.device.optimizer_compile_bench --on-device   # on a TPU VM

Compiled on this host for a TPU (`kernels.tpu.compile_for`, libtpu; no chip needed), with the
device's own lowering (`tpu_backend.ops.optimizers._adam`, bfloat16 parameters and moments,
float32 step counts, 64-bit mode on as the device runs). `shared`: lr, the betas, weight
decay and eps one runtime scalar each (a schedule must not recompile); `per-tensor`: the same
values passed once per tensor, as strict mode now passes them (`Lowering.per_tensor_scalars`).
The compiler reuses one kernel for identical fusions, and fusions that read the same runtime
operand are not identical (docs/tpu.md, "first step").

`--on-device`: the same A/B through the device itself, `torch.optim.AdamW(fused=True)` in
strict mode over tensors of those shapes: the first `step()` (its program compiled for the
chip the device runs on; `TPU_CACHE_DIR=off`, or the second kind may load from disk) and the
median of the next steps, each kind twice in alternating order in one process.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch

from benchmarks.harness import console, table, write_json
from benchmarks.models import LLAMA_374M, LlamaLM

FLAGS = dict(amsgrad=False, maximize=False, decoupled=True)


def update(params, grads, avgs, sqs, steps, lr, beta1, beta2, weight_decay, eps):
    """The device's AdamW lowering; each hyperparameter one runtime scalar, or a tuple of one
    per tensor (as strict mode passes them: `Lowering.per_tensor_scalars`)."""
    from tpu_backend.ops.optimizers import _adam

    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps)
    return _adam(params, grads, avgs, sqs, [], steps, **hyper, **FLAGS)[0]


def compile_seconds(chip: str, count: int, per_tensor: bool) -> float:
    from kernels.tpu import compile_for

    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in LlamaLM(LLAMA_374M).parameters()][:count]
    tensors = [jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in shapes]
    steps = [jax.ShapeDtypeStruct((), jnp.float32) for _ in shapes]
    scalar = jax.ShapeDtypeStruct((), jnp.float64)
    hyper = [tuple([scalar] * len(shapes)) if per_tensor else scalar for _ in range(5)]
    start = time.perf_counter()
    compile_for(chip, update, tensors, tensors, tensors, tensors, steps, *hyper)
    return time.perf_counter() - start


def device_step_seconds(count: int, per_tensor: bool, steps: int = 3) -> dict:
    """The first fused AdamW step on the device (compiling its strict program) and the
    median of `steps` more, with the hyperparameters per tensor or shared."""
    import dataclasses
    import statistics

    import tpu_backend  # noqa: F401  (the "tpu" device)
    from tpu_backend.eager.runner import clear_jit_cache
    from tpu_backend.ops.registry import LOWERINGS

    ops = (torch.ops.aten._fused_adamw.default, torch.ops.aten._fused_adamw.tensor_lr)
    saved = {op: LOWERINGS[op] for op in ops}
    if not per_tensor:
        for op in ops:
            LOWERINGS[op] = dataclasses.replace(saved[op], per_tensor_scalars=())
    clear_jit_cache()
    try:
        with torch.device("meta"):
            shapes = [tuple(p.shape) for p in LlamaLM(LLAMA_374M).parameters()][:count]
        generator = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16, device="tpu")) for s in shapes]
        for p in params:
            p.grad = (torch.randn(p.shape, generator=generator) * 1e-3).to(torch.bfloat16).to("tpu")
        optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
        compiled_before = torch.tpu.cache_stats()["compile_seconds"]
        start = time.perf_counter()
        optimizer.step()
        torch.tpu.synchronize()
        first = time.perf_counter() - start
        compiled = torch.tpu.cache_stats()["compile_seconds"] - compiled_before
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            optimizer.step()
            torch.tpu.synchronize()
            times.append(time.perf_counter() - start)
        return dict(first_step_s=first, compile_s=compiled, step_ms=1e3 * statistics.median(times))
    finally:
        LOWERINGS.update(saved)
        clear_jit_cache()


def on_device(opts) -> dict:
    runs = {"shared": [], "per-tensor": []}
    for kind in ("per-tensor", "shared", "shared", "per-tensor"):
        runs[kind].append(device_step_seconds(opts.tensors, kind == "per-tensor"))
        console().print(kind, runs[kind][-1])
    rows = [
        (kind, " / ".join(f"{r['first_step_s']:.1f}" for r in results),
         " / ".join(f"{r['compile_s']:.1f}" for r in results), " / ".join(f"{r['step_ms']:.2f}" for r in results))
        for kind, results in runs.items()
    ]  # fmt: skip
    title = f"fused AdamW over {opts.tensors} tensors on the device (two runs each, alternating)"
    console().print(table(title, ("hyperparameters", "first step s", "of it compile s", "step ms"), rows))
    return {"tensors": opts.tensors, "on_device": runs}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=219, help="the first N of the 374M Llama's 219 tensors")
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--on-device", action="store_true", help="time AdamW(fused=True) steps on the device instead")
    parser.add_argument("--json", help="also write the figures as JSON to this file ('-': stdout)")
    opts = parser.parse_args(argv)
    if opts.on_device:
        result = on_device(opts)
        if opts.json:
            write_json(opts.json, result)
        return result
    jax.config.update("jax_enable_x64", True)
    seconds = {
        kind: compile_seconds(opts.chip, opts.tensors, kind == "per-tensor") for kind in ("shared", "per-tensor")
    }
    rows = [(kind, f"{s:.1f}") for kind, s in seconds.items()]
    rows.append(("shared / per-tensor", f"{seconds['shared'] / seconds['per-tensor']:.1f}x"))
    console().print(
        table(f"AdamW over {opts.tensors} tensors, compile s for {opts.chip}", ("hyperparameters", "s"), rows)
    )
    result = {"chip": opts.chip, "tensors": opts.tensors, "compile_s": seconds}
    if opts.json:
        write_json(opts.json, result)
    return result


if __name__ == "__main__":
    main()
