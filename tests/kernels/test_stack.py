"""`kernels.stack`: arrays stacked by DMA equal `jnp.stack`, bit for bit, in Pallas's
interpreter here (compiled on a TPU with KERNELS_TEST_IMPL=pallas), and compile for a v5e
on this machine (libtpu's compiler, Mosaic included, 64-bit mode on as the device runs it)
with no XLA concatenate left: what `tpu_backend.compile.scan` relies on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import tpu
from kernels.stack import stack
from tests.kernels._util import KERNEL_IMPL

CASES = [
    ((4, 6), jnp.float32, 5),
    ((3, 5, 7), jnp.bfloat16, 3),  # neither tiled dim a multiple of a tile
    ((16, 128), jnp.int8, 4),
    ((5,), jnp.float32, 3),  # one dim: XLA stacks it (Mosaic slices untiled dims only)
]


@pytest.mark.parametrize("shape, dtype, n", CASES, ids=lambda c: str(c))
def test_stacked_equals_jnp_stack(shape, dtype, n):
    generator = np.random.default_rng(0)
    xs = [jnp.asarray(generator.uniform(-100, 100, shape)).astype(dtype) for _ in range(n)]
    got = stack(xs, impl=KERNEL_IMPL)
    assert got.shape == (n, *shape) and got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(jnp.stack(xs).astype(jnp.float32)))


@pytest.mark.skipif(
    tpu.libtpu_version() is None, reason="compiling for a TPU needs libtpu (tools/setup.sh installs it)"
)
def test_compiles_for_a_v5e_as_dmas():
    # a Llama layer's weight over 24 layers, and the odd cases above
    groups = [((1024, 2816), jnp.bfloat16, 24), *CASES]
    arrays = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, n in groups for _ in range(n)]

    def stacks(*flat):
        out, start = [], 0
        for _, _, n in groups:
            out.append(stack(flat[start : start + n], impl="pallas"))
            start += n
        return out

    with jax.enable_x64(True):
        text = tpu.compile_for("v5e", stacks, *arrays).as_text()
    assert "ConcatBitcast" not in text  # XLA's stack: asynchronous slices joined by these
    assert text.count('custom_call_target="tpu_custom_call"') == 4  # the arrays of two dims or more
