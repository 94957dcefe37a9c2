"""The decomposition table handed to `ExportedProgram.run_decompositions`.

Start from PyTorch's core-ATen decompositions and keep, undecomposed, every op that maps
1:1 (or nearly) onto a TFLite builtin: decomposing those would only make the lowered
graph longer and slower. Every op in KEEP needs a lowering (converter/lowering/<family>.py).
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# Ops with a direct TFLite lowering: never decompose these.
KEEP = [
    aten.gelu.default,
    aten.hardswish.default,
    aten.hardsigmoid.default,
    aten.silu.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.prelu.default,
    aten.softplus.default,
    aten.mish.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.linear.default,
    aten.matmul.default,
    aten.pixel_shuffle.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
    aten.native_layer_norm.default,
    aten.native_group_norm.default,
    aten.reflection_pad2d.default,
    aten.replication_pad2d.default,
    aten._pad_circular.default,  # else: empty + slice_scatter copies; we GATHER instead
    aten.pixel_unshuffle.default,  # SPACE_TO_DEPTH
    aten._upsample_nearest_exact2d.vec,  # RESIZE_NEAREST_NEIGHBOR with half-pixel centers
    aten.reflection_pad1d.default,
    aten.replication_pad1d.default,
    aten.roll.default,
    aten.flip.default,
    aten.var.correction,
    aten.std.correction,
    aten.adaptive_avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten.avg_pool2d.default,
    aten.clamp.default,
    aten.hardtanh.default,
    aten.embedding.default,
    aten.lstm.input,  # recurrent.py: one input projection for all steps, not per-step matmuls
    aten.gru.input,
    aten.scaled_dot_product_attention.default,  # attention.py: no per-row softmax guards, no k transpose
]


def decomposition_table() -> dict:
    """A fresh copy of the table (callers may edit it)."""
    return dict(_materialized_table())


@functools.cache
def _materialized_table() -> dict:
    # `default_decompositions()` is a lazy table that materialises every composite op on
    # each use (about 1 s per conversion); a plain dict built once does the same work once.
    table = torch.export.default_decompositions()
    for op in KEEP:
        table.pop(op, None)
    return dict(table.items())

