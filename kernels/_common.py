"""Helpers every kernel module shares: backend detection, padding, iota, dot products.

A kernel runs in one of three implementations, named by a string that is part of every
cache key (so switching never reuses a stale compiled program):
- "pallas": compiled by Pallas (Mosaic on TPU, Triton/Mosaic GPU on NVIDIA GPUs);
- "interpret": the same kernel body run by Pallas's interpreter (any backend, CPU
  included: how the kernels are tested here);
- "reference": the plain JAX (XLA) implementation next to each kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

IMPLEMENTATIONS = ("pallas", "interpret", "reference")


def accelerator() -> str | None:
    """"tpu" or "gpu" when JAX's default backend is one, else None (CPU)."""
    backend = jax.default_backend()
    return backend if backend in ("tpu", "gpu") else None


def check_implementation(impl: str) -> str:
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"kernel implementation {impl!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if impl == "pallas" and accelerator() is None:
        raise ValueError(
            "compiled Pallas kernels need a TPU or GPU JAX backend (this one is "
            f"{jax.default_backend()!r}); use impl='interpret' or 'reference'"
        )
    return impl


def default_implementation() -> str:
    """Compiled Pallas on an accelerator, the interpreter on CPU."""
    return "pallas" if accelerator() else "interpret"


def tuning_backend(impl: str) -> str:
    """The key `kernels.tuning` looks block sizes up by."""
    return "interpret" if impl == "interpret" else (accelerator() or "interpret")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def pad_axis(x, axis: int, size: int, value=0):
    """`x` padded at the end of `axis` to `size` (no copy when it already has that size)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def iota(n: int, offset=0):
    """[offset, offset + n) as int32 (usable inside kernels)."""
    return lax.broadcasted_iota(jnp.int32, (n,), 0) + offset


def dot_nt(a, b):
    """a @ b.T, accumulated in float32."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_nn(a, b):
    """a @ b, accumulated in float32."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def dot_tn(a, b):
    """a.T @ b, accumulated in float32."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def compute_dtype(dtype):
    """Half-precision inputs are accumulated in float32."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
