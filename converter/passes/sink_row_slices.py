"""Sink a slice of rows towards the graph's inputs, so the ops before it compute only the
rows that are kept.

A language model's prefill that returns the last position's logits slices
`hidden[:, -1:]` after the last decoder layer: every op of that layer after its K/V
projections (attention for the queries, output projection, MLP, final norm) computed 32
rows to keep one (on a 100M Llama at 32 tokens, 1.25x the time of a prefill with no
logits, 1.06x with the slice sunk). A ViT's `x[:, 0]` after the final LayerNorm is
the same pattern. Row-wise ops commute with a slice of their rows:

    slice(op(a, b), axis, rows) == op(slice(a, axis', rows), slice(b, axis'', rows))

where each operand's axis is the output's axis seen through the op (broadcast operands
of size 1 along it stay whole). So a STRIDED_SLICE that narrows one axis (stride 1, no
masks) and is the only reader of its input moves above the producing op, onto each
operand that varies along that axis, as long as the producer is row-wise along it:
elementwise ops, reductions and softmax over other axes (keepDims), FULLY_CONNECTED and
BATCH_MATMUL rows (not the contracted axis), TRANSPOSE, a RESHAPE that keeps the leading
axes up to it or the trailing axes from it (grouped-query attention's (B, H_kv, G, T, D)
-> (B, H, T, D)), CONCATENATION along another axis. A slice that reaches an operand with
other readers stays there (the K/V projections still read every row). Static shapes only.
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, Op, Tensor

from ._graph import SIDE_EFFECT_OPS, Uses, fresh_name, int32_const, transpose_perm

ELEMENTWISE = {
    "ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "POW", "LOGISTIC", "TANH",
    "RSQRT", "SQRT", "NEG", "EXP", "LOG", "GELU", "RELU", "RELU6", "HARD_SWISH", "ABS", "CAST",
    "LEAKY_RELU", "SIN", "COS", "SQUARE", "SELECT_V2", "FLOOR", "ELU",
}  # fmt: skip
ROW_REDUCERS = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"}


def sink_row_slices(graph: Graph) -> Graph:
    """Move each one-axis row slice above the row-wise ops that produce its input."""
    uses = Uses(graph)  # kept exact by `_sink_once`
    moved = True
    while moved:
        moved = False
        for op in list(graph.ops):
            if op.opcode == "STRIDED_SLICE" and _sink_once(graph, uses, op):
                moved = True
                break  # the op list changed: walk it again
    return graph


def _row_slice(op: Op) -> tuple[int, int, int] | None:
    """(axis, begin, end) when `op` keeps rows begin:end of one axis of a static input."""
    x, begin, end, strides = (op.inputs + [None] * 4)[:4]
    if x is None or any(t is None or not t.is_const for t in (begin, end, strides)) or x.shape_signature:
        return None
    options = op.options
    if any(options.get(k, 0) for k in ("beginMask", "endMask", "ellipsisMask", "newAxisMask", "shrinkAxisMask")):
        return None
    if options.get("offset", False):
        return None
    b, e, s = (np.asarray(t.data).reshape(-1).tolist() for t in (begin, end, strides))
    if len(b) != x.rank or any(v != 1 for v in s):
        return None
    narrowed = [a for a in range(x.rank) if (b[a], e[a]) != (0, x.shape[a])]
    if len(narrowed) != 1:
        return None
    a = narrowed[0]
    if not 0 <= b[a] < e[a] <= x.shape[a] or op.outputs[0].shape[a] != e[a] - b[a]:
        return None
    return a, b[a], e[a]


def _operand_axes(producer: Op, y: Tensor, a: int) -> list[int | None] | None:
    """For each input of `producer`, the axis to slice (None: leave it whole), or None
    when the producer is not row-wise along output axis `a`."""
    code, inputs = producer.opcode, producer.inputs
    if code in ELEMENTWISE:
        axes = []
        for t in inputs:
            if t is None:
                axes.append(None)
                continue
            ta = a - (y.rank - t.rank)
            if ta < 0 or t.shape[ta] == 1:
                axes.append(None)
            elif t.shape[ta] == y.shape[a]:
                axes.append(ta)
            else:
                return None
        return axes
    if code in ROW_REDUCERS or code in ("SOFTMAX", "LOG_SOFTMAX"):
        if code in ROW_REDUCERS:
            reduced = (
                [int(v) % inputs[0].rank for v in np.asarray(inputs[1].data).reshape(-1)]
                if inputs[1].is_const
                else None
            )
            if reduced is None or not producer.options.get("keepDims", False) or a in reduced:
                return None
        elif a == y.rank - 1:
            return None
        return [a] + [None] * (len(inputs) - 1)
    if code == "FULLY_CONNECTED":
        x = inputs[0]
        if producer.options.get("keepNumDims", False) and x.rank == y.rank and a < y.rank - 1:
            return [a] + [None] * (len(inputs) - 1)
        if x.rank == 2 and y.rank == 2 and a == 0:
            return [0] + [None] * (len(inputs) - 1)
        return None
    if code == "BATCH_MATMUL":
        if producer.options.get("adjX", False) or inputs[0].rank != y.rank or a != y.rank - 2:
            return None
        return [a, None]
    if code == "TRANSPOSE":
        perm = transpose_perm(producer)
        return None if perm is None else [perm[a], None]
    if code == "RESHAPE":
        x = inputs[0]
        if x.shape[: a + 1] == y.shape[: a + 1]:  # the leading axes up to a are kept
            return [a] + [None] * (len(inputs) - 1)
        tail = y.rank - a  # or the trailing axes from a: (B, H_kv, G, T, D) -> (B, H, T, D)
        if x.rank >= tail and x.shape[x.rank - tail :] == y.shape[a:]:
            return [x.rank - tail] + [None] * (len(inputs) - 1)
        return None
    if code == "CONCATENATION":
        axis = producer.options.get("axis", 0) % y.rank
        return None if axis == a else [a] * len(inputs)
    return None


def _sink_once(graph: Graph, uses: Uses, slice_op: Op) -> bool:
    found = _row_slice(slice_op)
    if found is None:
        return False
    a, begin, end = found
    y = slice_op.inputs[0]
    producer = uses.producer.get(y.id)
    if (
        producer is None
        or len(producer.outputs) != 1
        or producer.opcode in SIDE_EFFECT_OPS
        or uses.only_consumer(y) is not slice_op
        or any(t is not None and t.shape_signature for t in producer.inputs)
    ):
        return False
    axes = _operand_axes(producer, y, a)
    if axes is None or all(ax is None for ax in axes):
        return False
    if any(
        ax is not None and t.quant is not None and np.size(t.quant.scale) > 1 for t, ax in zip(producer.inputs, axes)
    ):
        return False  # per-channel parameters would need slicing too
    new_ops, sliced = [], {}
    position = {id(op): k for k, op in enumerate(graph.ops)}
    for i, (t, ax) in enumerate(zip(producer.inputs, axes)):
        if ax is None:
            continue
        key = (t.id, ax)
        if key not in sliced:
            # The same rows of t sliced before (the residual stream feeds a norm and an ADD):
            # one slice, moved up to here, so it can sink further once it is t's only reader.
            same = [c for c in uses.consumers(t) if c.opcode == "STRIDED_SLICE" and c.inputs[0] is t]
            same = [c for c in same if c is not slice_op and _row_slice(c) == (ax, begin, end)]
            if same:
                first = min(same, key=lambda c: position[id(c)])
                if position[id(first)] > position[id(producer)]:
                    new_ops.append(first)  # moved up (only its input, t, must come before it)
                sliced[key] = first.outputs[0]
            else:
                sliced[key] = _slice(t, ax, begin, end, new_ops, slice_op, uses)
        uses.set_input(producer, i, sliced[key])
    out = slice_op.outputs[0]
    if producer.opcode == "RESHAPE":
        _retarget_reshape(producer, out.shape, uses)
    uses.remove(slice_op)
    uses.set_output(producer, 0, out)
    moved = {id(op) for op in new_ops}
    graph.ops = [op for op in graph.ops if id(op) not in moved]
    index = graph.ops.index(producer)  # by identity (Op has eq=False)
    graph.ops[index:index] = new_ops
    return True


def _slice(t: Tensor, axis: int, begin: int, end: int, new_ops: list, origin: Op, uses: Uses) -> Tensor:
    """t's rows begin:end along `axis`: a constant sliced now, else a new STRIDED_SLICE."""
    index = [slice(None)] * t.rank
    index[axis] = slice(begin, end)
    shape = list(t.shape)
    shape[axis] = end - begin
    if t.is_const:
        data = np.ascontiguousarray(np.asarray(t.data)[tuple(index)])
        return Tensor(fresh_name(t.name), data.shape, data.dtype, data=data, quant=t.quant)
    starts, stops = [0] * t.rank, list(t.shape)
    starts[axis], stops[axis] = begin, end
    out = Tensor(fresh_name(t.name), tuple(shape), t.dtype, quant=t.quant)
    options = {"beginMask": 0, "endMask": 0, "ellipsisMask": 0, "newAxisMask": 0, "shrinkAxisMask": 0, "offset": False}
    inputs = [t, int32_const(starts, "begin"), int32_const(stops, "end"), int32_const([1] * t.rank, "strides")]
    new_ops.append(Op("STRIDED_SLICE", inputs, [out], options, source=origin.source, module=origin.module))
    uses.add(new_ops[-1])
    return out


def _retarget_reshape(op: Op, shape: tuple[int, ...], uses: Uses) -> None:
    if len(op.inputs) > 1 and op.inputs[1] is not None:
        uses.set_input(op, 1, int32_const(list(shape), "shape"))
    if "newShape" in op.options:
        op.options = {**op.options, "newShape": list(shape)}
