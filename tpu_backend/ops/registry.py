"""The ONE ATen -> JAX lowering table, shared by every execution mode.

Strict eager, debug eager, fused eager and `torch.compile(backend="tpu")` all look ops
up here; parity between modes is structural.

A lowering is a plain function of JAX values, registered with
`@lowers(aten.op.overload, ...)`:
- tensor arguments arrive as `jax.Array`s (lists of tensors as lists of arrays);
  everything else (ints, floats, bools, `torch.dtype`, `torch.memory_format`, None)
  arrives as is; use `jax_dtype()` for dtypes;
- it returns a `jax.Array`, or a tuple of them for multi-output ops, with the shape and
  dtype that ATen's meta function gives;
- it must be traceable by `jax.jit` with the non-tensor arguments static (no Python
  control flow on array values);
- ops that draw random numbers are registered with `needs_rng=True` and receive a
  `key=` keyword argument holding a `jax.random` key.

Register the functional overload only: in-place (`add_`) and `.out` variants are
derived by the dispatcher, which computes the functional result and writes it back.
View ops (view, as_strided, transpose, slice...) are not in this table: the device
handles them as storage views (see `tpu_backend/tensor.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp
import numpy as np
import torch


@dataclass(frozen=True)
class Lowering:
    fn: Callable
    needs_rng: bool = False


JAX_LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}


def lowers(*targets: torch._ops.OpOverload, needs_rng: bool = False) -> Callable:
    """Register the decorated function as the JAX lowering of each ATen overload."""

    def register(fn: Callable) -> Callable:
        for target in targets:
            if target in JAX_LOWERINGS:
                raise ValueError(f"{target} is lowered twice: {JAX_LOWERINGS[target].fn.__name__} and {fn.__name__}")
            JAX_LOWERINGS[target] = Lowering(fn, needs_rng)
        return fn

    return register


_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}


def jax_dtype(dtype: torch.dtype | None):
    """The JAX dtype for a torch dtype (None stays None)."""
    if dtype is None:
        return None
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the tpu device") from None


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype for a JAX/numpy dtype."""
    return _JAX_TO_TORCH[np.dtype(dtype)]
