"""Stacking equal arrays along a new leading axis as one DMA per array (a Pallas kernel).

`tpu_backend.compile.scan` runs a model's repeated layers as one `lax.scan`, so every
program it builds stacks the layers' weights (and the backward the saved inputs) into
(layers, ...) arrays. XLA's TPU compiler splits each `jnp.stack` into many asynchronous
slices ("ConcatBitcast" custom calls) that it schedules with the rest of the program:
compiled for a v5e, the 9 stacks of a 374M Llama layer's weights over 24 layers took
6.6 s, as long as that whole Llama step stacked the JAX way (weights kept stacked). The
same 9 stacks as DMAs compile in 0.5 s (`python -m kernels.stack` measures both).

The kernel copies each array from HBM into its row of the output in HBM (no VMEM
blocks): N copies started together, then waited for. Mosaic slices a memory reference
only along untiled dims, and a TPU tiles an array's last two, so arrays of fewer than two
dims are stacked by XLA (`reference`), as are calls under a device mesh (XLA cannot
partition a Mosaic call) and anything off a TPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import tpu
from kernels._common import check_implementation, default_implementation, kernel_program


def stack_reference(xs):
    return jnp.stack(xs)


def stack(xs, *, impl: str | None = None):
    """`jnp.stack(xs)` (equal shapes and dtypes), as DMAs where Mosaic can slice the output."""
    xs = list(xs)
    impl = check_implementation(impl or default_implementation())
    first = xs[0]
    if impl == "reference" or first.ndim < 2 or any(x.shape != first.shape or x.dtype != first.dtype for x in xs):
        return stack_reference(xs)
    return _stack_by_dma(*xs, config=impl == "interpret")


@kernel_program
def _stack_by_dma(*xs, config: bool):
    """`config`: run in Pallas's interpreter."""
    n, first = len(xs), xs[0]
    pltpu = tpu.pallas_tpu()

    def kernel(*refs):
        sources, out, semaphores = refs[:n], refs[n], refs[n + 1]
        copies = [pltpu.make_async_copy(sources[k], out.at[k], semaphores.at[k]) for k in range(n)]
        for copy in copies:
            copy.start()
        for copy in copies:
            copy.wait()

    anywhere = pl.BlockSpec(memory_space=pl.ANY)  # the arrays stay where they are (HBM)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n, *first.shape), first.dtype),
        in_specs=[anywhere] * n,
        out_specs=anywhere,
        scratch_shapes=[pltpu.SemaphoreType.DMA((n,))],
        interpret=config,
    )(*xs)


def _compile_seconds(layers: int = 24) -> None:
    """The stacks of one 374M Llama layer's weights over `layers` layers, compiled for a
    v5e on this machine: XLA's stack against the DMAs."""
    import time

    shapes = [(1024, 1024)] * 4 + [(1024, 2816)] * 2 + [(2816, 1024)]
    weights = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for _ in range(layers) for s in shapes]

    def stacks(*flat, impl):
        return [stack(flat[i :: len(shapes)], impl=impl) for i in range(len(shapes))]

    for impl in ("reference", "pallas"):
        start = time.perf_counter()
        tpu.compile_for("v5e", functools.partial(stacks, impl=impl), *weights)
        print(f"{impl:>9}: {len(shapes)} stacks of {layers} compiled for v5e in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    _compile_seconds()
