"""NCHW <-> NHWC helpers for layout-bound TFLite ops.

Lowerings keep PyTorch's layout everywhere; an op that TFLite only offers in NHWC
(CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, pools, RESIZE_*, DEPTH_TO_SPACE,
SPACE_TO_DEPTH) is wrapped as

    TRANSPOSE(x, NCHW_TO_NHWC) -> op -> TRANSPOSE(y, NHWC_TO_NCHW)

always with exactly these permutations, so the layout pass can recognise the pair and
cancel transposes between consecutive layout-bound ops.

1-D convolutions run as 2-D ones over a height of 1: (N, C, L) -> TRANSPOSE (N, L, C) ->
RESHAPE (N, 1, L, C), and back the same way.
"""

from __future__ import annotations

import torch

from converter.ir import Tensor
from converter.lowering import emit

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
NCL_TO_NLC = (0, 2, 1)  # its own inverse
NCDHW_TO_NDHWC = (0, 2, 3, 4, 1)  # 3-D ops (CONV_3D, the 3-D pools)
NDHWC_TO_NCDHW = (0, 4, 1, 2, 3)


def to_nhwc(ctx, x: Tensor) -> Tensor:
    """The NHWC view of an NCHW activation (a TRANSPOSE the layout pass may cancel)."""
    return emit.transpose(ctx, x, NCHW_TO_NHWC)


def to_nchw(ctx, y: Tensor) -> Tensor:
    """Back to PyTorch's layout after a layout-bound op."""
    return emit.transpose(ctx, y, NHWC_TO_NCHW)


def to_ndhwc(ctx, x: Tensor) -> Tensor:
    """The NDHWC view of an NCDHW activation (3-D ops)."""
    return emit.transpose(ctx, x, NCDHW_TO_NDHWC)


def to_ncdhw(ctx, y: Tensor) -> Tensor:
    """Back to PyTorch's NCDHW after a 3-D op."""
    return emit.transpose(ctx, y, NDHWC_TO_NCDHW)


def ncl_to_n1lc(ctx, x: Tensor) -> Tensor:
    """(N, C, L) -> (N, 1, L, C): a 1-D activation as the NHWC input of a 2-D op.

    TRANSPOSE first, RESHAPE second, so between two 1-D ops the layout pass sees
    TRANSPOSE(0,2,1) pairs it can cancel and RESHAPE pairs it can merge."""
    n, c, length = x.shape
    return emit.reshape(ctx, emit.transpose(ctx, x, NCL_TO_NLC), (n, 1, length, c))


def n1lc_to_ncl(ctx, y: Tensor) -> Tensor:
    """(N, 1, L, C) -> (N, C, L), the inverse of `ncl_to_n1lc`."""
    n, _, length, c = y.shape
    meta = ctx.meta  # the 1-D op's own (N, C, L) value: its dynamic sizes, if any
    dims = [meta.shape[0], meta.shape[2], meta.shape[1]] if getattr(meta, "ndim", 0) == 3 else []
    if any(isinstance(d, torch.SymInt) for d in dims):
        from converter.lowering import symbolic

        flat = emit.op(
            ctx,
            "RESHAPE",
            [y, symbolic.shape_tensor(ctx, dims)],
            shape=(n, length, c),
            dtype=y.dtype,
            signature=symbolic.signature_of(dims),
        )
    else:
        flat = emit.reshape(ctx, y, (n, length, c))
    return emit.transpose(ctx, flat, NCL_TO_NLC)


def same_padding(in_size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int, int]:
    """TFLite's SAME rule for one spatial axis: (output size, pad before, pad after)."""
    effective = (kernel - 1) * dilation + 1
    out = -(-in_size // stride)
    total = max((out - 1) * stride + effective - in_size, 0)
    return out, total // 2, total - total // 2


def torch_output_size(
    in_size: int, kernel: int, stride: int, pad: int, dilation: int = 1, ceil_mode: bool = False
) -> int:
    """PyTorch's output size of a conv/pool window along one axis."""
    effective = (kernel - 1) * dilation + 1
    span = in_size + 2 * pad - effective
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= in_size + pad:
        out -= 1  # PyTorch drops a last window that would start in the right padding
    return out


def is_same_padding(in_hw, kernel, stride, pad, dilation=(1, 1)) -> bool:
    """True when PyTorch's symmetric `pad` reads exactly the windows TFLite's SAME reads."""
    for i in range(2):
        out, before, _ = same_padding(in_hw[i], kernel[i], stride[i], dilation[i])
        if out != torch_output_size(in_hw[i], kernel[i], stride[i], pad[i], dilation[i]) or before != pad[i]:
            return False
    return True
