"""How long the TPU compiler takes for the fused AdamW update: runtime hyperparameters shared by
every tensor's update against one copy per tensor (separate program arguments).

    python -m benchmarks.device.optimizer_compile_bench                  # the 374M Llama's 219 tensors
    python -m benchmarks.device.optimizer_compile_bench --tensors 60 --chip v5e

Compiled on this host for a TPU (`kernels.tpu.compile_for`, libtpu; no chip needed), with the
device's own lowering (`tpu_backend.ops.optimizers._adam`, bfloat16 parameters and moments,
float32 step counts, 64-bit mode on as the device runs), every output the runtime's program
has (parameters and both moments). `shared`: lr, the betas, weight decay and eps one runtime
scalar each, as strict mode passes them (a schedule must not recompile); `per-tensor`: the
same values passed once per tensor (each tensor's update from its own arguments).

What it showed (docs/tpu.md, "first step"): with the parameters alone as outputs, per-tensor
scalars compiled 4-10x faster (11.9 s against 2.5 s); with every output, as here, they
compiled slower (2026-12-06, a loaded host: 15.5 s shared, 44.6 s per tensor), and on the
chip the real first step took ~50 s either way. Strict mode passes them shared.
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


def shared_update(params, grads, avgs, sqs, steps, lr, beta1, beta2, weight_decay, eps):
    """The device's AdamW lowering over every tensor, as strict mode runs it."""
    from tpu_backend.ops.optimizers import _adam

    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps)
    params, _, avgs, sqs, _ = _adam(params, grads, avgs, sqs, [], steps, **hyper, **FLAGS)
    return params, avgs, sqs


def per_tensor_update(params, grads, avgs, sqs, steps, *hyper):
    """The same update, each tensor's from its own copy of each hyperparameter."""
    out = ([], [], [])
    for i in range(len(params)):
        one = shared_update([params[i]], [grads[i]], [avgs[i]], [sqs[i]], [steps[i]], *(h[i] for h in hyper))
        for column, values in zip(out, one):
            column += values
    return out


def compile_seconds(chip: str, count: int, per_tensor: bool) -> float:
    from kernels.tpu import compile_for

    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in LlamaLM(LLAMA_374M).parameters()][:count]
    tensors = [jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in shapes]
    steps = [jax.ShapeDtypeStruct((), jnp.float32) for _ in shapes]
    scalar = jax.ShapeDtypeStruct((), jnp.float64)
    hyper = [[scalar] * len(shapes) if per_tensor else scalar for _ in range(5)]
    start = time.perf_counter()
    compile_for(
        chip, per_tensor_update if per_tensor else shared_update, tensors, tensors, tensors, tensors, steps, *hyper
    )
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=219, help="the first N of the 374M Llama's 219 tensors")
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--json", help="also write the figures as JSON to this file ('-': stdout)")
    opts = parser.parse_args(argv)
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
