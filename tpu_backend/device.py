"""`torch.tpu`: the device module PyTorch and libraries query, as `torch.cuda` for CUDA.

Registered with `torch._register_device_module("tpu", ...)` by `tpu_backend`. One device
(index 0): several chips are used through JAX sharding, not `tpu:1`.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import types

import jax
import torch

from tpu_backend import dispatch, streams
from tpu_backend import tensor as tpu_tensor
from tpu_backend.jax_interop import from_jax, to_jax  # noqa: F401  (part of the torch.tpu surface)
from tpu_backend.precision import Precision, precision  # noqa: F401
from tpu_backend.random import (  # noqa: F401  (part of the torch.tpu surface)
    get_rng_state,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    set_rng_state,
)
from tpu_backend.streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: F401

seed_all = seed
_peak_bytes = 0
# What `torch.utils.checkpoint` reads (as `torch.cuda._initialized`) before it stashes the
# device's random state for the recomputation: without it a checkpointed dropout drew new
# masks in the backward, and the gradients were those of other masks.
_initialized = True


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    index = device if isinstance(device, int) or device is None else torch.device(device).index
    if index not in (None, 0):
        raise RuntimeError(f"tpu device {device} does not exist: there is one device, tpu:0")


def get_device_name(device=None) -> str:
    return f"tpu ({jax.default_backend()} via JAX: {jax.devices()[0].device_kind})"


def synchronize(device=None) -> None:
    """Block until every pending computation on the device has finished; then an index out of
    range in an indexing op since the last wait raises its IndexError (`eager/bounds.py`)."""
    jax.block_until_ready(streams.newest_pending())
    tpu_tensor.before_host_read()


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensors (payloads that exist; `empty` ones count once written)."""
    global _peak_bytes
    allocated = tpu_tensor.live_bytes()
    _peak_bytes = max(_peak_bytes, allocated)
    return allocated


def max_memory_allocated(device=None) -> int:
    """Highest `memory_allocated()` seen at a query point since the last reset."""
    memory_allocated()
    return _peak_bytes


def reset_peak_memory_stats(device=None) -> None:
    global _peak_bytes
    _peak_bytes = tpu_tensor.live_bytes()


def memory_stats(device=None) -> dict:
    allocated = memory_allocated()
    return {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": _peak_bytes,
        "num_storages.all.current": tpu_tensor.payload_count(),
    }


def empty_cache() -> None:
    """Drop JAX's cached executables for ops no longer in use (payloads free with their tensors)."""
    jax.clear_caches()
    dispatch.clear_jit_cache()


def cache_stats() -> dict:
    """Jit cache counters of strict eager: requests, hits, misses, compile_seconds."""
    return dispatch.CACHE_STATS.as_dict()


def reset_cache_stats() -> None:
    dispatch.CACHE_STATS.reset()


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


class device:
    """`with torch.tpu.device(0):` (one device: a no-op that checks the index)."""

    def __init__(self, index):
        set_device(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class device_of(device):  # noqa: N801  (torch.cuda.device_of)
    """`with torch.tpu.device_of(tensor):` (one device: a no-op for tpu and other tensors)."""

    def __init__(self, obj):
        super().__init__(0)


@dataclasses.dataclass(frozen=True)
class TpuDeviceProperties:
    """What `torch.cuda.get_device_properties` users read: name and total_memory (bytes)."""

    name: str
    device_kind: str
    platform: str
    total_memory: int


def get_device_properties(device=None) -> TpuDeviceProperties:
    set_device(device)  # checks the index
    jax_device = jax.devices()[0]
    stats = jax_device.memory_stats() or {}
    # JAX's CPU runtime reports no memory limit: its memory is the host's
    total = stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return TpuDeviceProperties(get_device_name(), jax_device.device_kind, jax_device.platform, int(total))


class EagerMode(enum.Enum):
    """torch-tpu's eager mode names for this device's modes (`tpu_backend.set_eager_mode`)."""

    DEFER_AND_FUSE = "fused"  # record, run one program per step at a sync point
    DEFER_NEVER = "strict"  # run each op as it comes (default)
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"  # each op synchronously, results checked


def set_eager_mode(mode) -> None:
    """`torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)` or a mode name ("fused")."""
    dispatch.set_eager_mode(mode.value if isinstance(mode, EagerMode) else mode)


class _TpuModule(types.ModuleType):
    """`torch.tpu.eager_mode` is a property (read and set), as in torch-tpu."""

    @property
    def eager_mode(self) -> EagerMode:
        return EagerMode(dispatch.get_eager_mode())

    @eager_mode.setter
    def eager_mode(self, mode) -> None:
        set_eager_mode(mode)


sys.modules[__name__].__class__ = _TpuModule
