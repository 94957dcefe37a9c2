"""Dead-code removal and no-op clean-up.

Guarantees:
- every remaining op has an output that is a graph output or read by a remaining op,
  or has side effects (`SIDE_EFFECT_OPS`, e.g. variable assignment);
- RESHAPEs to the same static shape, CASTs to the same dtype and identity TRANSPOSEs
  are removed (their readers read the input), unless that would make a graph input or
  a constant a graph output; so is a SELECT/SELECT_V2 whose constant condition picks
  one operand everywhere (e.g. attention's guard for fully masked rows once the mask
  folded to a constant) when that operand already has the output's shape;
- unreferenced constants disappear with the ops that read them (the writer only writes
  tensors reachable from the graph).
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, Op

from ._graph import SIDE_EFFECT_OPS, Uses


def remove_dead_code(graph: Graph) -> Graph:
    """Drop no-op and unused ops (in place); returns the graph."""
    uses = None  # built at the first no-op (most calls find none)
    for op in list(graph.ops):
        if _is_noop(op):
            replacement = op.inputs[0]
        elif op.opcode in ("SELECT", "SELECT_V2") and (chosen := _constant_choice(op)) is not None:
            replacement = chosen
        else:
            continue
        uses = uses or Uses(graph)
        uses.bypass(op, replacement)
    live = {t.id for t in graph.outputs}
    kept = []
    for op in reversed(graph.ops):
        if op.opcode in SIDE_EFFECT_OPS or any(t.id in live for t in op.outputs):
            kept.append(op)
            live.update(t.id for t in op.inputs if t is not None)
    graph.ops = kept[::-1]
    return graph


def _is_noop(op: Op) -> bool:
    if not op.inputs or op.inputs[0] is None or len(op.outputs) != 1:
        return False
    x, y = op.inputs[0], op.outputs[0]
    same = x.shape == y.shape and x.dtype == y.dtype and x.shape_signature == y.shape_signature and _same_quant(x, y)
    if not same:
        return False
    if op.opcode == "CAST":
        return True
    if op.opcode == "RESHAPE":
        return x.shape_signature is None or list(x.shape_signature).count(-1) <= 1
    if op.opcode == "TRANSPOSE":
        perm = op.inputs[1] if len(op.inputs) > 1 else None
        return perm is not None and perm.is_const and list(np.asarray(perm.data).reshape(-1)) == list(range(x.rank))
    return False


def _constant_choice(op: Op):
    """The operand a SELECT with an all-true / all-false constant condition returns, if
    it has the output's shape, dtype and signature; else None."""
    condition, out = op.inputs[0], op.outputs[0]
    if condition is None or not condition.is_const or len(op.inputs) != 3 or condition.data.size == 0:
        return None
    if condition.data.all():
        chosen = op.inputs[1]
    elif not condition.data.any():
        chosen = op.inputs[2]
    else:
        return None
    same = (
        chosen.shape == out.shape
        and chosen.dtype == out.dtype
        and chosen.shape_signature == out.shape_signature
        and _same_quant(chosen, out)
    )
    return chosen if same else None


def _same_quant(a, b) -> bool:
    if a.quant is None or b.quant is None:
        return a.quant is None and b.quant is None
    return (
        np.array_equal(a.quant.scale, b.quant.scale)
        and np.array_equal(a.quant.zero_point, b.quant.zero_point)
        and a.quant.axis == b.quant.axis
    )
