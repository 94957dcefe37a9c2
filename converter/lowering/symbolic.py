"""Symbolic sizes: dynamic dimensions used as values.

With `dynamic_shapes=`, torch.export describes sizes as sympy expressions over symbols
(`s0` = `x.size(0)` ...): `x.view(B * 2, T, -1)` reaches us as `aten.view(x, [mul, sym_size,
4])` where `mul` is an `operator.mul` node on SymInts. Lowering keeps such values
symbolic: `aten.sym_size` and the Python arithmetic nodes lower to the node's own SymInt
(no op emitted). When an op needs a size as a tensor (a dynamic RESHAPE target, the shape
of a FILL or BROADCAST_TO, the limit of a RANGE, the bounds of a STRIDED_SLICE), `sym_value`
materialises the expression as int32 ops: `SHAPE(input)` sliced to the symbol's dimension,
then ADD / MUL / FLOOR_DIV / FLOOR_MOD / MAXIMUM / MINIMUM, each sub-expression emitted once
per graph. Every value is a 1-element int32 tensor, so pieces concatenate into shape
vectors.

Symbols are defined by the graph's inputs: `register_input` records, for each dynamic
input dimension, which input and axis it reads (derived dimensions `a * s + b` are solved
for `s`). A size that no input defines (a data-dependent size from `.item()` or
`nonzero`) is reported as unsupported.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import sympy
import torch
from torch.utils._sympy import functions as symfn

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


# ---- symbols from the graph's inputs ------------------------------------------------------


def _symbols(ctx) -> dict:
    """sympy Symbol -> (input tensor, axis, a, b): symbol = (size(axis) - b) // a."""
    if not hasattr(ctx, "symbols"):
        ctx.symbols = {}
        ctx.sym_values = {}
    return ctx.symbols


def register_input(ctx, tensor: Tensor, shape) -> None:
    """Record which dimension of graph input `tensor` defines each symbol in `shape`."""
    table = _symbols(ctx)
    for axis, d in enumerate(shape):
        if not isinstance(d, torch.SymInt):
            continue
        expr = sympy.expand(d.node.expr)
        free = list(expr.free_symbols)
        if len(free) != 1 or free[0] in table:
            continue
        sym = free[0]
        if not expr.is_polynomial(sym) or sympy.degree(expr, sym) != 1:
            continue
        a, b = expr.as_poly(sym).all_coeffs()  # size = a * sym + b
        if a.is_Integer and b.is_Integer:
            table[sym] = (tensor, axis, int(a), int(b))


def is_symbolic(value) -> bool:
    return isinstance(value, (torch.SymInt, sympy.Expr)) and not (isinstance(value, sympy.Expr) and value.is_Integer)


def _expr(value) -> sympy.Expr:
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, sympy.Expr):
        return value
    return sympy.Integer(int(value))


# ---- materialising expressions as int32 ops ------------------------------------------------


def sym_value(ctx, value) -> Tensor:
    """An int32 tensor of shape [1] holding `value` (an int, a SymInt or a sympy expr)."""
    _symbols(ctx)
    expr = _expr(value)
    if expr.is_Integer:
        return emit.int32(ctx, [int(expr)])
    cached = ctx.sym_values.get(expr)
    if cached is None:
        cached = ctx.sym_values[expr] = _emit_expr(ctx, expr)
    return cached


def _scalar_op(ctx, opcode: str, a: Tensor, b: Tensor) -> Tensor:
    options = {"fusedActivationFunction": "NONE"} if opcode in ("ADD", "SUB", "MUL") else None
    return emit.op(ctx, opcode, [a, b], options, shape=(1,), dtype=np.int32)


def _fold(ctx, opcode: str, args) -> Tensor:
    result = sym_value(ctx, args[0])
    for arg in args[1:]:
        result = _scalar_op(ctx, opcode, result, sym_value(ctx, arg))
    return result


def _emit_expr(ctx, expr: sympy.Expr) -> Tensor:
    if isinstance(expr, sympy.Symbol):
        return _emit_symbol(ctx, expr)
    if isinstance(expr, sympy.Add):
        return _fold(ctx, "ADD", expr.args)
    if isinstance(expr, sympy.Mul):
        return _fold(ctx, "MUL", expr.args)
    if isinstance(expr, (symfn.FloorDiv, symfn.CleanDiv)):
        return _fold(ctx, "FLOOR_DIV", expr.args)
    if isinstance(expr, symfn.CeilDiv):  # ceil(a / b) = -((-a) // b)
        a, b = expr.args
        return sym_value(ctx, -symfn.FloorDiv(-a, b))
    if isinstance(expr, (symfn.PythonMod, symfn.Mod, sympy.Mod)):
        return _fold(ctx, "FLOOR_MOD", expr.args)
    if isinstance(expr, (symfn.Max, sympy.Max)):
        return _fold(ctx, "MAXIMUM", expr.args)
    if isinstance(expr, (symfn.Min, sympy.Min)):
        return _fold(ctx, "MINIMUM", expr.args)
    if isinstance(expr, (sympy.Pow, symfn.PowByNatural)) and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        return _fold(ctx, "MUL", [expr.args[0]] * int(expr.args[1]))
    raise emit.unsupported(
        ctx,
        f"the dynamic size '{expr}' ({type(expr).__name__})",
        "Only + - * // % min max of input sizes can be computed in the model; "
        "make that size static or pass it in as an input tensor.",
    )


def _emit_symbol(ctx, sym: sympy.Symbol) -> Tensor:
    entry = ctx.symbols.get(sym)
    if entry is None:
        raise emit.unsupported(
            ctx,
            f"the size '{sym}', which no input dimension defines (a data-dependent size, e.g. from "
            ".item(), nonzero() or a boolean mask)",
            "Make the size depend only on input shapes, or compute it outside the model.",
        )
    tensor, axis, a, b = entry
    shape = emit.shape_of(ctx, tensor)
    size = emit.op(
        ctx,
        "STRIDED_SLICE",
        [shape, emit.int32(ctx, [axis]), emit.int32(ctx, [axis + 1]), emit.int32(ctx, [1])],
        {"beginMask": 0, "endMask": 0, "ellipsisMask": 0, "newAxisMask": 0, "shrinkAxisMask": 0, "offset": False},
        shape=(1,),
        dtype=np.int32,
    )
    if b:
        size = _scalar_op(ctx, "SUB", size, emit.int32(ctx, [b]))
    if a != 1:
        size = _scalar_op(ctx, "FLOOR_DIV", size, emit.int32(ctx, [a]))
    return size


def shape_tensor(ctx, dims) -> Tensor:
    """A 1-D int32 tensor holding `dims` (ints and SymInts): runs of static sizes are one
    constant, each dynamic size its own piece, joined by one CONCATENATION."""
    pieces, static = [], []
    for d in dims:
        if is_symbolic(d):
            if static:
                pieces.append(emit.int32(ctx, static))
                static = []
            pieces.append(sym_value(ctx, d))
        else:
            static.append(int(d))
    if static or not pieces:
        pieces.append(emit.int32(ctx, static))
    if len(pieces) == 1:
        return pieces[0]
    return emit.op(
        ctx, "CONCATENATION", pieces, {"axis": 0, "fusedActivationFunction": "NONE"}, shape=(len(dims),), dtype=np.int32
    )


def signature_of(dims) -> tuple[int, ...] | None:
    """The shape signature (-1 for symbolic dims) of a list of ints and SymInts."""
    sig = tuple(-1 if is_symbolic(d) else int(d) for d in dims)
    return sig if -1 in sig else None


# ---- lowerings: size queries and Python arithmetic on sizes --------------------------------


def _node_value(ctx, *args, **kwargs):
    """The node's own value: an int when export proved it static, else a SymInt that
    stays symbolic until an op needs it as a tensor (`sym_value`)."""
    return ctx.meta


lowers(aten.sym_size.int, aten.sym_numel.default, aten.sym_storage_offset.default)(_node_value)
lowers(
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.mod,
    operator.neg,
    operator.pos,
    operator.truediv,
    operator.pow,
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.and_,
    operator.or_,
    operator.not_,
    torch.sym_max,
    torch.sym_min,
    torch.sym_not,
    torch.sym_float,
    torch.sym_int,
    torch.sym_ite,
    math.ceil,
    math.floor,
    math.trunc,
)(_node_value)


# ---- masks over dynamic lengths -----------------------------------------------------------


def _iota(ctx, size) -> Tensor:
    """RANGE(0, size) as int32 (size an int or a SymInt)."""
    if not is_symbolic(size):
        return emit.int32(ctx, np.arange(int(size)))
    limit = emit.reshape(ctx, sym_value(ctx, size), ())
    return emit.op(
        ctx,
        "RANGE",
        [emit.scalar_like(ctx, 0, np.int32), limit, emit.scalar_like(ctx, 1, np.int32)],
        shape=(int(size.node.hint or 1),),
        dtype=np.int32,
        signature=(-1,),
    )


def causal_mask(ctx, rows, cols) -> Tensor:
    """The boolean (rows, cols) lower-triangular mask `torch.ones(rows, cols).tril()` of
    `is_causal` attention, for lengths known only at run time: iota(cols) <= iota(rows)."""
    i, j = _iota(ctx, rows), _iota(ctx, cols)
    sig_i = (-1, 1) if is_symbolic(rows) else None
    sig_j = (1, -1) if is_symbolic(cols) else None
    column = (
        ctx.const(i.data.reshape(-1, 1))
        if i.is_const
        else emit.op(
            ctx,
            "RESHAPE",
            [i, emit.int32(ctx, [-1, 1])],
            {"newShape": [-1, 1]},
            shape=(i.shape[0], 1),
            dtype=np.int32,
            signature=sig_i,
        )
    )
    row = (
        ctx.const(j.data.reshape(1, -1))
        if j.is_const
        else emit.op(
            ctx,
            "RESHAPE",
            [j, emit.int32(ctx, [1, -1])],
            {"newShape": [1, -1]},
            shape=(1, j.shape[0]),
            dtype=np.int32,
            signature=sig_j,
        )
    )
    return emit.binary(ctx, "LESS_EQUAL", row, column, dtype=np.bool_)
