"""The decomposition table handed to `ExportedProgram.run_decompositions`.

Start from PyTorch's core-ATen decompositions and keep, undecomposed, every op that maps
1:1 (or nearly) onto a TFLite builtin: decomposing those would only make the lowered
graph longer and slower. Every op in KEEP needs a lowering (converter/lowering/<family>.py).
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def keep_ops_whole():
    """While active, a post-dispatch trace (`torch.export` to ATen IR in one pass) keeps
    KEEP's CompositeImplicitAutograd ops (linear, matmul, upsample_*, pixel_unshuffle,
    _pad_circular...) whole instead of inlining their composite kernels, exactly as
    `run_decompositions(decomposition_table())` does. Ops already in ATen IR need nothing.

    Uses torch.export's own (private) override, the one run_decompositions applies; if
    it is missing in a future torch, this is a no-op and KEEP ops arrive decomposed
    (still convertible, only longer graphs)."""
    try:
        from torch._export.utils import _special_op_to_preserve_cia
        from torch.export.exported_program import _override_composite_implicit_decomp
    except ImportError:
        yield
        return
    with _override_composite_implicit_decomp({op: _special_op_to_preserve_cia for op in _kept_composite_ops()}):
        yield


@functools.cache
def _kept_composite_ops() -> tuple:
    from torch._export.utils import _is_cia_op

    return tuple(op for op in KEEP if _is_cia_op(op))
