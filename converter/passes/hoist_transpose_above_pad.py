"""TRANSPOSE(PAD(x)) -> PAD(TRANSPOSE(x)): pad in the layout the next op reads.

A CNN whose stem convolution pads in a way SAME cannot express (stride 2, `padding=1`
on an even input: MobileNet, EfficientNet) keeps an explicit PAD; lowering emits it in
PyTorch's NCHW layout, before the input's NCHW -> NHWC TRANSPOSE. Transposing first and
padding the NHWC tensor is the same computation with a smaller transpose (the unpadded
tensor) and a pad along the outer axes of the layout the convolution reads: MobileNetV3
1.05-1.08x the anchor's latency with the NCHW pad, 0.99x with it moved.

Guarantees: only a constant-padding PAD/PADV2 (not MIRROR_PAD) whose output is read by
that one TRANSPOSE (a constant permutation) alone and is no graph output; the paddings
are permuted with the transpose, so the result is the same tensor.
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, Op, Tensor

from ._graph import Uses, const, fresh_name, transpose_perm


def hoist_transpose_above_pad(graph: Graph) -> Graph:
    """Swap PAD -> TRANSPOSE pairs to TRANSPOSE -> PAD (in place); returns the graph."""
    uses = None  # built at the first candidate
    for i, pad in enumerate(graph.ops):
        if pad.opcode not in ("PAD", "PADV2") or not pad.inputs[1].is_const or pad.inputs[0].is_dynamic:
            continue
        uses = uses or Uses(graph)
        transpose = uses.only_consumer(pad.outputs[0])
        perm = transpose_perm(transpose) if transpose is not None and transpose.opcode == "TRANSPOSE" else None
        if perm is None or transpose.inputs[0] is not pad.outputs[0]:
            continue
        x = pad.inputs[0]
        moved = Tensor(fresh_name(x.name + "_transposed"), tuple(x.shape[p] for p in perm), x.dtype, quant=x.quant)
        paddings = np.asarray(pad.inputs[1].data)[perm]
        new_transpose = Op("TRANSPOSE", [x, transpose.inputs[1]], [moved], dict(transpose.options), transpose.source)
        new_pad = Op(pad.opcode, [moved, const(paddings, "paddings"), *pad.inputs[2:]], list(transpose.outputs),
                     dict(pad.options), pad.source)  # fmt: skip
        graph.ops[i] = new_transpose
        graph.ops[graph.ops.index(transpose)] = new_pad
    return graph
