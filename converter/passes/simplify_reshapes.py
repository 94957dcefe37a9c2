"""Reshape clean-ups: fewer RESHAPE/TRANSPOSE ops around flattening and unit dims.

Guarantees (each rewrite keeps every value the same):
- a TRANSPOSE that only moves dimensions statically equal to 1 (the others keep their
  order) becomes a RESHAPE: no data moves (RESHAPE is free in most runtimes);
- RESHAPE(RESHAPE(x)) becomes one RESHAPE of x when the outer target is constant;
- a RESHAPE to its input's own static shape disappears;
- a reduction (MEAN, SUM, REDUCE_MAX ...) with keepDims whose only reader is a RESHAPE
  dropping exactly the reduced (size-1) dims becomes keepDims=False, and the RESHAPE
  goes (the usual global-pool-then-flatten of a classifier head).
"""

from __future__ import annotations

import numpy as np

from common.tflite_schema import REDUCTIONS
from converter.ir import Graph, Op

from ._graph import Uses, int32_const, shape_signature, static_dims, transpose_perm


def simplify_reshapes(graph: Graph) -> Graph:
    """Apply the rewrites above to a fixed point (in place); returns the graph."""
    _transposes_to_reshapes(graph)
    uses = Uses(graph)  # kept exact by the rewrites below
    while _merge_reshapes(uses) or _drop_kept_dims(uses):
        pass
    return graph


def _moves_only_unit_dims(op: Op) -> bool:
    perm = transpose_perm(op)
    x = op.inputs[0]
    if perm is None or len(perm) != x.rank:
        return False
    dims = static_dims(x)
    moved = [p for p in perm if dims[p] != 1]
    return moved == sorted(moved)


def _transposes_to_reshapes(graph: Graph) -> None:
    for op in graph.ops:
        if op.opcode != "TRANSPOSE" or op.inputs[0].is_const or not _moves_only_unit_dims(op):
            continue
        target = list(shape_signature(op.outputs[0]))
        if target.count(-1) > 1:
            continue  # RESHAPE can infer a single unknown dimension only
        op.opcode = "RESHAPE"
        op.inputs = [op.inputs[0], int32_const(target, "shape")]
        op.options = {"newShape": target}


def _reshape_target_is_constant(op: Op) -> bool:
    shape = op.inputs[1] if len(op.inputs) > 1 else None
    return (shape is not None and shape.is_const) or (shape is None and "newShape" in op.options)


def _merge_reshapes(uses: Uses) -> bool:
    for op in uses.graph.ops:
        if op.opcode != "RESHAPE" or not _reshape_target_is_constant(op):
            continue
        x, y = op.inputs[0], op.outputs[0]
        if x.shape_signature is None and y.shape_signature is None and x.shape == y.shape:
            if uses.bypass(op, x):
                return True
        inner = uses.produced_by(x, "RESHAPE")
        if inner is not None:
            uses.set_input(op, 0, inner.inputs[0])
            if not uses.consumers(x) and not uses.is_output(x):
                uses.remove(inner)
            return True
    return False


def _drop_kept_dims(uses: Uses) -> bool:
    for op in uses.graph.ops:
        if op.opcode not in REDUCTIONS or not op.options.get("keepDims") or not op.inputs[1].is_const:
            continue
        reshape = uses.only_consumer(op.outputs[0])
        if reshape is None or reshape.opcode != "RESHAPE":
            continue
        x, kept, flat = op.inputs[0], op.outputs[0], reshape.outputs[0]
        axes = sorted({int(a) % x.rank for a in np.asarray(op.inputs[1].data).reshape(-1)})
        dropped = [d for i, d in enumerate(shape_signature(kept)) if i not in axes]
        if dropped != list(shape_signature(flat)):
            continue
        op.options["keepDims"] = False
        uses.remove(reshape)
        uses.set_output(op, 0, flat)
        return True
    return False
