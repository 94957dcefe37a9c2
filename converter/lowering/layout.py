"""NCHW <-> NHWC helpers for layout-bound TFLite ops.

Lowerings keep PyTorch's layout everywhere; an op that TFLite only offers in NHWC
(CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, pools, RESIZE_*, DEPTH_TO_SPACE,
SPACE_TO_DEPTH) is wrapped as

    TRANSPOSE(x, NCHW_TO_NHWC) -> op -> TRANSPOSE(y, NHWC_TO_NCHW)

always with exactly these permutations, so the layout pass can recognise the pair and
cancel transposes between consecutive layout-bound ops.

1-D ops (conv1d, pool1d) are lifted to 2-D first: (N, C, L) -> (N, C, 1, L).
"""

from __future__ import annotations

from typing import Sequence

from converter.ir import Tensor
from converter.lowering import emit

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def nhwc_shape(nchw: Sequence[int]) -> tuple[int, ...]:
    n, c, h, w = nchw
    return (n, h, w, c)


def nchw_shape(nhwc: Sequence[int]) -> tuple[int, ...]:
    n, h, w, c = nhwc
    return (n, c, h, w)


def to_nhwc(ctx, x: Tensor) -> Tensor:
    """The NHWC view of an NCHW activation (a TRANSPOSE the layout pass may cancel)."""
    return emit.transpose(ctx, x, NCHW_TO_NHWC)


def to_nchw(ctx, y: Tensor) -> Tensor:
    """Back to PyTorch's layout after a layout-bound op."""
    return emit.transpose(ctx, y, NHWC_TO_NCHW)


def lift_1d(ctx, x: Tensor) -> Tensor:
    """(N, C, L) -> (N, C, 1, L) so a 2-D op can run a 1-D one."""
    n, c, length = x.shape
    return emit.reshape(ctx, x, (n, c, 1, length))


def drop_1d(ctx, y: Tensor) -> Tensor:
    """(N, C, 1, L) -> (N, C, L), the inverse of `lift_1d`."""
    n, c, _, length = y.shape
    return emit.reshape(ctx, y, (n, c, length))


def same_padding(in_size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int, int]:
    """TFLite's SAME rule for one spatial axis: (output size, pad before, pad after)."""
    effective = (kernel - 1) * dilation + 1
    out = -(-in_size // stride)
    total = max((out - 1) * stride + effective - in_size, 0)
    return out, total // 2, total - total // 2


def torch_output_size(in_size: int, kernel: int, stride: int, pad: int, dilation: int = 1,
                      ceil_mode: bool = False) -> int:
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
