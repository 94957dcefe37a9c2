"""The one place that touches PyTorch's private backend-registration API.

PyTorch >= 2.10 can register a whole backend from Python on the PrivateUse1 dispatch
key (`torch.utils.backend_registration._setup_privateuseone_for_python_backend`), which
installs a Python device guard and PrivateUse1 hooks (without them autograd aborts with
"PyTorch is not linked with support for tpu devices"). The API is private and
experimental, so everything that depends on it is wrapped here and checked at import:
when a torch upgrade moves it, this module fails with one clear message instead of the
backend failing in odd places later.

On the compiled dispatch path (`tpu_backend/native`) the Python device guard is then
replaced by the same one-device guard in C++ (PyTorch queries it several times per op).
"""

from __future__ import annotations

import torch

DEVICE_NAME = "tpu"
SUPPORTED_TORCH = ((2, 10), (2, 14))  # [min, max] major.minor versions this was built against


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def check_torch_version() -> None:
    """Fail early, naming the versions, when torch lacks the private API we rely on."""
    version = _torch_version()
    low, high = SUPPORTED_TORCH
    missing = [
        name
        for name, owner in (
            ("_setup_privateuseone_for_python_backend", torch.utils.backend_registration),
            ("create_empty_tensor", getattr(torch._C, "_acc", None)),
        )
        if owner is None or not hasattr(owner, name)
    ]
    if version < low or missing:
        raise ImportError(
            f"tpu_backend needs torch {low[0]}.{low[1]}..{high[0]}.{high[1]} "
            f"(the Python PrivateUse1 backend API); found torch {torch.__version__}"
            + (f", which lacks {', '.join(missing)}" if missing else "")
            + ". Install a supported torch (see constraints.txt)."
        )
    if version > high:
        import warnings

        warnings.warn(
            f"tpu_backend was tested with torch up to {high[0]}.{high[1]}; torch {torch.__version__} "
            "may have changed the private backend API it uses.",
            stacklevel=3,
        )


def _hook_classes():
    """The hook and device-guard classes. They subclass private torch types, so they are
    defined only after `check_torch_version` has confirmed those exist."""

    class _TpuHooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, device_index) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    private_use1 = torch._C._autograd.DeviceType.PrivateUse1

    class _TpuDeviceGuard(torch._C._acc.DeviceGuard):
        """One device, index 0: multi-chip work goes through JAX sharding, not tpu:1."""

        def type_(self):  # called from C++ several times per op: no attribute lookups
            return private_use1

    return _TpuHooks, _TpuDeviceGuard


_registered = False


def register_backend(device_module) -> None:
    """Rename PrivateUse1 to "tpu" and install hooks, guard and `torch.tpu` (idempotent)."""
    global _registered
    if _registered:
        return
    check_torch_version()
    hooks, device_guard = _hook_classes()
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename=DEVICE_NAME,
        backend_module=device_module,
        hook=hooks(),
        device_guard=device_guard(),
    )
    from tpu_backend import native

    native.install("device guard", "install_device_guard")  # the same guard in C++: no Python call per query
    _registered = True


def new_device_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """A plain PrivateUse1 TensorImpl (contiguous, its own zero-byte storage)."""
    return torch._C._acc.create_empty_tensor(tuple(shape), dtype)


# `new_device_tensor` without the Python call around it, for the per-op hot path (the
# shape must be a tuple). Missing on an unsupported torch: `check_torch_version` says so.
create_device_tensor = getattr(getattr(torch._C, "_acc", None), "create_empty_tensor", new_device_tensor)
