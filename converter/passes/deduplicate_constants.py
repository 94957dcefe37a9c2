"""Constant de-duplication and common-subexpression elimination.

Guarantees:
- constant tensors with the same dtype, shape, bytes and quantization become one
  `Tensor` object (the writer then writes one buffer); variables are left alone;
- two ops with the same opcode, the same options and the very same input tensors
  compute the same values: the later one is removed and its readers read the earlier
  one's outputs (ops with side effects are never merged, and neither are ops whose
  outputs are graph outputs, which keep their own tensors).
Run it after the other passes: folding creates many small equal constants
(permutations, axes, shapes).
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, LazyConstant, Op, Tensor, fingerprint

from ._graph import SIDE_EFFECT_OPS, Uses


def deduplicate_constants(graph: Graph) -> Graph:
    """Share equal constants and merge identical ops (in place); returns the graph."""
    _share_constants(graph)
    uses = Uses(graph)  # kept exact by the merges
    while _merge_identical_ops(uses):
        pass
    return graph


def _constant_key(t: Tensor):
    quant = None
    if t.quant is not None:
        quant = (np.asarray(t.quant.scale).tobytes(), np.asarray(t.quant.zero_point).tobytes(), t.quant.axis)
    return (t.dtype.str, t.shape, fingerprint(t.constant), quant)


def _equal(a: Tensor, b: Tensor) -> bool:
    """Equal values (two lazy constants with one recipe are not computed)."""
    if a is b:
        return True
    if (
        isinstance(a.constant, LazyConstant)
        and isinstance(b.constant, LazyConstant)
        and a.constant.same_recipe(b.constant)
    ):
        return True
    return np.array_equal(a.data, b.data)


def _share_constants(graph: Graph) -> None:
    canonical: dict = {}  # key -> the distinct constants with that key
    shared: dict[int, Tensor] = {}  # constant id -> the one it is shared as (keyed once, read by many)
    for op in graph.ops:
        for i, t in enumerate(op.inputs):
            if t is None or not t.is_const or t.is_variable:
                continue
            first = shared.get(t.id)
            if first is None:
                same_key = canonical.setdefault(_constant_key(t), [])
                first = next((c for c in same_key if _equal(c, t)), None)
                if first is None:
                    same_key.append(t)
                    first = t
                shared[t.id] = first
            if first is not t:
                op.inputs[i] = first


def _options_key(options: dict) -> str:
    # repr() keeps it simple: options hold ints, floats, strings, lists and small arrays.
    return repr(sorted((k, np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in options.items()))


def _output_key(t: Tensor):
    """Outputs must agree too (a QUANTIZE's result depends on its output's scale)."""
    quant = None
    if t.quant is not None:
        quant = (np.asarray(t.quant.scale).tobytes(), np.asarray(t.quant.zero_point).tobytes(), t.quant.axis)
    return (t.dtype.str, t.shape, t.shape_signature, quant)


def _rest_key(op: Op):
    """What else two ops on the same inputs must agree on: options and output types."""
    return _options_key(op.options), tuple(_output_key(t) for t in op.outputs)


def _merge_identical_ops(uses: Uses) -> bool:
    graph = uses.graph
    outputs = {t.id for t in graph.outputs}
    # (opcode, input ids) -> the first op reading them; once a second op comes, a dict
    # {(options, output types): first op with them} (most ops share their inputs with
    # none: their options are never keyed).
    seen: dict = {}
    changed = False
    for op in list(graph.ops):
        if op.opcode in SIDE_EFFECT_OPS or any(t.id in outputs or t.is_variable for t in op.outputs):
            continue
        inputs_key = (op.opcode, tuple(None if t is None else t.id for t in op.inputs))
        same_inputs = seen.setdefault(inputs_key, op)
        if same_inputs is op:
            continue
        if isinstance(same_inputs, Op):
            same_inputs = seen[inputs_key] = {_rest_key(same_inputs): same_inputs}
        first = same_inputs.setdefault(_rest_key(op), op)
        if first is op:
            continue
        for old, new in zip(op.outputs, first.outputs):
            uses.replace_reads(old, new)
        uses.remove(op)
        changed = True
    return changed
