"""Pinned host memory: a no-op on the tpu device, so CUDA-style input pipelines run unchanged.

`DataLoader(pin_memory=True)` and `tensor.pin_memory()` ask the current accelerator for
a pinned-memory allocator, which a Python PrivateUse1 backend cannot register (PyTorch
raises "implement getPinnedMemoryAllocator"). JAX copies host arrays to the device itself,
so pinning buys nothing here: when the device in question is tpu, `pin_memory()` returns
the tensor unchanged and `is_pinned()` reports False.
"""

from __future__ import annotations

import torch

_original_pin_memory = torch.Tensor.pin_memory
_original_is_pinned = torch.Tensor.is_pinned


def _targets_tpu(device) -> bool:
    if device is None:
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "tpu"
    return torch.device(device).type == "tpu"


def pin_memory(self, device=None):
    if _targets_tpu(device):
        return self
    return _original_pin_memory(self) if device is None else _original_pin_memory(self, device)


def is_pinned(self, device=None):
    if _targets_tpu(device):
        return False
    return _original_is_pinned(self) if device is None else _original_is_pinned(self, device)


def install() -> None:
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
