"""Tensors <-> JAX arrays at the boundary of compiled programs.

tpu tensors hand over their device payload (no copy); CPU tensors are copied both ways,
so a compiled program never aliases memory PyTorch may later write.
"""

from __future__ import annotations

import jax
import numpy as np
import torch

from tpu_backend import tensor as device_tensor
from tpu_backend.ops.registry import torch_dtype

BACKEND_NAME = "tpu"


def tensor_to_jax(t: torch.Tensor) -> jax.Array:
    """The JAX value of a tpu tensor (its payload) or of a CPU tensor (a copy)."""
    if t.device.type == BACKEND_NAME:
        return device_tensor.concrete(device_tensor.read(t))  # fused eager: a compiled graph is a sync point
    if t.device.type == "cpu":
        return device_tensor.cpu_to_jax(t)  # a copy, never aliasing torch-owned memory
    raise ValueError(
        f"torch.compile(backend='tpu') got a tensor on {t.device}; move inputs and the model to 'tpu' (or 'cpu')"
    )


def jax_to_tensor(array: jax.Array, device: torch.device) -> torch.Tensor:
    """A tensor on `device` (tpu: wraps the array; cpu: copies it to host memory)."""
    if device.type == BACKEND_NAME:
        return device_tensor.wrap(array)
    host = np.array(jax.device_get(array))  # a writable copy: the tensor may be mutated
    return device_tensor.numpy_to_torch(host, torch_dtype(array.dtype))


__all__ = ["jax_to_tensor", "tensor_to_jax"]
