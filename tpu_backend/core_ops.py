"""Device kernels that are not pure functions of values: allocation, copies, views, resize.

These touch tensor metadata or the payload table directly, so they are not in the
ATen -> JAX table. View ops reuse PyTorch's Meta kernels (redispatch), which build a
new PrivateUse1 TensorImpl over the *same* storage: the view then reads and writes the
shared payload through `tensor.read` / `tensor.write`.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_backend import native
from tpu_backend import tensor as tpu_tensor
from tpu_backend.dispatch import check_device_index, execute, register_kernel
from tpu_backend.eager.registration import indices_to_device, register_behind_native
from tpu_backend.ops.registry import JAX_LOWERINGS
from tpu_backend.tensor import resize_

aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# Views whose kernels the compiled path (tpu_backend/native) provides in C++.
NATIVE_VIEW_OPS = (aten.view.default, aten.as_strided.default, aten._reshape_alias.default, aten.unfold.default)


def _default_dtype(dtype):
    return torch.get_default_dtype() if dtype is None else dtype


_check_device = check_device_index


_DENSE_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


def _strides_for(size, memory_format) -> tuple[int, ...]:
    """Strides of a `memory_format` tensor (channels_last...), as PyTorch lays it out."""
    return torch.empty(size, device="meta", memory_format=memory_format).stride()


def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    if memory_format not in _DENSE_FORMATS:
        return empty_strided(size, _strides_for(size, memory_format), dtype)
    return tpu_tensor.empty_tensor(tuple(size), _default_dtype(dtype))


def _storage_numel(size, stride, offset=0) -> int:
    if any(s == 0 for s in size):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    base = tpu_tensor.empty_tensor((_storage_numel(size, stride),), _default_dtype(dtype))
    return aten.as_strided.default.redispatch(_META, base, size, stride, 0)


def _meta_view(op):
    redispatch = op._handle.redispatch_boxed  # what `op.redispatch` calls, without its Python frame (per view)
    return lambda *args, **kwargs: redispatch(_META, *args, **kwargs)


def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False):
    """Copy between any mix of cpu and tpu tensors (broadcasting and casting like ATen)."""
    if tpu_tensor.is_tpu(dst):
        if tpu_tensor.is_tpu(src):
            value = tpu_tensor.read(src)
        else:
            value = tpu_tensor.cpu_to_jax_nonblocking(src) if non_blocking else tpu_tensor.cpu_to_jax(src)
        tpu_tensor.write(dst, value)
    else:
        dst.copy_(tpu_tensor.to_cpu_tensor(src))
    return dst


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False):
    return copy_(dst, src, non_blocking)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor):
    if tuple(dst.shape) != tuple(src.shape):
        resize_(dst, src.shape)
    return copy_(dst, src)


def as_strided_(t: torch.Tensor, size, stride, storage_offset=None):
    """In-place restride (`transpose_`, `unsqueeze_`...) through the Meta kernel of `set_`.

    (`as_strided_`'s own kernel checks bounds against the storage's byte size, which is 0
    for tpu storages; `set_`'s Meta kernel records the size instead.)
    """
    offset = t.storage_offset() if storage_offset is None else storage_offset
    aten.set_.source_Storage_storage_offset.redispatch(_META, t, t.untyped_storage(), offset, size, stride)
    return t


def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    """`x[idx] = v` arrives as `_index_put_impl_`: run the table's functional `index_put`."""
    _, indices = indices_to_device((self, indices))
    result = execute(aten.index_put.default, (self, indices, values, accumulate), {})
    tpu_tensor.write(self, result)
    return self


def set_source_tensor(t: torch.Tensor, source: torch.Tensor):
    """`t.set_(source)`: `t` becomes a view of `source`'s storage."""
    aten.set_.source_Storage_storage_offset.redispatch(
        _META, t, source.untyped_storage(), source.storage_offset(), source.shape, source.stride()
    )
    return t


def set_source_storage(t: torch.Tensor, source, storage_offset=0, size=None, stride=None):
    """`t.set_(storage, ...)`: how torch.load rebuilds tensors over a loaded storage."""
    if size is None:
        size = (source.nbytes() // t.element_size(),)
    if stride is None or len(stride) == 0:
        stride = torch._prims_common.make_contiguous_strides_for(size) if size else ()
    aten.set_.source_Storage_storage_offset.redispatch(_META, t, source, storage_offset, size, stride)
    return t


def local_scalar_dense(t: torch.Tensor):
    """`tensor.item()`: a device -> host sync."""
    value = tpu_tensor.read(t).item()
    tpu_tensor.before_host_read()
    return value


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`torch.equal`: same shape and same values (a Python bool, so a device -> host sync)."""
    if a.shape != b.shape:
        return False
    same = bool(jnp.array_equal(tpu_tensor.read(a), tpu_tensor.read(b)))
    tpu_tensor.before_host_read()
    return same


def register() -> None:
    register_kernel(aten.empty.memory_format, empty)
    register_kernel(aten.empty_strided.default, empty_strided)
    # tpu -> tpu copies of whole tensors in C++ (tpu_backend/native), the rest here behind it
    if native.install("copy_ kernel", "install_copy_kernel") is not None:
        register_behind_native(aten.copy_.default, copy_)
    else:
        register_kernel(aten.copy_.default, copy_)
    register_kernel(aten._copy_from.default, _copy_from)
    register_kernel(aten._copy_from_and_resize.default, _copy_from_and_resize)
    register_kernel(aten.resize_.default, resize_)
    register_kernel(aten.set_.source_Tensor, set_source_tensor)
    register_kernel(aten.as_strided_.default, as_strided_)
    register_kernel(aten.set_.source_Storage_storage_offset, set_source_storage)
    register_kernel(aten.set_.source_Storage, lambda t, source: set_source_storage(t, source))
    if aten.index_put.default in JAX_LOWERINGS:
        register_kernel(aten._index_put_impl_.default, index_put_impl_)
    register_kernel(aten._local_scalar_dense.default, local_scalar_dense)
    register_kernel(aten.equal.default, equal)
    register_kernel(aten._to_copy.default, to_copy)
    compiled = native.install("view kernels", "install_view_kernels")  # the same views, made in C++
    for view_op in (
        *(() if compiled is not None else NATIVE_VIEW_OPS),
        aten.view_as_real.default,  # a float view of complex storage: tensor.py re-types the bytes on access
        aten.view_as_complex.default,
    ):
        register_kernel(view_op, _meta_view(view_op))


def to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """`.to(device/dtype)` to or from the tpu device: the result lives where `device` says."""
    dtype = t.dtype if dtype is None else dtype
    if not tpu_tensor.is_tpu(t):  # host -> device
        _check_device(device)
        host = t.to(dtype)
        return tpu_tensor.wrap(tpu_tensor.cpu_to_jax_nonblocking(host) if non_blocking else tpu_tensor.cpu_to_jax(host))
    if device is not None and torch.device(device).type != "tpu":
        return tpu_tensor.to_cpu_tensor(t).to(device=device, dtype=dtype)
    _check_device(device)
    value = tpu_tensor.read(t)
    if memory_format not in _DENSE_FORMATS:
        result = empty_strided(t.shape, _strides_for(t.shape, memory_format), dtype)
        tpu_tensor.write(result, value)
        return result
    if dtype != t.dtype:
        return tpu_tensor.wrap(value.astype(tpu_tensor.jax_dtype(dtype)))
    # (a fused-mode placeholder is immutable and not yet an array: nothing to copy)
    return tpu_tensor.wrap(value if isinstance(value, tpu_tensor.LazyValue) else jnp.array(value, copy=True))
