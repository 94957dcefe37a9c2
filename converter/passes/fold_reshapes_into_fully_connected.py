"""Drop the flatten/unflatten RESHAPE pair around a FULLY_CONNECTED.

`x.view(-1, in) @ W + b` followed by `.view(*lead, out)` (transformers' GPT-2 `Conv1D`,
hand-written projections) lowers to RESHAPE -> FULLY_CONNECTED -> RESHAPE. FULLY_CONNECTED
with `keepNumDims=True` takes x's leading dimensions as they are, so the pair goes:

    RESHAPE(x: (*lead, in) -> (N, in)) -> FC -> RESHAPE((N, out) -> (*lead, out))
    becomes  FC(x, keepNumDims=True) -> (*lead, out)

Guarantees: only when N = prod(lead), the RESHAPE outputs are read by nothing else (and
are no graph outputs), shapes are static, and x has rank 3 or more (rank 2 needs no
rewrite). Values are unchanged (the same products, the same layout).
"""

from __future__ import annotations

import math

from converter.ir import Graph

from ._graph import Uses


def fold_reshapes_into_fully_connected(graph: Graph) -> Graph:
    """Remove flatten/unflatten RESHAPE pairs around FULLY_CONNECTED ops (in place)."""
    uses = None  # built at the first candidate
    for fc in list(graph.ops):
        if fc.opcode != "FULLY_CONNECTED" or fc.options.get("keepNumDims") or len(fc.outputs) != 1:
            continue
        uses = uses or Uses(graph)
        flatten = uses.produced_by(fc.inputs[0], "RESHAPE")
        unflatten = uses.only_consumer(fc.outputs[0])
        if flatten is None or unflatten is None or unflatten.opcode != "RESHAPE":
            continue
        x, flat, out = flatten.inputs[0], fc.inputs[0], unflatten.outputs[0]
        if uses.only_consumer(flat) is not fc or any(t.is_dynamic for t in (x, flat, out)):
            continue
        lead = x.shape[:-1]
        if (
            x.rank < 3
            or flat.rank != 2
            or flat.shape != (math.prod(lead), x.shape[-1])
            or out.shape != (*lead, fc.outputs[0].shape[-1])
        ):
            continue
        uses.remove(unflatten)
        uses.remove(flatten)
        uses.set_input(fc, 0, x)
        uses.set_output(fc, 0, out)
        fc.options = dict(fc.options, keepNumDims=True)
    return graph
