"""Zero-copy interop between "tpu" tensors and JAX arrays (`torch.tpu.to_jax`/`from_jax`, DLPack).

A tpu tensor's data IS a JAX array (`tpu_backend.tensor`), so handing it over is free:
`to_jax(t)` returns the storage's array when `t` covers its storage, and otherwise the
view's values gathered on the device (the same program strict eager uses to read a
view; the values never visit the host). `from_jax(array)` wraps the array as a new
tensor's payload. JAX arrays are immutable, so sharing is safe both ways: a later
in-place op on the tensor gives its storage a new array and leaves the JAX value as it
was (as a functional update would), and nothing the JAX side does can change the tensor.

DLPack goes through JAX's exporter: `t.__dlpack__()` (what `jax.dlpack.from_dlpack`,
`np.from_dlpack` and `torch.from_dlpack` call) and `torch.utils.dlpack.to_dlpack(t)`
export the tensor's JAX array, so they work wherever JAX's DLPack does (CPU and GPU
backends; JAX's TPU arrays do not export DLPack, and the error says so).
`torch.from_dlpack(jax_array, device="tpu")` wraps the array without a copy.
"""

from __future__ import annotations

import jax
import torch

from tpu_backend import tensor as device_tensor

_original_dlpack = torch.Tensor.__dlpack__
_original_dlpack_device = torch.Tensor.__dlpack_device__
_original_to_dlpack = torch.utils.dlpack.to_dlpack
_original_from_dlpack = torch.utils.dlpack.from_dlpack


def to_jax(t: torch.Tensor) -> jax.Array:
    """The JAX array holding tpu tensor `t`'s values, shared with the tensor (no copy
    when `t` covers its storage; a device-side gather for other views). Autograd
    history is not carried over (as `t.detach()`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch.tpu.to_jax expects a torch.Tensor on 'tpu', got {type(t).__name__}")
    if not device_tensor.is_tpu(t):
        raise ValueError(
            f"torch.tpu.to_jax expects a tensor on 'tpu', got one on {t.device}; "
            "move it first with t.to('tpu') (or use jnp.asarray(t.numpy()) for a host copy)"
        )
    return device_tensor.concrete(device_tensor.read(t))


def from_jax(array: jax.Array) -> torch.Tensor:
    """A contiguous tpu tensor whose payload is `array` itself (no copy)."""
    if isinstance(array, jax.core.Tracer):
        raise TypeError(
            "torch.tpu.from_jax got a traced value (inside jax.jit/grad/vmap); "
            "call it on a concrete jax.Array outside the transformation"
        )
    if not isinstance(array, jax.Array):
        raise TypeError(f"torch.tpu.from_jax expects a jax.Array, got {type(array).__name__}")
    return device_tensor.wrap(array)


# --------------------------------------------------------------------------- DLPack


def _dlpack(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
    if not device_tensor.is_tpu(self):
        return _original_dlpack(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
    kwargs = {"stream": None if stream == -1 else stream}
    if max_version is not None:
        kwargs["max_version"] = max_version
    if dl_device is not None:
        kwargs["dl_device"] = dl_device
    if copy is not None:
        kwargs["copy"] = copy
    return to_jax(self).__dlpack__(**kwargs)


def _dlpack_device(self):
    if not device_tensor.is_tpu(self):
        return _original_dlpack_device(self)
    return to_jax(self).__dlpack_device__()


def to_dlpack(tensor: torch.Tensor):
    """`torch.utils.dlpack.to_dlpack`: a tpu tensor exports its JAX array's capsule."""
    if isinstance(tensor, torch.Tensor) and device_tensor.is_tpu(tensor):
        return _dlpack(tensor)
    return _original_to_dlpack(tensor)


def from_dlpack(ext_tensor, *, device=None, copy=None) -> torch.Tensor:
    """`torch.from_dlpack`: a JAX array asked for on "tpu" is wrapped, not copied."""
    if device is not None and torch.device(device).type == "tpu" and isinstance(ext_tensor, jax.Array):
        return from_jax(ext_tensor) if not copy else from_jax(ext_tensor.copy())
    return _original_from_dlpack(ext_tensor, device=device, copy=copy)


def install() -> None:
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
    torch.utils.dlpack.to_dlpack = to_dlpack
    torch.utils.dlpack.from_dlpack = from_dlpack
    torch.from_dlpack = from_dlpack


__all__ = ["from_dlpack", "from_jax", "to_dlpack", "to_jax"]
