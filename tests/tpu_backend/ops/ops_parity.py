"""Compare one ATen -> JAX lowering with PyTorch's own CPU kernel on the same inputs.

`check(op, *args, **kwargs)` runs `op` on CPU torch tensors, runs the registered
lowering under `jax.jit` (tensor arguments traced, everything else static, as the
device does) on the same values, and asserts equal shapes, equal dtypes and values
within the tolerance.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import tpu_backend.ops  # noqa: F401  (registers every lowering)
from kernels import tpu
from tests import chip
from tpu_backend import chip_limits
from tpu_backend.chip_limits import TpuChipLimitError
from tpu_backend.ops.registry import JAX_LOWERINGS, torch_dtype


def to_jax(value):
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16; go through float32
            return jnp.asarray(value.detach().float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(value.detach().numpy())
    return value


_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


JIT_BY_DEFAULT = os.environ.get("TPU_OPS_TEST_JIT", "1") == "1"


def run_lowering(op, *args, key=None, jit=None, **kwargs):
    """The lowering's result for torch inputs, as torch tensors (pytree preserved).

    Like the device's dispatcher, Python floats are first passed as traced scalars;
    a lowering that must branch on one is retried with floats static.
    """
    if jit is None:
        jit = JIT_BY_DEFAULT
    if not jit:
        return _run(op, args, kwargs, key, jit=False, dynamic_floats=False)
    try:
        return _run(op, args, kwargs, key, jit=True, dynamic_floats=True)
    except _TRACE_ERRORS:
        return _run(op, args, kwargs, key, jit=True, dynamic_floats=False)


def _run(op, args, kwargs, key, jit, dynamic_floats):
    lowering = JAX_LOWERINGS[op]
    leaves, spec = tree_flatten((args, kwargs))
    tensor_slots = [
        i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) or (dynamic_floats and type(leaf) is float)
    ]
    arrays = [to_jax(leaves[i]) for i in tensor_slots]

    def call(*traced):
        filled = list(leaves)
        for slot, array in zip(tensor_slots, traced):
            filled[slot] = array
        call_args, call_kwargs = tree_unflatten(filled, spec)
        if lowering.needs_rng:
            call_kwargs["key"] = key if key is not None else jax.random.key(0)
        return lowering.fn(*call_args, **call_kwargs)

    try:
        out = jax.jit(call)(*arrays) if jit else call(*arrays)
    except TpuChipLimitError as error:  # on a TPU: what the device runs on the host, run there too
        if error.limit.action != "host":
            raise
        host = [jax.device_put(a, chip_limits.host_device()) if isinstance(a, jax.Array) else a for a in arrays]
        with chip_limits.on_host():
            out = jax.jit(call)(*host) if jit else call(*host)
    return jax.tree_util.tree_map(to_torch, out)


def to_torch(array):
    if array.dtype == jnp.bfloat16:
        return torch.from_numpy(np.array(array.astype(jnp.float32))).bfloat16()
    return torch.from_numpy(np.array(array)).to(torch_dtype(array.dtype))


# The least bounds (rtol and atol) a lowering can meet on the platform, per dtype
# (tests/chip.py): on a TPU float32 transcendentals are other approximations (tanh: 8e-5
# relative error measured on a v5e) and float64 is emulated (exp: 1.6e-14); 0 on CPU.
FLOORS = {
    torch.float32: chip.tolerance("transcendentals", cpu=0.0, tpu=2e-4),
    torch.complex64: chip.tolerance("transcendentals", cpu=0.0, tpu=2e-4),
    torch.float64: chip.tolerance("float64", cpu=0.0, tpu=1e-13),
}


def assert_same(actual, expected, atol=1e-5, rtol=1e-5, what=""):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (
            f"{what}: {len(actual)} outputs, expected {len(expected)}"
        )
        for i, (a, e) in enumerate(zip(actual, expected)):
            if e is None or not isinstance(e, torch.Tensor):
                continue
            assert_same(a, e, atol, rtol, f"{what}[{i}]")
        return
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    floor = FLOORS.get(expected.dtype, 0.0)
    rtol, atol = max(rtol, floor), max(atol, floor)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def check(op, *args, atol=1e-5, rtol=1e-5, jit=None, **kwargs):
    """Assert the lowering of `op` matches `op` on CPU for these arguments."""
    expected = op(*args, **kwargs)
    actual = run_lowering(op, *args, jit=jit, **kwargs)
    assert_same(actual, expected, atol, rtol, str(op))
    return actual


def assert_lowers_for_tpu(op, *args, **kwargs):
    """The lowering of `op` for these arguments compiles for a TPU v5e with libtpu's whole
    compiler (lowering alone misses what the chip refuses); where libtpu is not installed,
    it is exported for a TPU only."""
    leaves, spec = tree_flatten((args, kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def call(*traced):
        filled = list(leaves)
        for slot, array in zip(slots, traced):
            filled[slot] = array
        call_args, call_kwargs = tree_unflatten(filled, spec)
        return JAX_LOWERINGS[op].fn(*call_args, **call_kwargs)

    specs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), to_jax(leaves[i].reshape(-1)[:0]).dtype) for i in slots]
    if tpu.libtpu_version() is None:
        jax.export.export(jax.jit(call), platforms=["tpu"])(*specs)
    else:
        tpu.compile_for("v5e", call, *specs)
