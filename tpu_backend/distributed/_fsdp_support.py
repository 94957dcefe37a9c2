"""What FSDP2 (`torch.distributed.fsdp.fully_shard`) asks of a device beyond its ops.

Streams and events for `torch.tpu`, as much as FSDP2 needs, when the device module has
none. FSDP2 overlaps communication with compute through `device_handle.Stream()`,
`current_stream()`, `stream(s)` and `Event`. On this device every computation is
ordered already: JAX runs one device's programs in issue order and the "tpu" process
group's collectives finish before they return. One stream then suffices, and every
stream operation here is an ordering that already holds. `install()` adds these only
where `torch.tpu` lacks them (a fuller stream API in `tpu_backend/device.py` wins).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import torch

from tpu_backend import tensor as tpu_tensor


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.recorded = False

    def record(self, stream=None) -> Event:
        self.recorded = True
        return self

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        jax.effects_barrier()

    def wait(self, stream=None) -> None:
        pass


class Stream:
    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        return (event or Event()).record(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        jax.effects_barrier()


_DEFAULT = Stream()


def current_stream(device=None) -> Stream:
    return _DEFAULT


def default_stream(device=None) -> Stream:
    return _DEFAULT


@contextlib.contextmanager
def stream(s):
    yield s


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


def install(module) -> None:
    for name, value in {
        "Stream": Stream,
        "Event": Event,
        "current_stream": current_stream,
        "default_stream": default_stream,
        "stream": stream,
    }.items():
        if not hasattr(module, name):
            setattr(module, name, value)
