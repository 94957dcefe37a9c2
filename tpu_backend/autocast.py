"""bf16 autocast on the tpu device: `with torch.autocast("tpu", dtype=torch.bfloat16):`.

PyTorch's autocast key for a Python backend is `AutocastPrivateUse1`. With only a
fallthrough on it autocast silently does nothing, so we also register per-op kernels:
the matmul/conv/linear family runs in the autocast dtype (as on CUDA), and the ops
that need range or precision (softmax, norms, losses) run in float32. The device's
default autocast dtype is bfloat16 (PyTorch's default for a new device is float16).
"""

from __future__ import annotations

import torch

from tpu_backend.dispatch import register_kernel

aten = torch.ops.aten
_AUTOCAST_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER_PRECISION_OPS = (
    aten.mm.default,
    aten.bmm.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.addbmm.default,
    aten.matmul.default,
    aten.linear.default,
    aten.mv.default,
    aten.addmv.default,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    aten.conv_transpose1d.default,
    aten.conv_transpose2d.input,
    aten.conv_transpose3d.input,
    aten.convolution.default,
    aten._convolution.default,
    aten.prelu.default,
    aten.scaled_dot_product_attention.default,
)

FLOAT32_OPS = (
    aten.softmax.int,
    aten.log_softmax.int,
    aten.layer_norm.default,
    aten.group_norm.default,
    aten.cross_entropy_loss.default,
    aten.nll_loss.default,
    aten.mse_loss.default,
    aten.binary_cross_entropy_with_logits.default,
    aten.exp.default,
    aten.log.default,
    aten.pow.Tensor_Scalar,
    aten.sum.default,
    aten.sum.dim_IntList,
    aten.cumsum.default,
    aten.norm.Scalar,
)


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type == "tpu" and value.dtype != dtype:
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _autocast_kernel(op, dtype_of):
    def kernel(*args, **kwargs):
        dtype = dtype_of()
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEY):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


_fallthrough_lib = None


def register() -> None:
    """Install the autocast fallthrough, per-op kernels, and bf16 as default dtype."""
    global _fallthrough_lib
    if _fallthrough_lib is None:
        _fallthrough_lib = torch.library.Library("_", "IMPL")
        _fallthrough_lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for op in LOWER_PRECISION_OPS:
        register_kernel(op, _autocast_kernel(op, lambda: torch.get_autocast_dtype("tpu")), "AutocastPrivateUse1")
    for op in FLOAT32_OPS:
        register_kernel(op, _autocast_kernel(op, lambda: torch.float32), "AutocastPrivateUse1")
    torch.set_autocast_dtype("tpu", torch.bfloat16)
