"""Fold the transpose of a BATCH_MATMUL's right operand into the op (adjY).

`q @ k.transpose(-2, -1)` lowers to a TRANSPOSE of k (its last two axes swapped) and a
BATCH_MATMUL. BATCH_MATMUL reads its right operand transposed with `adjY`, and XNNPACK
runs that form directly, so the TRANSPOSE (a copy of k, the whole KV cache in a decoder's
attention) is not needed.

Guarantees: only a TRANSPOSE with a constant permutation that swaps exactly the last two
axes, feeding input 1 of a float BATCH_MATMUL without adjY, is folded; the BATCH_MATMUL
then reads the TRANSPOSE's input with adjY set; the TRANSPOSE stays while something else
reads it (dead-code removal drops it otherwise). The left operand is left alone (XNNPACK
takes no adjX).
"""

from __future__ import annotations

from converter.ir import Graph

from ._graph import Uses, transpose_perm


def fold_transposes_into_batch_matmul(graph: Graph) -> Graph:
    """BATCH_MATMUL(a, TRANSPOSE(b, swap last two)) -> BATCH_MATMUL(a, b, adjY=True)."""
    uses = Uses(graph)
    for op in graph.ops:
        if op.opcode != "BATCH_MATMUL" or op.options.get("adjY", False) or len(op.inputs) < 2:
            continue
        if any(t is not None and t.quant is not None for t in [*op.inputs, *op.outputs]):
            continue
        transpose = uses.produced_by(op.inputs[1], "TRANSPOSE")
        perm = transpose_perm(transpose) if transpose is not None else None
        rank = len(perm) if perm is not None else 0
        if rank < 2 or perm != [*range(rank - 2), rank - 1, rank - 2]:
            continue
        op.inputs = [op.inputs[0], transpose.inputs[0], *op.inputs[2:]]
        op.options = {**op.options, "adjY": True}
    return graph
