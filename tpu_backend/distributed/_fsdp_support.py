"""What FSDP2 (`torch.distributed.fsdp.fully_shard`) asks of a device beyond its ops and
its streams (those are `torch.tpu.Stream`/`Event`, `tpu_backend/streams.py`).
"""

from __future__ import annotations

import functools

import torch

from tpu_backend import tensor as tpu_tensor

# --------------------------------------------------------------------- unsharded parameter storage
#
# FSDP2 frees an unsharded parameter after use with `untyped_storage().resize_(0)` and
# allocates it again with `resize_(nbytes)` before the all-gather writes it. Resizing a
# PrivateUse1 storage needs the C++ hook `resizePrivateUse1Bytes`, which torch's Python
# hooks cannot provide. A tpu storage holds no bytes (its data is a JAX array kept by
# `tpu_backend.tensor`), so allocating is nothing to do and freeing drops the array.


def _alloc_storage(original, tensor: torch.Tensor) -> None:
    if tpu_tensor.is_tpu(tensor):
        return  # the payload is (re)created by the all-gather's copy into it
    original(tensor)


def _free_storage(original, tensor: torch.Tensor) -> None:
    if tpu_tensor.is_tpu(tensor):
        payload = tpu_tensor.payload_if_tpu(tensor)
        if payload is not None:
            payload.array = None  # the memory goes back to JAX; reads before a write see zeros
        return
    original(tensor)


def patch_fsdp() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    if getattr(_fsdp_param.alloc_storage, "_tpu_aware", False):
        return
    alloc = functools.partial(_alloc_storage, _fsdp_param.alloc_storage)
    free = functools.partial(_free_storage, _fsdp_param.free_storage)
    alloc._tpu_aware = True
    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
    _fsdp_param.free_storage = free
