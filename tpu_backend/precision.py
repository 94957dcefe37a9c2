"""PyTorch's float32 matmul precision knob, honoured on the tpu device.

`torch.set_float32_matmul_precision("highest"|"high"|"medium")` decides the precision of
float32 matrix products and convolutions on "tpu", as it does for TF32 on CUDA:

| torch      | StableHLO precision_config | on a TPU                      |
| ---------- | -------------------------- | ----------------------------- |
| "highest"  | HIGHEST (PyTorch's default) | float32 (6 bf16 passes): agrees with CPU |
| "high"     | HIGH                       | 3 bf16 passes ("bf16_3x")     |
| "medium"   | DEFAULT                    | one bf16 pass                 |

The setting is carried by JAX's `jax_default_matmul_precision`, which every lowering
without an explicit `precision=` reads while it is traced (`dot_general`,
`conv_general_dilated`, also inside users' `jax_op` functions and Pallas kernels). JAX's
jit caches (strict eager's per-op functions) key on it already; `compile.Program`
(fused-eager and `torch.compile` programs) keys its executables on it too. So changing the
knob recompiles what runs next and never reuses a program lowered at another precision.

`torch.tpu.precision("high")` (a context manager) sets it for a block and restores it.
On JAX's CPU runtime every precision computes in float32; the difference is visible in
the lowered program (`precision = [HIGH, HIGH]`) and on a TPU.
"""

from __future__ import annotations

import contextlib

import jax
import torch

TORCH_TO_JAX = {"highest": "highest", "high": "high", "medium": "default"}
_original_set = torch.set_float32_matmul_precision


def _jax_setting(torch_precision: str) -> str:
    try:
        return TORCH_TO_JAX[torch_precision]
    except KeyError:
        raise ValueError(
            f"float32 matmul precision must be one of {sorted(TORCH_TO_JAX)}, got {torch_precision!r}"
        ) from None


def sync() -> str:
    """Make JAX's matmul precision follow torch's knob; returns the JAX setting in force.
    Cheap (one C call and a comparison): called where programs are looked up."""
    wanted = _jax_setting(torch.get_float32_matmul_precision())
    if jax.config.jax_default_matmul_precision != wanted:
        jax.config.update("jax_default_matmul_precision", wanted)
    return wanted


def set_float32_matmul_precision(precision: str) -> None:
    """`torch.set_float32_matmul_precision`, also applied to the tpu device at once."""
    _original_set(precision)
    sync()


set_float32_matmul_precision.__doc__ = (_original_set.__doc__ or "") + (
    "\n\n    On the tpu device: highest -> HIGHEST, high -> HIGH, medium -> DEFAULT "
    "(StableHLO precision of float32 matmuls and convolutions; see tpu_backend/precision.py)."
)


Precision = jax.lax.Precision  # torch.tpu.Precision.DEFAULT / HIGH / HIGHEST
_FROM_ENUM = {Precision.DEFAULT: "medium", Precision.HIGH: "high", Precision.HIGHEST: "highest"}


@contextlib.contextmanager
def precision(mode):
    """`with torch.tpu.precision("high"):` (or `torch.tpu.Precision.HIGH`): float32
    matmuls/convolutions at that precision inside the block; torch's knob is restored after."""
    mode = _FROM_ENUM.get(mode, mode)
    _jax_setting(mode)
    previous = torch.get_float32_matmul_precision()
    set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        set_float32_matmul_precision(previous)


def install() -> None:
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    sync()


__all__ = ["Precision", "precision", "set_float32_matmul_precision", "sync"]
