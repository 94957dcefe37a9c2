"""Hugging Face transformers (and safetensors) on the "tpu" device.

What works without anything from us: `model.to("tpu")` and training, `generate`, and
`AutoModel.from_pretrained(local_dir, device_map="tpu")` (through accelerate).

What needs us: `save_pretrained` finds tied weights with
`transformers.pytorch_utils.id_tensor_storage`, which keys a tensor by its storage's
address. A tpu storage holds no host bytes (`data_ptr()` is 0 for every tensor), so
every weight looked tied to every other and saving failed. We key tpu tensors by the
storage's identity instead (the key our payload table uses: two tensors alias exactly
when they share a storage). safetensors itself skips zero-byte storages in its alias
check and copies non-CPU tensors to the host, so it needs nothing. PEFT's adapter
`save_pretrained` keeps its own copy of the function (`peft.utils.other`): every adapter
looked aliased there and was cloned on the device before saving; it gets the same key.
"""

from __future__ import annotations

import functools

import torch

from tpu_backend.integrations import when_imported

DEVICE_TYPE = "tpu"
# Modules holding their own reference to `id_tensor_storage` (`from ... import`).
_USERS_OF_ID_TENSOR_STORAGE = (
    "transformers.pytorch_utils",
    "transformers.modeling_utils",
    "peft.utils.other",
    "peft.utils",
    "peft.peft_model",
)


def _is_tpu(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE


def storage_identity(tensor: torch.Tensor) -> int:
    """A unique id of the tensor's storage for its lifetime (shared by views and ties)."""
    return tensor.untyped_storage()._cdata


def _patch_id_tensor_storage(module) -> None:
    original = getattr(module, "id_tensor_storage", None)
    if original is None or getattr(original, "_tpu_aware", False):
        return

    @functools.wraps(original)
    def id_tensor_storage(tensor):
        if _is_tpu(tensor):
            return tensor.device, storage_identity(tensor), tensor.nbytes
        return original(tensor)

    id_tensor_storage._tpu_aware = True
    module.id_tensor_storage = id_tensor_storage


def install() -> None:
    for module_name in _USERS_OF_ID_TENSOR_STORAGE:
        when_imported(module_name, _patch_id_tensor_storage)
