"""Layout pass: move TRANSPOSE ops toward the outputs until they cancel.

Lowering keeps PyTorch's NCHW layout and wraps every layout-bound builtin (CONV_2D,
pooling, resize ...) as `TRANSPOSE(x, NCHW->NHWC) -> OP -> TRANSPOSE(y, NHWC->NCHW)`.
This pass sinks each TRANSPOSE through the layout-agnostic ops that read its output
(elementwise ops, activations, casts, concatenation, reductions, pads, slices, splits,
gathers, softmax over a last axis that stays last ...), rewriting each such op to work in
the transposed layout: constant operands are transposed in numpy, axes and paddings are
remapped. Where a TRANSPOSE meets another TRANSPOSE the two compose into one, and
identity transposes vanish. A CNN ends with one TRANSPOSE after its input and at most
one before each output (none when the output is rank 2 after a MEAN and an FC).

Guarantees:
- semantics are preserved for every graph: an op is only rewritten when all its
  non-constant operands can be taken in the new layout, and a TRANSPOSE whose output
  is a graph output (or read by an op that cannot be rewritten) stays for that reader;
- graph inputs and outputs keep the user's layout and names;
- the number of TRANSPOSE ops never grows (the pass undoes itself if it would).

It ends with `simplify_reshapes`: a TRANSPOSE left moving only size-1 dimensions is a
RESHAPE (e.g. before a flatten), and RESHAPE chains merge.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from common.tflite_schema import BROADCASTING, LAST_AXIS, PADS, REDUCTIONS, UNARY
from converter.ir import Graph, Op, QuantParams, Tensor

from ._graph import (
    Uses,
    fresh_name,
    insert_after,
    int32_const,
    inverse_perm,
    remove_ops,
    restore,
    snapshot,
    transpose_perm,
)
from ._reshape_layout import reshape_first
from .simplify_reshapes import simplify_reshapes

# Op groups (UNARY, BROADCASTING, REDUCTIONS, LAST_AXIS, PADS): common.tflite_schema.


def to_nhwc(graph: Graph) -> Graph:
    """Sink, compose and cancel TRANSPOSE ops (in place); returns the graph."""
    before = snapshot(graph)
    count_before = _transpose_count(graph)
    # Fanning a transpose out to several readers usually pays off (the copies cancel
    # further down), but not always: if the count grew, retry without fan-out, and if
    # that still does not help, keep the graph as it was.
    for allow_fan_out in (True, False):
        # Transposes only move forward, so sweeping ends; the bound is a safety net.
        uses = Uses(graph)  # kept exact by the sweeps' edits, resynced by each
        for _ in range(len(graph.ops) + 8):
            if not _sweep(uses, allow_fan_out):
                break
        uses.resync()
        _regroup_fanned_out_transposes(uses)
        simplify_reshapes(graph)
        if _transpose_count(graph) <= count_before:
            return graph
        restore(graph, before)
    return graph


# ---- driver -----------------------------------------------------------------------------


def _sweep(uses: Uses, allow_fan_out: bool) -> bool:
    """One pass over the TRANSPOSE ops; True if anything changed."""
    changed = False
    uses.resync()
    for op in list(uses.graph.ops):
        if op.opcode != "TRANSPOSE" or not uses.is_live(op):
            continue
        if _drop_unused(op, uses) or _compose(op, uses) or _sink(op, uses, allow_fan_out):
            changed = True
    return changed


def _transpose_count(graph: Graph) -> int:
    return sum(op.opcode == "TRANSPOSE" and not op.inputs[0].is_const for op in graph.ops)


def _drop_unused(op: Op, uses: Uses) -> bool:
    y = op.outputs[0]
    if uses.consumers(y) or uses.is_output(y):
        return False
    uses.remove(op)
    return True


def _compose(op: Op, uses: Uses) -> bool:
    """TRANSPOSE(TRANSPOSE(x, p), q) -> TRANSPOSE(x, p[q]); identity perms vanish."""
    perm = transpose_perm(op)
    if perm is None:
        return False
    x = op.inputs[0]
    if perm == list(range(len(perm))):
        return uses.bypass(op, x)
    inner = uses.produced_by(x, "TRANSPOSE")
    inner_perm = transpose_perm(inner) if inner is not None else None
    if inner_perm is None:
        return False
    composed = [inner_perm[i] for i in perm]
    if composed == list(range(len(composed))):
        return uses.bypass(op, inner.inputs[0])
    uses.set_input(op, 0, inner.inputs[0])
    uses.set_input(op, 1, int32_const(composed, "perm"))
    return True


# ---- sinking ------------------------------------------------------------------------------

Rewrite = Callable[[], None]


def _sink(t: Op, uses: Uses, allow_fan_out: bool) -> bool:
    """Move TRANSPOSE `t` below every op reading its output, if all of them allow it.
    Without `allow_fan_out`, only when that makes one transpose out of one."""
    perm = transpose_perm(t)
    y = t.outputs[0]
    if perm is None or uses.is_output(y):
        return False
    readers = [op for op in uses.consumers(y) if op.opcode != "TRANSPOSE"]
    if not readers:
        return False  # only transposes read it: _compose handles those
    if not allow_fan_out and (len(readers) > 1 or len(readers[0].outputs) > 1):
        return False
    rewrites, pending = [], []
    for reader in readers:
        rewrite = _plan(reader, y, perm, uses)
        if rewrite is not None:
            rewrites.append(rewrite)
        elif _reads_from(reader, readers):
            pending.append(reader)  # e.g. x * sigmoid(x): plan it once sigmoid has moved
        else:
            return False
    state = snapshot(uses.graph) if pending else None
    for rewrite in rewrites:
        rewrite()
    for reader in pending:
        rewrite = _plan(reader, y, perm, uses)
        if rewrite is None:
            restore(uses.graph, state)
            uses.refresh()
            return False
        rewrite()
    return True


def _reads_from(op: Op, others: list[Op]) -> bool:
    produced = {t.id for other in others if other is not op for t in other.outputs}
    return any(t is not None and t.id in produced for t in op.inputs)


def _plan(op: Op, y: Tensor, perm: list[int], uses: Uses) -> Rewrite | None:
    """How to rewrite `op` (which reads y = TRANSPOSE(x, perm)) to read x instead, or None."""
    rank = len(perm)
    if op.opcode in UNARY:
        if op.inputs[0] is not y or any(t is y for t in op.inputs[1:]):
            return None
        return _rewriter(uses, op, perm, {0: _source(y, uses)}, {})
    if op.opcode in BROADCASTING or op.opcode == "CONCATENATION":
        return _plan_broadcasting(op, perm, uses)
    if op.opcode in REDUCTIONS:
        return _plan_reduction(op, y, perm, uses)
    if op.opcode in LAST_AXIS:
        if op.inputs[0] is not y or perm[-1] != rank - 1:
            return None
        return _rewriter(uses, op, perm, {0: _source(y, uses)}, {})
    if op.opcode in PADS:
        return _plan_pad(op, y, perm, uses)
    if op.opcode == "SLICE":
        return _plan_slice(op, y, perm, uses)
    if op.opcode == "STRIDED_SLICE":
        return _plan_strided_slice(op, y, perm, uses)
    if op.opcode in ("SPLIT", "SPLIT_V"):
        return _plan_split(op, y, perm, uses)
    if op.opcode == "GATHER":
        return _plan_gather(op, y, perm, uses)
    if op.opcode == "RESHAPE":
        return _plan_reshape(op, y, perm, uses)
    return None


def _source(y: Tensor, uses: Uses) -> Tensor:
    """x, for y = TRANSPOSE(x, perm)."""
    return uses.producer[y.id].inputs[0]


def _rewriter(
    uses: Uses,
    op: Op,
    perm: list[int],
    new_inputs: dict[int, Tensor | None],
    new_options: dict,
    out_perms: list[list[int]] | None = None,
) -> Rewrite:
    """A rewrite making `op` read `new_inputs` (by index) with `new_options`, and compute
    its outputs in the transposed layout; a TRANSPOSE after each output restores the
    original tensors. `out_perms[i]` maps output i back (default: `perm`)."""

    def apply() -> None:
        for i, t in new_inputs.items():
            while len(op.inputs) <= i:
                op.inputs.append(None)  # e.g. a RESHAPE given only `newShape` gets a shape input
            uses.set_input(op, i, t)
        op.options.update(new_options)
        restores = []
        for i, out in enumerate(list(op.outputs)):
            back = perm if out_perms is None else out_perms[i]
            if back == list(range(len(back))):
                continue  # the output already is in the original layout
            inner = _transposed_tensor(out, inverse_perm(back))
            uses.set_output(op, i, inner)
            restore_op = Op("TRANSPOSE", [inner, int32_const(back, "perm")], [out], source=op.source)
            uses.add(restore_op)
            restores.append(restore_op)
        insert_after(uses.graph, op, restores)

    return apply


def _transposed_tensor(t: Tensor, perm: list[int]) -> Tensor:
    """A new activation tensor shaped like TRANSPOSE(t, perm)."""
    sig = None if t.shape_signature is None else tuple(t.shape_signature[p] for p in perm)
    quant = t.quant
    if quant is not None and np.size(quant.scale) > 1:
        quant = QuantParams(quant.scale, quant.zero_point, perm.index(quant.axis))
    return Tensor(fresh_name(t.name), tuple(t.shape[p] for p in perm), t.dtype, shape_signature=sig, quant=quant)


def _plan_broadcasting(op, perm, uses) -> Rewrite | None:
    """Elementwise n-ary ops and CONCATENATION: every operand must come in the same
    layout: constants are transposed here; other tensors must be TRANSPOSE(_, perm)."""
    rank = len(perm)
    inv = inverse_perm(perm)
    if any(len(o.shape) != rank for o in op.outputs):
        return None
    new_inputs: dict[int, Tensor] = {}
    for i, t in enumerate(op.inputs):
        if t is None:
            continue
        producer = uses.produced_by(t, "TRANSPOSE")
        if producer is not None and transpose_perm(producer) == perm:
            new_inputs[i] = producer.inputs[0]
        elif t.is_const and t.rank <= rank:
            if t.quant is not None and np.size(t.quant.scale) > 1:
                return None  # per-channel quantized constant: leave alone
            data = np.asarray(t.data).reshape((1,) * (rank - t.rank) + t.data.shape)
            moved = np.ascontiguousarray(np.transpose(data, inv))
            new_inputs[i] = Tensor(fresh_name(t.name), moved.shape, t.dtype, data=moved, quant=t.quant)
        elif t.rank == 0:
            new_inputs[i] = t  # a scalar broadcasts the same in any layout
        else:
            return None
    options = {}
    if op.opcode == "CONCATENATION":
        options["axis"] = perm[op.options.get("axis", 0) % rank]
    return _rewriter(uses, op, perm, new_inputs, options)


def _const_ints(t: Tensor | None) -> list[int] | None:
    if t is None or not t.is_const:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _plan_reduction(op, y, perm, uses) -> Rewrite | None:
    rank = len(perm)
    axes = _const_ints(op.inputs[1])
    if op.inputs[0] is not y or axes is None:
        return None
    axes = sorted({a % rank for a in axes})
    new_axes = sorted(perm[a] for a in axes)
    keep = bool(op.options.get("keepDims", False))
    if keep:
        back = perm
    else:
        # The kept dims in the original order, and where each sits in the new output.
        kept_src = [perm[i] for i in range(rank) if i not in axes]
        order = sorted(kept_src)
        back = [order.index(s) for s in kept_src]
    axes_t = int32_const(new_axes, "axes")
    return _rewriter(uses, op, perm, {0: _source(y, uses), 1: axes_t}, {}, [back])


def _plan_pad(op, y, perm, uses) -> Rewrite | None:
    pads = op.inputs[1]
    if op.inputs[0] is not y or pads is None or not pads.is_const:
        return None
    if any(t is y for t in op.inputs[1:]):
        return None
    data = np.asarray(pads.data)
    moved = np.ascontiguousarray(data[inverse_perm(perm)])
    new = Tensor(fresh_name(pads.name), moved.shape, pads.dtype, data=moved)
    return _rewriter(uses, op, perm, {0: _source(y, uses), 1: new}, {})


def _permuted_const(t: Tensor, perm: list[int]) -> Tensor:
    """A 1-D constant whose entry perm[i] is entry i of `t` (per-axis vectors)."""
    data = np.asarray(t.data).reshape(-1)
    moved = np.ascontiguousarray(data[inverse_perm(perm)])
    return Tensor(fresh_name(t.name), moved.shape, t.dtype, data=moved)


def _plan_slice(op, y, perm, uses) -> Rewrite | None:
    begin, size = op.inputs[1], op.inputs[2]
    if op.inputs[0] is not y or not (begin is not None and begin.is_const and size is not None and size.is_const):
        return None
    return _rewriter(
        uses, op, perm, {0: _source(y, uses), 1: _permuted_const(begin, perm), 2: _permuted_const(size, perm)}, {}
    )


def _permute_mask(mask: int, perm: list[int]) -> int:
    return sum(1 << perm[i] for i in range(len(perm)) if mask >> i & 1)


def _plan_strided_slice(op, y, perm, uses) -> Rewrite | None:
    o = op.options
    if o.get("ellipsisMask", 0) or o.get("newAxisMask", 0) or o.get("shrinkAxisMask", 0) or o.get("offset", False):
        return None  # rank-changing or offset forms: not worth the bookkeeping
    ins = op.inputs
    if ins[0] is not y or not all(t is not None and t.is_const for t in ins[1:4]):
        return None
    options = {
        "beginMask": _permute_mask(o.get("beginMask", 0), perm),
        "endMask": _permute_mask(o.get("endMask", 0), perm),
    }
    return _rewriter(
        uses,
        op,
        perm,
        {
            0: _source(y, uses),
            1: _permuted_const(ins[1], perm),
            2: _permuted_const(ins[2], perm),
            3: _permuted_const(ins[3], perm),
        },
        options,
    )


def _plan_split(op, y, perm, uses) -> Rewrite | None:
    rank = len(perm)
    data_index, axis_index = (1, 0) if op.opcode == "SPLIT" else (0, 2)
    axis = _const_ints(op.inputs[axis_index])
    if (
        op.inputs[data_index] is not y
        or axis is None
        or len(axis) != 1
        or any(t is y for i, t in enumerate(op.inputs) if i != data_index)
    ):
        return None
    new_axis = int32_const(perm[axis[0] % rank], "axis")
    return _rewriter(uses, op, perm, {data_index: _source(y, uses), axis_index: new_axis}, {})


def _plan_gather(op, y, perm, uses) -> Rewrite | None:
    rank = len(perm)
    indices = op.inputs[1]
    if op.inputs[0] is not y or indices is y or indices.rank != 1 or op.options.get("batchDims", 0):
        return None
    axis = op.options.get("axis", 0) % rank
    return _rewriter(uses, op, perm, {0: _source(y, uses)}, {"axis": perm[axis]})


def _plan_reshape(op, y, perm, uses) -> Rewrite | None:
    """RESHAPE(TRANSPOSE(x)) -> TRANSPOSE(RESHAPE(x)) when the reshape's merged/split
    groups of dims are adjacent in x (see `_reshape_layout`); static shapes only."""
    x, o = _source(y, uses), op.outputs[0]
    if (
        op.inputs[0] is not y
        or x.is_dynamic
        or o.is_dynamic
        or (len(op.inputs) > 1 and op.inputs[1] is not None and not op.inputs[1].is_const)
    ):
        return None
    reader = uses.only_consumer(o)
    reader_perm = transpose_perm(reader) if reader is not None and reader.opcode == "TRANSPOSE" else None
    plan = reshape_first(x.shape, perm, o.shape, reader_perm)
    if plan is None or plan.pre is not None:
        # A `pre` transpose would sit before the reshape, where the next sweep would
        # try to sink it again: transposes only ever move forward, so the pass ends.
        return None
    shape = int32_const(list(plan.w_shape), "shape")
    return _rewriter(uses, op, plan.post, {0: x, 1: shape}, {"newShape": list(plan.w_shape)})


def _regroup_fanned_out_transposes(uses: Uses) -> None:
    """Undo fan-outs that did not cancel: when several unary ops read x and each result
    is only read by a TRANSPOSE(_, perm) (the same perm), transpose x once before them.
    (Done once, after sinking, which would otherwise push that transpose down again.)"""
    graph = uses.graph
    for x in [t for t in graph.tensors() if not t.is_const]:
        groups: dict[tuple, list[tuple[Op, Op]]] = {}
        for op in uses.consumers(x):
            if op.opcode not in UNARY or op.inputs[0] is not x or len(op.outputs) != 1:
                continue
            out = op.outputs[0]
            after = uses.consumers(out)
            if uses.is_output(out) or len(after) != 1 or after[0].opcode != "TRANSPOSE":
                continue
            perm = transpose_perm(after[0])
            if perm is not None:
                groups.setdefault(tuple(perm), []).append((op, after[0]))
        for perm, pairs in groups.items():
            if len(pairs) < 2:
                continue
            shared = _transposed_tensor(x, list(perm))
            first = min(graph.ops.index(u) for u, _ in pairs)
            graph.ops.insert(first, Op("TRANSPOSE", [x, int32_const(list(perm), "perm")], [shared]))
            for unary, transpose in pairs:
                unary.inputs[0] = shared
                unary.outputs[0] = transpose.outputs[0]
            remove_ops(graph, [t for _, t in pairs])
        if any(len(p) >= 2 for p in groups.values()):
            uses.refresh()
