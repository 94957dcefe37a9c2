"""Host-side views of tpu tensors: `torch.save` / `torch.load`, `copy.deepcopy`, printing,
and the storage methods PyTorch writes in Python (`UntypedStorage.cpu/clone/tolist`, so
`copy.deepcopy(storage)` too, and `TypedStorage.tolist`).

A tpu tensor's storage holds no host bytes (`data_ptr()` and `nbytes()` are 0), so PyTorch's
pickler would save empty storages, and its storage methods would copy nothing (or allocate
through an allocator the Python backend has not: a crash). We pickle tpu tensors as CPU
copies that PyTorch rebuilds on the device with
`torch._utils._rebuild_device_tensor_from_cpu_tensor`, which honours
`torch.load(..., map_location=...)` both ways (tpu -> cpu and cpu -> tpu). The cost: two
saved tensors that shared a storage are saved (and loaded) separately.

`print(tensor)` formats a CPU copy (as PyTorch does for XLA tensors): formatting runs
many small ops (masked_select, abs, max...) that are not worth a device round trip each.
"""

from __future__ import annotations

import torch

from tpu_backend import tensor as tpu_tensor

_original_reduce = torch.Tensor._reduce_ex_internal
_original_deepcopy = torch.Tensor.__deepcopy__
_original_tensor_str = torch._tensor_str._tensor_str
_original_storage_cpu = torch.UntypedStorage.cpu
_original_storage_clone = torch.UntypedStorage.clone
_original_storage_tolist = torch.UntypedStorage.tolist
_original_typed_tolist = torch.TypedStorage.tolist


def _reduce_ex_internal(self, proto):
    if not tpu_tensor.is_tpu(self):
        return _original_reduce(self, proto)
    if torch.serialization._serialization_tls.skip_data:
        raise RuntimeError("tpu tensors cannot be saved under torch.serialization.skip_data")
    return (
        torch._utils._rebuild_device_tensor_from_cpu_tensor,
        (tpu_tensor.to_cpu_tensor(self), self.dtype, str(self.device), self.requires_grad),
    )


def _deepcopy(self, memo):
    if not tpu_tensor.is_tpu(self) or type(self) is not torch.Tensor:
        return _original_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        copied = self.clone()
    copied.requires_grad_(self.requires_grad)
    memo[id(self)] = copied
    return copied


def _tensor_str(self, indent):
    if tpu_tensor.is_tpu(self):
        self = tpu_tensor.to_cpu_tensor(self)
    return _original_tensor_str(self, indent)


def _storage_cpu(self):
    if self.device.type != "tpu":
        return _original_storage_cpu(self)
    return torch.from_numpy(tpu_tensor.storage_to_bytes(self).copy()).untyped_storage()


def _storage_clone(self):
    if self.device.type != "tpu":
        return _original_storage_clone(self)
    return tpu_tensor.clone_storage(self)


def _storage_tolist(self):
    return self.cpu().tolist() if self.device.type == "tpu" else _original_storage_tolist(self)


def _typed_tolist(self):
    return self.cpu().tolist() if self.device.type == "tpu" else _original_typed_tolist(self)


def _tag_tpu_storage(storage):
    if storage.device.type == "tpu":
        return "tpu:0"
    return None


def _restore_on_tpu(storage, location: str):
    """A checkpoint storage mapped to tpu (`map_location="tpu"`): raw bytes -> tpu storage.

    PyTorch's own path allocates `UntypedStorage(n, device="tpu")`, which needs a C++
    allocator the Python backend does not have.
    """
    if not location.startswith("tpu"):
        return None
    if storage.device.type == "tpu":
        return storage
    host = torch.empty(0, dtype=torch.uint8).set_(storage.cpu() if storage.device.type != "cpu" else storage)
    return tpu_tensor.storage_from_bytes(host.numpy())


def install() -> None:
    # Ahead of PyTorch's generic PrivateUse1 entry (priority 23).
    torch.serialization.register_package(19, _tag_tpu_storage, _restore_on_tpu)
    torch._tensor_str._tensor_str = _tensor_str
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal
    torch.Tensor.__deepcopy__ = _deepcopy
    torch.UntypedStorage.cpu = _storage_cpu
    torch.UntypedStorage.clone = _storage_clone  # `copy.copy` / `copy.deepcopy` of a storage call it
    torch.UntypedStorage.tolist = _storage_tolist
    torch.TypedStorage.tolist = _typed_tolist
