"""Turn PAD -> CONV_2D/DEPTHWISE_CONV_2D(VALID) into one convolution with SAME padding.

PyTorch's `padding=1` on a 3x3 stride-1 convolution lowers to an explicit zero PAD and a
VALID convolution; TFLite's SAME padding computes exactly that when the padding equals
SAME's (total = max((ceil(in/stride)-1)*stride + (k-1)*dilation + 1 - in, 0), the smaller
half before). Strided convolutions often pad differently from SAME (PyTorch pads both
sides equally): those PADs stay.

Guarantees: folds only when the PAD is a constant zero padding of H and W alone on an
NHWC rank-4 input with static H and W, its output is read by that convolution alone,
and the padding equals what SAME computes for that convolution.
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, Op

from ._graph import Uses

CONVS = ("CONV_2D", "DEPTHWISE_CONV_2D")


def fold_pad_into_conv(graph: Graph) -> Graph:
    """Fold SAME-equivalent zero PADs into the following convolution (in place)."""
    uses = Uses(graph)
    for conv in graph.ops:
        if conv.opcode not in CONVS or conv.options.get("padding", "SAME") not in ("VALID", 1):
            continue
        pad = uses.producer.get(conv.inputs[0].id)
        if pad is None or pad.opcode not in ("PAD", "PADV2") or uses.only_consumer(pad.outputs[0]) is not conv:
            continue
        if _is_same_padding(pad, conv):
            conv.inputs[0] = pad.inputs[0]
            conv.options["padding"] = "SAME"
    # the PADs are now unread; remove_dead_code drops them
    live = {t.id for op in graph.ops for t in op.inputs if t is not None} | {t.id for t in graph.outputs}
    graph.ops = [op for op in graph.ops if op.opcode not in ("PAD", "PADV2") or any(t.id in live for t in op.outputs)]
    return graph


def _same_padding(size: int, stride: int, kernel: int, dilation: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _is_same_padding(pad: Op, conv: Op) -> bool:
    x, paddings = pad.inputs[0], pad.inputs[1]
    if (
        x.rank != 4
        or paddings is None
        or not paddings.is_const
        or (x.is_dynamic and any(s == -1 for s in x.shape_signature[1:3]))
    ):
        return False
    if pad.opcode == "PADV2" and len(pad.inputs) > 2 and pad.inputs[2] is not None:
        value = pad.inputs[2]
        if not value.is_const or np.any(np.asarray(value.data) != 0):
            return False
    if x.quant is not None or pad.outputs[0].quant is not None:
        return False  # zero is the zero point there, not 0.0: leave it to the quantizer
    p = np.asarray(paddings.data).reshape(-1, 2)
    if p.shape != (4, 2) or np.any(p[0] != 0) or np.any(p[3] != 0):
        return False
    filt = conv.inputs[1]
    o = conv.options
    for axis, k_axis, stride, dilation in (
        (1, 1, o.get("strideH", 1), o.get("dilationHFactor", 1)),
        (2, 2, o.get("strideW", 1), o.get("dilationWFactor", 1)),
    ):
        if tuple(p[axis]) != _same_padding(x.shape[axis], stride, filt.shape[k_axis], dilation):
            return False
    return True
