"""Shared helpers for the kernel tests: random inputs, JAX <-> torch, error metric.

Tolerances (max |a - b| / max(max |b|, 1e-6), per output):
- float32: 2e-5 against the JAX reference and against PyTorch CPU (only the order of
  floating-point sums differs). On a TPU 1e-4, interpreted or compiled: the chip's exp,
  log and rsqrt agree with a CPU's to 4-5 digits (interpreted attention's dq was 6.6e-5
  from the reference on a v5e); compiled kernels with matrix products (attention) 2e-2,
  as bfloat16: a float32 product at the chip's default precision is one bfloat16 pass
  on the MXU (about 3 digits, seen on a v5e);
- bfloat16 inputs: 2e-2 (the kernels and the reference both accumulate in float32, but
  outputs and gradients are rounded to bfloat16, about 3 significant digits).

The kernels run in Pallas's interpreter (any backend) unless `KERNELS_TEST_IMPL` names
the compiled implementation: "pallas" on a TPU, "triton" on a CUDA GPU (the Triton
kernels compiled, the TPU-only kernels still interpreted). `benchmarks/kernels/accelerator_check.py`
sets it.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tests import chip

_REQUESTED_IMPL = os.environ.get("KERNELS_TEST_IMPL", "interpret")
KERNEL_IMPL = "interpret" if _REQUESTED_IMPL == "triton" else _REQUESTED_IMPL  # kernels.flash_attention & co
TRITON_INTERPRET = _REQUESTED_IMPL != "triton"  # kernels.flash_attention_triton
COMPILED = KERNEL_IMPL == "pallas"  # compiled Mosaic kernels: only on a TPU
TOLERANCE = {
    jnp.float32: 1e-4 if COMPILED else chip.tolerance("transcendentals", cpu=2e-5, tpu=1e-4),
    jnp.bfloat16: 2e-2,
}


def attention_block(block: int | None) -> int | None:
    """A test's attention block: as asked in the interpreter (small blocks exercise the
    tiling cheaply); compiled for a TPU at least 128 rows, a multiple of 128 (smaller
    ones break the TPU layout rule: the (1, block_q) logsumexp rows are lane-dense)."""
    if block is None or not COMPILED:
        return block
    return max(128, -(-block // 128) * 128)


def tolerance(dtype, *, matmuls: bool = False) -> float:
    """The tolerance for outputs of `dtype`; `matmuls`: the kernel multiplies matrices."""
    if matmuls and COMPILED:
        return TOLERANCE[jnp.bfloat16]
    return TOLERANCE[jnp.dtype(dtype).type]


def normal(seed: int, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def to_torch(x, requires_grad: bool = False) -> torch.Tensor:
    """A CPU tensor equal to JAX array `x` (bfloat16 kept)."""
    t = torch.from_numpy(np.array(x.astype(jnp.float32))).to(getattr(torch, jnp.dtype(x.dtype).name))
    return t.requires_grad_(requires_grad)


def relative_error(actual, expected) -> float:
    a = (
        np.asarray(jnp.asarray(actual, jnp.float32))
        if not isinstance(actual, torch.Tensor)
        else actual.detach().float().numpy()
    )
    e = (
        np.asarray(jnp.asarray(expected, jnp.float32))
        if not isinstance(expected, torch.Tensor)
        else expected.detach().float().numpy()
    )
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    assert np.isfinite(a).all(), "non-finite values in the kernel's result"
    return float(np.max(np.abs(a - e)) / max(float(np.max(np.abs(e))), 1e-6)) if a.size else 0.0


def assert_close(actual, expected, tol: float, what: str) -> None:
    error = relative_error(actual, expected)
    assert error <= tol, f"{what}: relative error {error:.3g} > {tol:g}"
