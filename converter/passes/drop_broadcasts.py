"""Drop a BROADCAST_TO whose reader broadcasts by itself.

`x / norm.expand_as(x)` (F.normalize, XCiT's cross-covariance attention) lowers to a
BROADCAST_TO feeding a DIV; the binary op broadcasts its operands anyway, so reading the
BROADCAST_TO's input instead gives the same values. Besides the copy, the op matters for
speed: XNNPACK does not take BROADCAST_TO, so each one splits the delegated graph in two
(XCiT: 1.3x the latency of the file without them).

Guarantees: a reader is rewired only when it is one of the broadcasting binary ops below
and its output shape stays what it was (the broadcast of its new operand shapes); static
shapes of rank <= 4 only (every binary kernel broadcasts up to rank 4); the BROADCAST_TO itself stays while something else reads it (dead-code
removal drops it otherwise).
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph

from ._graph import Uses

BROADCASTING = {
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "POW", "FLOOR_DIV",
    "FLOOR_MOD", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL",
    "LOGICAL_AND", "LOGICAL_OR",
}  # fmt: skip


def drop_broadcasts(graph: Graph) -> Graph:
    """Rewire broadcasting binary ops from a BROADCAST_TO's output to its input."""
    uses = None  # built at the first BROADCAST_TO
    for op in graph.ops:
        if op.opcode != "BROADCAST_TO":
            continue
        uses = uses or Uses(graph)
        if uses.is_output(op.outputs[0]):
            continue
        x, y = op.inputs[0], op.outputs[0]
        if x.quant is not None or x.is_dynamic or y.is_dynamic:
            continue
        for reader in uses.consumers(y):
            out = reader.outputs[0]
            if reader.opcode not in BROADCASTING or out.is_dynamic or out.rank > 4:
                continue
            inputs = [x if t is y else t for t in reader.inputs]
            if np.broadcast_shapes(*(t.shape for t in inputs)) == tuple(out.shape):
                reader.inputs = inputs
    return graph
