"""Compute int64 index tensors as int32 where that is exact.

PyTorch indexes with int64; LiteRT's GATHER/GATHER_ND take int32 indices natively, and
int64 is slow or missing on several targets (GPU delegates, LiteRT.js, microcontrollers).
An index into a tensor is below its axis size, so below 2**31: computing it as int32 is
exact. This pass narrows an int64 tensor when

- it is produced by ARG_MAX/ARG_MIN (outputType becomes INT32) or by a CAST from int32
  (the CAST is bypassed), and
- every reader uses it as an index: GATHER's or GATHER_ND's indices, or a CAST to int32
  (which disappears).

Graph inputs and outputs keep their dtypes (the model's signature is the user's), and
constants are left to the lowerings (which already write int32 index constants). When
something was narrowed, one warning says how many tensors.
"""

from __future__ import annotations

import warnings

import numpy as np

from converter.ir import Graph, Op, Tensor

from ._graph import fresh_name

_INT64, _INT32 = np.dtype(np.int64), np.dtype(np.int32)
_INDEX_OPERAND = {"GATHER": 1, "GATHER_ND": 1}


def narrow_int64_indices(graph: Graph, *, warn: bool = True) -> Graph:
    """Narrow the int64 index tensors described above to int32 (in place); returns the graph."""
    boundary = {t.id for t in graph.inputs} | {t.id for t in graph.outputs}
    consumers = graph.consumers()
    narrowed, dropped = 0, set()
    for op in list(graph.ops):
        for out in op.outputs:
            if out.dtype != _INT64 or out.id in boundary:
                continue
            readers = consumers.get(out.id, [])
            if not readers or not all(_reads_as_index(r, out) for r in readers):
                continue
            replacement = _int32_producer(op, out)
            if replacement is None:
                continue
            for reader in readers:
                if reader.opcode == "CAST":
                    graph.replace_uses(reader.outputs[0], replacement)
                    dropped.add(id(reader))
                else:
                    reader.inputs = [replacement if t is out else t for t in reader.inputs]
            narrowed += 1
    graph.ops = [op for op in graph.ops if id(op) not in dropped]
    if narrowed and warn:
        warnings.warn(
            f"{narrowed} int64 index tensor(s) are computed as int32 in the LiteRT model (indices are "
            "below 2**31, so this is exact); model inputs and outputs keep their dtypes.",
            stacklevel=2,
        )
    return graph


def _reads_as_index(reader: Op, t: Tensor) -> bool:
    if reader.opcode == "CAST":
        return reader.outputs[0].dtype == _INT32
    position = _INDEX_OPERAND.get(reader.opcode)
    return position is not None and all(u is not t or i == position for i, u in enumerate(reader.inputs))


def _int32_producer(op: Op, out: Tensor) -> Tensor | None:
    """An int32 tensor holding `out`'s values, made by changing `op`; None if not possible."""
    if op.opcode in ("ARG_MAX", "ARG_MIN"):
        narrowed = Tensor(fresh_name(out.name), out.shape, _INT32, shape_signature=out.shape_signature)
        op.outputs = [narrowed]
        op.options = dict(op.options, outputType="INT32")
        return narrowed
    if op.opcode == "CAST" and op.inputs[0].dtype == _INT32:
        return op.inputs[0]
    return None
