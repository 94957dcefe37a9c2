"""Fuse the tanh GELU written out by hand into one GELU op.

GPT-2 and many models since write the tanh approximation of GELU themselves:

    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))

which lowers to eight ops (MUL, POW, MUL, ADD, MUL, TANH, ADD, MUL). LiteRT's GELU with
`approximate=True` computes exactly that formula in one op. This pass finds the pattern
(operands of MUL/ADD in either order, x**3 as POW(x, 3) or x * x * x) and turns its last
MUL into GELU(x); the other ops die unless something else reads them (then they stay,
and the graph is still correct).

Guarantees: only float32 graphs' static, unquantized patterns are rewritten; the
constants must equal 0.5, 1, sqrt(2/pi) and 0.044715 to float32 precision.
"""

from __future__ import annotations

import math

import numpy as np

from converter.ir import Graph, Op, Tensor

from ._graph import activation

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def fuse_gelu(graph: Graph) -> Graph:
    """Rewrite every hand-written tanh GELU into GELU(approximate=True) (in place)."""
    producers = graph.producers()
    for op in graph.ops:
        x = _tanh_gelu_input(op, producers)
        if x is not None:
            op.opcode, op.inputs, op.options = "GELU", [x], {"approximate": True}
    return graph


def _scalar(t: Tensor | None, value: float) -> bool:
    return (
        t is not None
        and t.is_const
        and t.data.size == 1
        and bool(np.isclose(float(t.data.reshape(())), value, rtol=1e-6, atol=0.0))
    )


def _by(op: Op | None, opcode: str, value: float) -> Tensor | None:
    """For `op` = OPCODE(t, value) or OPCODE(value, t) with no fused activation: t."""
    if op is None or op.opcode != opcode or len(op.inputs) != 2 or activation(op) != "NONE":
        return None
    a, b = op.inputs
    if _scalar(b, value) and not a.is_const:
        return a
    if _scalar(a, value) and not b.is_const:
        return b
    return None


def _is_cube_of(t: Tensor, x: Tensor, producers) -> bool:
    op = producers.get(t.id)
    if op is None:
        return False
    if op.opcode == "POW":
        return op.inputs[0] is x and _scalar(op.inputs[1], 3.0)
    if op.opcode == "MUL" and activation(op) == "NONE":
        a, b = op.inputs
        square = producers.get((b if a is x else a).id) if x in (a, b) else None
        return square is not None and square.opcode == "MUL" and all(u is x for u in square.inputs)
    return False


def _tanh_gelu_input(op: Op, producers) -> Tensor | None:
    """x when `op` is the final MUL of 0.5 * x * (1 + tanh(c * (x + 0.044715 x^3)))."""
    if op.opcode != "MUL" or activation(op) != "NONE" or op.outputs[0].dtype != np.float32:
        return None
    if any(t.quant is not None for t in [*op.inputs, *op.outputs] if t is not None):
        return None
    for half_x, one_plus in (op.inputs, op.inputs[::-1]):
        x = _by(producers.get(half_x.id), "MUL", 0.5)
        tanh_out = _by(producers.get(one_plus.id), "ADD", 1.0)
        tanh = producers.get(tanh_out.id) if tanh_out is not None else None
        if x is None or tanh is None or tanh.opcode != "TANH":
            continue
        inner = _by(producers.get(tanh.inputs[0].id), "MUL", _SQRT_2_OVER_PI)
        add = producers.get(inner.id) if inner is not None else None
        if add is None or add.opcode != "ADD" or activation(add) != "NONE" or x not in add.inputs:
            continue
        other = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
        cube = _by(producers.get(other.id), "MUL", 0.044715)
        if cube is not None and _is_cube_of(cube, x, producers) and x.shape == op.outputs[0].shape:
            return x
    return None
