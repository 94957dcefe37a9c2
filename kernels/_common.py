"""Helpers every kernel module shares: backend detection, padding, iota, dot products.

A kernel runs in one of three implementations, named by a string that is part of every
cache key (so switching never reuses a stale compiled program):
- "pallas": compiled by Pallas's Mosaic TPU backend (on a TPU, or for a named chip
  inside `kernels.tpu.lowering_for`, e.g. to export for TPU from a CPU machine). The
  kernels tile keys and vocabularies over sequential ("arbitrary") grid axes with VMEM
  scratch accumulators, a TPU pipeline that GPU Pallas backends do not offer: on a GPU
  the kernels run as "reference" or "interpret";
- "interpret": the same kernel body run by Pallas's interpreter (any backend, CPU
  included: how the kernels are tested here);
- "reference": the plain JAX (XLA) implementation next to each kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernels import tpu

IMPLEMENTATIONS = ("pallas", "interpret", "reference")


def accelerator() -> str | None:
    """ "tpu" when the kernels compile for a TPU (JAX's backend is one, or inside
    `kernels.tpu.lowering_for`; not inside `kernels.tpu.lowering_for_host`), else None."""
    if tpu.targets_host():
        return None
    if tpu.target_chip() is not None or jax.default_backend() == "tpu":
        return "tpu"
    return None


def check_implementation(impl: str) -> str:
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"kernel implementation {impl!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if impl == "pallas" and accelerator() is None:
        raise ValueError(
            "compiled Pallas kernels need a TPU JAX backend or `kernels.tpu.lowering_for(chip)` "
            f"(this backend is {jax.default_backend()!r}); use impl='interpret' or 'reference'"
        )
    return impl


def default_implementation() -> str:
    """Compiled Pallas on a TPU, the interpreter elsewhere."""
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
    """[offset, offset + n) as an int32 vector (for the Triton kernels; a TPU kernel uses
    `positions`: Mosaic cannot lay out a boolean vector reshaped to 2-D)."""
    return lax.broadcasted_iota(jnp.int32, (n,), 0) + offset


def positions(shape, axis: int, offset=0):
    """A 2-D int32 array over a tile of `shape` holding each element's index along `axis`
    plus `offset`: compared with a bound, the tile's mask, built at its final 2-D layout."""
    return lax.broadcasted_iota(jnp.int32, tuple(shape), axis) + offset


def _int32(value):
    """Integer arrays as int32 (targets and lengths arrive as int64 from torch or in 64-bit mode)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.integer) and jnp.dtype(dtype).itemsize > 4:
        return value.astype(jnp.int32)
    return value


def kernel_program(fn):
    """`jax.jit(fn)` with `config` static, always traced in 32-bit mode, whatever the
    caller's `jax_enable_x64` (`import tpu_backend` turns it on process-wide).

    Why: in 64-bit mode the integer constants of a grid's index maps become i64, and
    Mosaic's compiler refuses the kernel ("failed to legalize operation 'func.return'
    ... (i32, i64)"); lowering alone does not notice. Every `pallas_call` of the package
    runs inside a function decorated with this, the backward ones included (`jax.grad`
    traces a custom_vjp's backward rule later, outside any forward-only context), so no
    kernel depends on the setting. 64-bit integer operands are cast to int32 first."""
    jitted = jax.jit(fn, static_argnames=("config",))

    @functools.wraps(fn)
    def in_32_bit_mode(*args, **kwargs):
        args = [_int32(a) for a in args]
        kwargs = {k: _int32(v) for k, v in kwargs.items()}
        with jax.enable_x64(False):
            return jitted(*args, **kwargs)

    return in_32_bit_mode


def _precision(a, b):
    """A kernel dot's precision. Half-precision operands: DEFAULT, always (their products
    are exact in the float32 accumulator, and Mosaic refuses `contract_precision<fp32>` on
    bf16 operands, "Bad lhs type", which `jax_default_matmul_precision="highest"` would
    ask for: the "tpu" device's default, following PyTorch's "highest"). float32
    operands: None, the caller's setting (DEFAULT: one bf16 pass; HIGHEST: float32)."""
    return None if a.dtype == jnp.float32 and b.dtype == jnp.float32 else lax.Precision.DEFAULT


def _dot(a, b, dimensions):
    return lax.dot_general(a, b, dimensions, precision=_precision(a, b), preferred_element_type=jnp.float32)


def dot_nt(a, b):
    """a @ b.T, accumulated in float32."""
    return _dot(a, b, (((1,), (1,)), ((), ())))


def dot_nn(a, b):
    """a @ b, accumulated in float32."""
    return _dot(a, b, (((1,), (0,)), ((), ())))


def pallas_options(impl: str, *semantics: str) -> dict:
    """`pallas_call` keywords for an implementation: the interpreter flag, or Mosaic's
    grid semantics ("parallel" axes may be split across cores, "arbitrary" ones run in order)."""
    if impl == "interpret":
        return {"interpret": True}
    return {"compiler_params": tpu.compiler_params(*semantics)}


def cost(flops: float, transcendentals: float, bytes_accessed: float):
    """A `pl.CostEstimate` (lets XLA schedule around the custom call)."""
    from jax.experimental import pallas as pl

    return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals), bytes_accessed=int(bytes_accessed))


def nbytes(*arrays) -> int:
    """Total bytes of arrays or ShapeDtypeStructs (None entries skipped)."""
    return sum(int(a.size) * jnp.dtype(a.dtype).itemsize for a in arrays if a is not None)


def dot_tn(a, b):
    """a.T @ b, accumulated in float32."""
    return _dot(a, b, (((0,), (0,)), ((), ())))


def compute_dtype(dtype):
    """Half-precision inputs are accumulated in float32."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
