"""Shapes of tpu tensors under fake tensors where PyTorch's meta kernel states a limit of
CUDA's kernel that the device does not have.

torch.compile, torch.export and AOTAutograd propagate shapes with fake tensors, which run
an op's meta kernel. A meta kernel that copies CUDA's input checks refuses, on every
device, what only CUDA cannot do; a rule registered here (`register_op_impl`, consulted
before the meta kernel) answers for tpu tensors and leaves every other device to the
meta kernel.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_impls import register_op_impl
from torch._subclasses.fake_tensor import in_kernel_invocation_manager

from tpu_backend._registration import DEVICE_NAME

aten = torch.ops.aten


@register_op_impl(aten._grouped_mm.default)
def _grouped_mm(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """transformers' MoE experts under torch.compile: the meta kernel wants bfloat16
    operands and 16-byte aligned strides (CUDA's grouped GEMM); the device's lowering
    (`ops/linalg.py`) takes any floating dtype and layout."""
    if mat_a.device.type != DEVICE_NAME:
        return NotImplemented
    if mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3):
        raise RuntimeError(f"aten._grouped_mm: operands must be 2D or 3D, got {mat_a.dim()}D and {mat_b.dim()}D")
    if bias is not None:
        raise RuntimeError("aten._grouped_mm: bias is not supported (nor by PyTorch's kernels); add it after")
    if (offs is None) != (mat_a.dim() == 3 and mat_b.dim() == 3):
        raise RuntimeError("aten._grouped_mm: offs is needed exactly when an operand is 2D")
    if offs is not None and (offs.dim() != 1 or offs.dtype != torch.int32):
        raise RuntimeError(f"aten._grouped_mm: offs must be a 1D int32 tensor, got {offs.dim()}D {offs.dtype}")
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif mat_a.dim() == 2:
        shape = (mat_a.shape[0], mat_b.shape[2])
    elif mat_b.dim() == 2:
        shape = (mat_a.shape[1], mat_b.shape[1])
    else:
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[2])
    with in_kernel_invocation_manager(fake_mode):
        out = torch.empty(shape, dtype=out_dtype or mat_a.dtype, device="meta")
    return fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, out, mat_a.device)
