"""Dynamic shapes in `torch.compile(backend="tpu")`: bucketed programs with masking.

With `dynamic=True`, `torch._dynamo.mark_dynamic` or Dynamo's automatic dynamic shapes,
AOTAutograd hands over graphs whose sizes are symbols (`s0`). XLA compiles static
shapes, so each symbol's value is rounded up to a *bucket* (powers of two by default,
or the user's list: `set_buckets`, `using_buckets`, or
`torch.compile(..., options={"buckets": [...]})`); inputs are zero-padded to the
bucket, one program runs per bucket combination, and outputs are sliced back.
A loop over many lengths thus compiles at most one program per bucket (per graph).

Padding must never change a result. Positions past a symbol's true size ("padded
positions") hold garbage; an op that only computes row by row along a symbolic dim
(pointwise ops, views, a matmul's batch or output rows, layer norm over other dims)
keeps the garbage in padded positions. An op that *combines* values along a symbolic
dim (sum, mean, softmax, a matmul contracting it, weight gradients) gets inputs masked
with the neutral element there (0 for sums and contractions, -inf for softmax, the
ignore index for `nll_loss` targets) and means divide by the true count. The true
sizes enter each program as traced scalars, so they do not multiply programs; sizes
used as values (`grad / n` in a mean's backward) are the true ones, sizes used as
shapes the padded ones.

A reshape that merges a symbolic dim with outer dims (`[b, s, d] -> [b*s, d]`) puts
padding between rows; the merged dim's *layout* (its factors, `(b, s)`) says where,
for masks, padding and cropping (see "layouts of merged dims" below).

Whatever the plan cannot prove safe is not padded: an op outside the known families
touching a symbolic dim, reshapes whose layouts disagree, `cat` along a symbolic dim
or slicing it other than from a constant start, a symbolic size used as an index or
offset, a size expression that is neither `c * s + k` nor a recorded layout. The
symbols involved are then *pinned*: that graph compiles one exact-shape program per
size, as before, and an `ExactShapesWarning` names them and why (`BucketPlan.pinned`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
import torch.fx

from tpu_backend.compile.interpreter import GraphFunction, GraphProgram

aten = torch.ops.aten

# --------------------------------------------------------------------- bucket policy


class ExactShapesWarning(UserWarning):
    """A symbolic size is compiled exactly (per value): padding it could change a result."""


class Buckets:
    """Which padded size a symbolic dim of true size `n` gets.

    `Buckets.powers_of_two(minimum=1)` (the default): the next power of two, at least
    `minimum`. `Buckets([16, 32, 64])`: the smallest listed size >= n; a size above the
    largest is not padded (an exact-shape program for it).

    `exact_first`: the first values each symbol takes in a graph run at their own size, the
    later ones at their bucket (2 by default for powers of two, 0 for a list). A training
    set's last, smaller batch makes Dynamo compile the batch dim as a symbol, and the full
    batches after it would otherwise run padded to a power of two (5 rows as 8) for the
    rest of training.
    """

    def __init__(self, sizes: Iterable[int] | None = None, *, minimum: int = 1, exact_first: int = 0):
        self.sizes = None if sizes is None else sorted({int(s) for s in sizes})
        if self.sizes is not None and (not self.sizes or self.sizes[0] < 1):
            raise ValueError(f"buckets must be positive sizes, got {sizes!r}")
        self.minimum = minimum
        self.exact_first = exact_first

    @classmethod
    def powers_of_two(cls, minimum: int = 1, exact_first: int = 2) -> "Buckets":
        return cls(None, minimum=minimum, exact_first=exact_first)

    def __call__(self, n: int) -> int:
        if self.sizes is None:
            return max(self.minimum, 1 << max(0, int(n) - 1).bit_length())
        return next((s for s in self.sizes if s >= n), int(n))

    def __repr__(self) -> str:
        if self.sizes is None:
            return f"Buckets.powers_of_two({self.minimum}, exact_first={self.exact_first})"
        return f"Buckets({self.sizes}, exact_first={self.exact_first})"


def as_buckets(value) -> Buckets | None:
    """`Buckets`, a list of sizes, "pow2"/"powers_of_two", or None/"exact" (no padding)."""
    if value is None or value == "exact":
        return None
    if isinstance(value, Buckets):
        return value
    if value in ("pow2", "powers_of_two"):
        return Buckets.powers_of_two()
    if isinstance(value, (list, tuple)):
        return Buckets(value)
    raise ValueError(f"buckets: expected a list of sizes, 'powers_of_two' or None, got {value!r}")


_POLICY: list[Buckets | None] = [Buckets.powers_of_two()]


def set_buckets(value) -> None:
    """The process-wide bucket policy for symbolic sizes (None: one exact program per size)."""
    _POLICY[0] = as_buckets(value)


def buckets() -> Buckets | None:
    return _POLICY[0]


@contextlib.contextmanager
def using_buckets(value):
    """`with using_buckets([8, 16, 32]):` graphs compiled inside use this policy."""
    previous = _POLICY[0]
    _POLICY[0] = as_buckets(value)
    try:
        yield
    finally:
        _POLICY[0] = previous


# --------------------------------------------------------------------- symbolic sizes


def _expr(size) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _linear_in_one_symbol(expr: sympy.Expr):
    """(c, s) when `expr` is `c * s` for a symbol s and a positive integer c, else None."""
    if isinstance(expr, sympy.Symbol):
        return 1, expr
    if isinstance(expr, sympy.Mul) and len(expr.args) == 2:
        coefficient, symbol = sorted(expr.args, key=lambda a: not a.is_Integer)
        if coefficient.is_Integer and int(coefficient) > 0 and isinstance(symbol, sympy.Symbol):
            return int(coefficient), symbol
    return None


def _affine_in_one_symbol(expr: sympy.Expr):
    """(c, s, k) when `expr` is `c * s + k` for a symbol s, a positive integer c and an
    integer k (`s + 1`: labels padded by one to be shifted, `s - 1`: a shifted sequence)."""
    if len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    c = sympy.expand(expr).coeff(symbol)
    k = sympy.expand(expr - c * symbol)
    if c.is_Integer and int(c) > 0 and k.is_Integer:
        return int(c), symbol, int(k)
    return None


def _is_symbolic_scalar(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(value.node.expr.free_symbols)


def evaluate(expr: sympy.Expr, env: dict):
    """A size expression with symbols bound in `env` (Python ints, or traced JAX scalars)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Rational:
        return float(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    args = [evaluate(a, env) for a in expr.args]
    traced = any(isinstance(a, jax.Array) for a in args)
    name = type(expr).__name__
    if isinstance(expr, sympy.Add):
        return _fold(operator.add, args)
    if isinstance(expr, sympy.Mul):
        return _fold(operator.mul, args)
    if isinstance(expr, sympy.Pow):
        return args[0] ** args[1]
    if name in ("FloorDiv", "IntTrueDiv", "CleanDiv"):
        return args[0] // args[1]
    if name in ("Mod", "PythonMod"):
        return args[0] % args[1]
    if name in ("Max",):
        return _fold(jnp.maximum if traced else max, args)
    if name in ("Min",):
        return _fold(jnp.minimum if traced else min, args)
    if isinstance(expr, sympy.core.relational.Relational):
        compare = {
            "==": operator.eq,
            "!=": operator.ne,
            "<": operator.lt,
            "<=": operator.le,
            ">": operator.gt,
            ">=": operator.ge,
        }
        return compare[expr.rel_op](args[0], args[1])
    raise NotImplementedError(f"size expression {expr} ({name})")


def _fold(fn, args):
    result = args[0]
    for a in args[1:]:
        result = fn(result, a)
    return result


class Sized:
    """A symbolic size inside a bucketed program: `padded` (a Python int, for shapes)
    and `true` (a traced int32 scalar, for arithmetic)."""

    __slots__ = ("padded", "true")

    def __init__(self, padded, true):
        self.padded, self.true = padded, true


# --------------------------------------------------------------------- the plan


@dataclass
class BucketPlan:
    """What bucketing does with one graph.

    `symbols`: every size symbol, bound at call time from the inputs; `pinned`: symbol ->
    why it is not padded; `masks`: node -> the masking rule applied before its lowering.
    """

    symbols: list[sympy.Symbol]
    pinned: dict[sympy.Symbol, str] = field(default_factory=dict)
    masks: dict[torch.fx.Node, "Masking"] = field(default_factory=dict)
    layouts: dict[sympy.Expr, tuple] = field(default_factory=dict)  # merged dims (see `_normalize_layout`)

    @property
    def padded_symbols(self) -> list[sympy.Symbol]:
        return [s for s in self.symbols if s not in self.pinned]


@dataclass(frozen=True)
class Masking:
    """Per tensor argument position: (dims to mask, neutral value), plus an optional
    fix-up of the result (`mean`: rescale from the padded to the true count)."""

    args: tuple[tuple[int, tuple[int, ...], Any], ...]
    rescale_dims: tuple[int, ...] | None = None  # mean: dims averaged over


class _Pin(Exception):
    def __init__(self, symbols, reason):
        self.symbols, self.reason = set(symbols), reason


class _PaddingFailed(Exception):
    """Tracing at padded sizes raised `error`: the program is traced again at exact sizes."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _symbolic_dims(value, pinned, layouts) -> dict[int, frozenset]:
    """dim -> its symbols, for the dims of tensor `value` whose size has unpinned symbols;
    pins the symbols of a size that is neither `c * s` nor laid out by a reshape."""
    if not isinstance(value, torch.Tensor):
        return {}
    dims = {}
    for d, size in enumerate(value.shape):
        expr = _expr(size)
        free = expr.free_symbols - set(pinned)
        if not free:
            continue
        if expr not in layouts and _affine_in_one_symbol(expr) is None:
            raise _Pin(
                free, f"a dim of size {expr} (only c * symbol + k, or a reshape's merge of such dims, can be padded)"
            )
        dims[d] = frozenset(free)
    return dims


# --------------------------------------------------------------------- layouts of merged dims
#
# A dim made by a reshape that merges dims (`[b, s, d] -> [b*s, d]`) holds its padding
# between rows, not at its end. Its *layout* is the row-major list of factors it was
# merged from, `(b, s)`: position i is valid iff each mixed-radix digit of i (radices:
# the padded factors) is below its factor's true size. A dim with no recorded layout is
# padded at its end (`(c*s,)`). Layouts are keyed by size expression, one per graph;
# two reshapes that disagree pin the symbols.


def _normalize_layout(factors) -> tuple:
    """Drop 1s, merge neighbouring integers, and collapse `(s, 4)` to the end-padded `(4*s,)`."""
    merged: list = []
    for f in factors:
        if f == 1:
            continue
        if merged and f.is_Integer and merged[-1].is_Integer:
            merged[-1] = merged[-1] * f
        else:
            merged.append(f)
    dynamic = [i for i, f in enumerate(merged) if not f.is_Integer]
    if dynamic == [0] and _linear_in_one_symbol(sympy.Mul(*merged)) is not None:
        return (sympy.Mul(*merged),)
    return tuple(merged)


def _layout(expr, layouts) -> tuple:
    return layouts.get(expr, (expr,))


def _divides(whole, part) -> bool:
    """`part` is a proper factor of `whole` (`2` of `2*s`, `s` of `4*s`)."""
    quotient = sympy.simplify(whole / part)
    return sympy.fraction(quotient)[1] == 1 and quotient != 1


def _record_reshape_layout(node, layouts: dict, pinned) -> None:
    """Match the factors of a reshape's input and output dims; define the layout of each
    merged output (or split input) dim, or raise `_Pin` when padding cannot stay a
    rectangle of valid positions."""
    x, out = _val(node.args[0]), _val(node)
    in_exprs = [e for e in (_expr(s) for s in x.shape) if e != 1]
    out_exprs = [e for e in (_expr(s) for s in out.shape) if e != 1]
    symbols = set().union(*(e.free_symbols for e in in_exprs + out_exprs)) - set(pinned)
    if not symbols or in_exprs == out_exprs:
        return

    def factors(exprs):
        result = []
        for owner, e in enumerate(exprs):
            result += [[f, owner] for f in _layout(e, layouts)]
        return result

    def fail():
        raise _Pin(symbols, f"a reshape {in_exprs} -> {out_exprs} that would interleave padding")

    left, right = factors(in_exprs), factors(out_exprs)
    assigned = ({i: [] for i in range(len(in_exprs))}, {i: [] for i in range(len(out_exprs))})
    i = j = 0
    while i < len(left) and j < len(right):
        (a, a_owner), (b, b_owner) = left[i], right[j]
        if a == b:
            assigned[0][a_owner].append(a)
            assigned[1][b_owner].append(b)
            i, j = i + 1, j + 1
        elif a.is_Integer and b.is_Integer:
            small, large = (a, b) if a < b else (b, a)
            if large % small:
                fail()
            assigned[0][a_owner].append(small)
            assigned[1][b_owner].append(small)
            if a > b:
                left[i][0], j = a // b, j + 1
            else:
                right[j][0], i = b // a, i + 1
        else:
            # A symbolic factor on one side equals a product of factors on the other.
            for side, (this, this_owner, other, k, mine, theirs) in enumerate(
                ((a, a_owner, right, j, 0, 1), (b, b_owner, left, i, 1, 0))
            ):
                product, end = sympy.Integer(1), k
                while (
                    end < len(other)
                    and sympy.expand(product * other[end][0] - this) != 0
                    and _divides(this, product * other[end][0])
                ):
                    product, end = product * other[end][0], end + 1
                if end < len(other) and sympy.expand(product * other[end][0] - this) == 0:
                    pieces = other[k : end + 1]
                    assigned[mine][this_owner] += [f for f, _ in pieces]  # the finer split is its layout
                    for f, owner in pieces:
                        assigned[theirs][owner].append(f)
                    if side == 0:
                        i, j = i + 1, end + 1
                    else:
                        i, j = end + 1, j + 1
                    break
            else:
                fail()
    if i < len(left) or j < len(right):
        fail()
    # The factors each dim was matched with are its layout: record new ones, check old ones.
    for exprs, matched_side in ((in_exprs, 0), (out_exprs, 1)):
        for owner, e in enumerate(exprs):
            if not e.free_symbols:
                continue
            layout = _normalize_layout(assigned[matched_side][owner])
            known = layouts.get(e)
            if known is None:
                layouts[e] = layout
            elif _normalize_layout(known) != layout:
                fail()


def _tensor_args(node) -> list[tuple[int, torch.fx.Node]]:
    return [(i, a) for i, a in enumerate(node.args) if isinstance(_val(a), torch.Tensor)]


def _normalize(dims, rank) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(d % rank for d in dims))


_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)

# Ops whose result at a position reads inputs only at that position along every dim
# (elementwise with broadcasting, views that keep each dim whole, creation ops).
_ROW_LOCAL = {
    aten.t.default,
    aten.transpose.int,
    aten.permute.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.expand.default,
    aten.alias.default,
    aten.detach.default,
    aten.clone.default,
    aten.copy.default,
    aten._to_copy.default,
    aten.lift_fresh_copy.default,
    aten.embedding.default,
    aten.native_dropout.default,
    aten.native_dropout_backward.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
}


def _rule_row_local(node, dyn):
    return None


def _reduction_rule(dims_arg: int, neutral, *, rescale=False):
    def rule(node, dyn):
        x = _val(node.args[0])
        reduced = _normalize(node.args[dims_arg] if len(node.args) > dims_arg else None, x.dim())
        masked = tuple(d for d in reduced if d in dyn(node.args[0]))
        if not masked:
            return None
        return Masking(((0, masked, neutral),), rescale_dims=reduced if rescale else None)

    return rule


def _full_reduction_rule(neutral, *, rescale=False):
    def rule(node, dyn):
        x = _val(node.args[0])
        masked = tuple(dyn(node.args[0]))
        if not masked:
            return None
        return Masking(((0, masked, neutral),), rescale_dims=tuple(range(x.dim())) if rescale else None)

    return rule


def _softmax_rule(neutral_first):
    """`_softmax`/`_log_softmax` (mask the input with -inf along `dim`) and their
    backwards (mask gradient and output with 0 along `dim`)."""

    def rule(node, dyn):
        dim = node.args[-2] if neutral_first is None else node.args[1]
        dim %= _val(node.args[0]).dim()
        if dim not in dyn(node.args[0]):
            return None
        if neutral_first is None:  # backward: (grad, output, dim, dtype)
            return Masking(((0, (dim,), 0.0), (1, (dim,), 0.0)))
        return Masking(((0, (dim,), neutral_first),))

    return rule


def _contraction_rule(pairs):
    """Matmuls: `pairs` is ((arg, contracted dim), ...); mask both sides with 0 there."""

    def rule(node, dyn):
        if not any(dim % _val(node.args[arg]).dim() in dyn(node.args[arg]) for arg, dim in pairs):
            return None
        return Masking(tuple((arg, (dim % _val(node.args[arg]).dim(),), 0.0) for arg, dim in pairs))

    return rule


def _layer_norm_rule(node, dyn):
    x = _val(node.args[0])
    normalized = range(x.dim() - len(node.args[1]), x.dim())
    inside = [d for d in normalized if d in dyn(node.args[0])]
    if inside:
        raise _Pin(set().union(*(dyn(node.args[0])[d] for d in inside)), "layer norm over a symbolic dim")
    return None


def _layer_norm_backward_rule(node, dyn):
    """Weight and bias gradients sum over the leading dims: mask grad, input, mean, rstd."""
    x = _val(node.args[1])
    leading = x.dim() - len(node.args[2])
    inside = [d for d in range(leading, x.dim()) if d in dyn(node.args[1])]
    if inside:
        raise _Pin(set().union(*(dyn(node.args[1])[d] for d in inside)), "layer norm over a symbolic dim")
    masked = tuple(d for d in range(leading) if d in dyn(node.args[1]))
    if not masked:
        return None
    return Masking(((0, masked, 0.0), (1, masked, 0.0), (3, masked, 0.0), (4, masked, 0.0)))


def _target_rows_as_input_rows(node, dyn, input_at: int, target_at: int) -> None:
    """`nll_loss` does not make its target's rows the same size as its input's: labels
    that came in with symbolic sizes beside logits of a static size (automatic dynamic
    shapes marked only the labels) would be padded alone. Their symbols are pinned."""
    target_rows = dyn(node.args[target_at]).get(0)
    if target_rows and _val(node.args[input_at]).dim() > 1 and 0 not in dyn(node.args[input_at]):
        raise _Pin(target_rows, f"{node.target}: a target of symbolic size beside an input of static size")


def _nll_loss_rule(node, dyn):
    """Padded rows get the ignore index: they add nothing to the loss nor to its count."""
    _target_rows_as_input_rows(node, dyn, 0, 1)
    reduction, ignore_index = node.args[3], node.args[4]
    target_dims = tuple(dyn(node.args[1]))
    if not target_dims or reduction == 0:
        return None
    return Masking(((1, target_dims, ignore_index), (0, tuple(dyn(node.args[0])), 0.0)))


def _nll_loss_backward_rule(node, dyn):
    _target_rows_as_input_rows(node, dyn, 1, 2)
    return None


def _batch_dim_only(*arg_positions, mask_for_weights=()):
    """Convolution/group norm: padding along the batch dim (0) is row-local; the weight
    gradients of their backwards sum over it (mask those arguments with 0)."""

    def rule(node, dyn):
        for position in arg_positions:
            spatial = [d for d in dyn(node.args[position]) if d != 0]
            if spatial:
                raise _Pin(
                    set().union(*(dyn(node.args[position])[d] for d in spatial)),
                    f"{node.target} over a symbolic non-batch dim",
                )
        masked = tuple((p, (0,), 0.0) for p in mask_for_weights if 0 in dyn(node.args[p]))
        return Masking(masked) if masked else None

    return rule


def _embedding_backward_rule(node, dyn):
    masked = tuple(dyn(node.args[0]))
    return Masking(((0, masked, 0.0),)) if masked else None


def _cat_rule(node, dyn):
    """Along a symbolic dim, pinned: the padding of every piece but the last would sit inside.
    A 1-d empty piece (a cache that starts empty: `torch.cat([self.keys, k], -2)`) is skipped
    by `cat`, so one other piece is the result, padding and all."""
    dim = node.args[1] if len(node.args) > 1 else 0
    pieces = [t for t in node.args[0] if not (_val(t) is not None and tuple(_val(t).shape) == (0,))]
    if len(pieces) < 2:
        return None
    for tensor in pieces:
        value = _val(tensor)
        if value is not None and value.dim() and dim % value.dim() in dyn(tensor):
            raise _Pin(dyn(tensor)[dim % value.dim()], "cat along a symbolic dim")
    return None


def _slice_rule(node, dyn):
    """Along a symbolic dim padded at its end, a slice from a constant start >= 0 with step 1
    keeps the true positions first (`labels[..., 1:]`, `logits[:, :-1]`: its end, a size, is
    evaluated padded, the result is padded at its end). Anything else is pinned."""
    x = _val(node.args[0])
    dim = (node.args[1] if len(node.args) > 1 else 0) % x.dim()
    if dim not in dyn(node.args[0]):
        return None
    start = node.args[2] if len(node.args) > 2 else None
    step = node.args[4] if len(node.args) > 4 else 1
    if not (start is None or (type(start) is int and start >= 0)) or step != 1 or not _padded_at_its_end(x, dim):
        raise _Pin(dyn(node.args[0])[dim], "slicing along a symbolic dim")
    return None


def _slice_scatter_rule(node, dyn):
    """`slice_scatter(base, src, dim, start, end, step)` along a dim padded at its end, from a
    constant start >= 0 with step 1: the source's true positions land on the base's true
    ones; its padded ones land past them where the source reaches the base's end
    (`shifted[:, 1:] = ids[:, :-1]`, seq2seq models' decoder inputs) or where it has none."""
    base, source = _val(node.args[0]), _val(node.args[1])
    dim = (node.args[2] if len(node.args) > 2 else 0) % base.dim()
    if dim not in dyn(node.args[0]) and dim not in dyn(node.args[1]):
        return None
    start = node.args[3] if len(node.args) > 3 else None
    step = node.args[5] if len(node.args) > 5 else 1
    start = 0 if start is None else start
    reaches_end = sympy.expand(_expr(source.shape[dim]) + start - _expr(base.shape[dim])) == 0
    if not (
        type(start) is int
        and start >= 0
        and step == 1
        and _padded_at_its_end(base, dim)
        and (reaches_end or dim not in dyn(node.args[1]))
    ):
        symbols = dyn(node.args[0]).get(dim, frozenset()) | dyn(node.args[1]).get(dim, frozenset())
        raise _Pin(symbols, "slice_scatter along a symbolic dim")
    return None


def _prefix_rule(node, dyn):
    """`cumsum` and its kind: position i reads positions <= i, so along a dim padded at its
    end the true positions read true ones only (row-local along the other dims)."""
    x = _val(node.args[0])
    dim = node.args[1] % max(x.dim(), 1)
    if dim in dyn(node.args[0]) and not _padded_at_its_end(x, dim):
        raise _Pin(dyn(node.args[0])[dim], f"{node.target} along a merged symbolic dim")
    return None


def _constant_pad_rule(node, dyn):
    """`constant_pad_nd` along a dim padded at its end: padding or cropping before shifts the
    true positions as a whole, cropping after takes padded positions first (a true one only
    where there is no padding left, as it should); padding after would land past the
    garbage, so the input's padded positions are filled with the value first (the true ones
    then end with it: transformers' `pad(labels, (0, 1), value=-100)` before a shift)."""
    x = _val(node.args[0])
    pads, value = node.args[1], node.args[2] if len(node.args) > 2 else 0
    filled = []
    for i in range(len(pads) // 2):
        dim = x.dim() - 1 - i
        before, after = pads[2 * i], pads[2 * i + 1]
        if dim not in dyn(node.args[0]) or (before == 0 and after == 0):
            continue
        if not (type(before) is int and type(after) is int and _padded_at_its_end(x, dim)):
            raise _Pin(dyn(node.args[0])[dim], "constant_pad_nd by a size or along a merged symbolic dim")
        if after > 0:
            filled.append(dim)
    return Masking(((0, tuple(filled), value),)) if filled else None


def _padded_at_its_end(value, dim: int) -> bool:
    """Whether `value`'s symbolic `dim` is one symbol plus a constant (`s`, `s + 1`), padded
    at its end: its positions below the true size are the true ones (a merged dim has
    padding between its rows)."""
    affine = _affine_in_one_symbol(_expr(value.shape[dim]))
    return affine is not None and affine[0] == 1


def _select_rule(node, dyn):
    """`x[:, i]` along a symbolic dim: a constant i >= 0 reads the true position (Dynamo
    guards i < size: BERT's pooler `hidden[:, 0]`), and `select_scatter` writes it (seq2seq
    models' decoder start token); a negative or symbolic index would reach padding."""
    x = _val(node.args[0])
    at = 2 if node.target is aten.select_scatter.default else 1  # (select_scatter(x, source, dim, index))
    dim, index = node.args[at] % x.dim(), node.args[at + 1]
    if dim in dyn(node.args[0]) and not (type(index) is int and index >= 0 and _padded_at_its_end(x, dim)):
        raise _Pin(dyn(node.args[0])[dim], "indexing into a symbolic dim")
    return None


def _gather_rule(node, dyn):
    """`gather(x, dim, index)`: each position reads `index` there and `x` at the same position
    along the other dims (row-local), and along `dim` at the position `index` holds: the true
    one when a symbolic `dim` of `x` is padded at its end (BERT's token types gathered by
    position)."""
    x = _val(node.args[0])
    dim = node.args[1] % x.dim()
    if dim in dyn(node.args[0]) and not _padded_at_its_end(x, dim):
        raise _Pin(dyn(node.args[0])[dim], "gather along a merged symbolic dim")
    return None


def _reshape_rule(node, dyn):
    return None  # layouts are matched beforehand (`_record_reshape_layout`)


def _triangle_rule(node, dyn):
    """`tril`/`triu` compare row and column indices: right for dims padded at their end (a
    position's index is its true index), not for merged dims (padding between rows)."""
    x = _val(node.args[0])
    for d in (x.dim() - 2, x.dim() - 1):
        if d in dyn(node.args[0]) and not _padded_at_its_end(x, d):
            raise _Pin(dyn(node.args[0])[d], f"{node.target} over a merged dim of size {_expr(x.shape[d])}")
    return None


def _index_rule(node, dyn):
    """`x[i, j]` with index tensors: each position reads the indices there and `x` at the
    positions they hold, the true ones along symbolic dims of `x` padded at their end
    (transformers' masks read `attention_mask[batch, kv]` with index ranges)."""
    x = _val(node.args[0])
    for dim, index in enumerate(node.args[1]):
        if index is not None and dim in dyn(node.args[0]) and not _padded_at_its_end(x, dim):
            raise _Pin(dyn(node.args[0])[dim], "indexing a merged symbolic dim")
    return None


def _scatter_back_rule(node, dyn):
    """`select_backward` / `slice_backward` (grad, input_sizes, dim, ...): zeros of the input's
    shape with the gradient written at an index or range of `dim`, row-local along the other
    dims. Along a symbolic dim padded at its end, from a constant index or start >= 0, they
    write the true positions (as `_select_rule` and `_slice_rule` read them)."""
    out = _val(node)
    dim = node.args[2] % out.dim()
    if dim not in dyn(node):  # the node's own output
        return None
    index = node.args[3]
    step = node.args[5] if node.target is aten.slice_backward.default and len(node.args) > 5 else 1
    if not (type(index) is int and index >= 0 and step == 1 and _padded_at_its_end(out, dim)):
        raise _Pin(dyn(node)[dim], f"{node.target} along a symbolic dim")
    if node.target is aten.slice_backward.default and dim in dyn(node.args[0]):
        # the gradient's padded positions would land on true ones past the slice: zeros
        return Masking(((0, (dim,), 0.0),))
    return None


def _whole_along(*places):
    """A kernel (tpu_backend/kernel_ops.py) that reads every position of the dims in
    `places`, ((arg, (dim, ...)), ...): their symbols are pinned; the other dims are
    row-local (each row's result reads that row only)."""

    def rule(node, dyn):
        for arg, dims in places:
            value = _val(node.args[arg])
            if value is None:
                continue
            symbolic = [d for d in dims if value.dim() and d % value.dim() in dyn(node.args[arg])]
            if symbolic:
                symbols = set().union(*(dyn(node.args[arg])[d % value.dim()] for d in symbolic))
                raise _Pin(symbols, f"{node.target} over a symbolic dim {symbolic[0]} of argument {arg}")
        return None

    return rule


def _norm_backward_rule(node, dyn):
    """tpu_kernels.norm_backward(dy, dh, h, weight, bias, ...): the weight and bias gradients
    sum over the rows (every dim but the last): mask dy and h with 0 there."""
    _whole_along((2, (-1,)))(node, dyn)
    rows = tuple(d for d in dyn(node.args[2]) if d != _val(node.args[2]).dim() - 1)
    return Masking(((0, rows, 0.0), (2, rows, 0.0))) if rows else None


_RULES: dict[Any, Callable] = {
    aten.sum.dim_IntList: _reduction_rule(1, 0.0),
    aten.sum.default: _full_reduction_rule(0.0),
    aten.mean.dim: _reduction_rule(1, 0.0, rescale=True),
    aten.mean.default: _full_reduction_rule(0.0, rescale=True),
    aten.amax.default: _reduction_rule(1, -math.inf),
    aten.amin.default: _reduction_rule(1, math.inf),
    aten._softmax.default: _softmax_rule(-math.inf),
    aten._log_softmax.default: _softmax_rule(-math.inf),
    aten._safe_softmax.default: _softmax_rule(-math.inf),
    aten._softmax_backward_data.default: _softmax_rule(None),
    aten._log_softmax_backward_data.default: _softmax_rule(None),
    aten.mm.default: _contraction_rule(((0, 1), (1, 0))),
    aten.bmm.default: _contraction_rule(((0, 2), (1, 1))),
    aten.addmm.default: _contraction_rule(((1, 1), (2, 0))),
    aten.native_layer_norm.default: _layer_norm_rule,
    aten.native_layer_norm_backward.default: _layer_norm_backward_rule,
    aten.nll_loss_forward.default: _nll_loss_rule,
    aten.nll_loss_backward.default: _nll_loss_backward_rule,
    aten.embedding_dense_backward.default: _embedding_backward_rule,
    aten.convolution.default: _batch_dim_only(0),
    aten.convolution_backward.default: _batch_dim_only(0, 1, mask_for_weights=(0, 1)),
    aten.native_group_norm.default: _batch_dim_only(0),
    aten.native_group_norm_backward.default: _batch_dim_only(0, 1, mask_for_weights=(0, 1, 2, 3)),
    aten.cat.default: _cat_rule,
    aten.slice.Tensor: _slice_rule,
    aten.constant_pad_nd.default: _constant_pad_rule,
    aten.slice_scatter.default: _slice_scatter_rule,
    aten.cumsum.default: _prefix_rule,
    aten.cumprod.default: _prefix_rule,
    aten.logcumsumexp.default: _prefix_rule,
    aten.select.int: _select_rule,
    aten.select_scatter.default: _select_rule,
    aten.gather.default: _gather_rule,
    aten.index.Tensor: _index_rule,
    aten.tril.default: _triangle_rule,
    aten.triu.default: _triangle_rule,
    aten.select_backward.default: _scatter_back_rule,
    aten.slice_backward.default: _scatter_back_rule,
    aten.view.default: _reshape_rule,
    aten._unsafe_view.default: _reshape_rule,
    aten.reshape.default: _reshape_rule,
}
_RULES.update((op, _rule_row_local) for op in _ROW_LOCAL)
# Creation ops: each position's value does not depend on the size (`arange(s)` gets the padded
# length; positions past the true size are garbage like any other's).
_CREATION = (
    *_ARANGES, aten.ones.default, aten.zeros.default, aten.full.default, aten.empty.memory_format,
    aten.empty_strided.default, aten.new_ones.default, aten.new_zeros.default, aten.new_full.default,
    aten.new_empty.default, aten.fill.Scalar, aten.fill.Tensor, aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default,
    aten.full_like.default,
)  # fmt: skip
_RULES.update((op, _rule_row_local) for op in _CREATION)

# The kernels' custom ops, by schema name (they exist once tpu_backend.kernel_ops is imported).
_KERNEL_RULES: dict[str, Callable] = {
    "tpu_kernels::norm": _whole_along((0, (-1,))),  # each row normalised over its last dim
    "tpu_kernels::norm_backward": _norm_backward_rule,
    "tpu_kernels::cross_entropy": _whole_along((0, (-1,))),  # each row's loss over the vocabulary
    "tpu_kernels::cross_entropy_backward": _whole_along((1, (-1,))),
    # queries row by row; keys and values whole (a padded key would get attention weight)
    "tpu_kernels::flash_attention": _whole_along((0, (-1,)), (1, (-2, -1)), (2, (-2, -1))),
    # dk and dv sum over the queries too
    "tpu_kernels::flash_attention_backward": _whole_along((1, (-2, -1)), (2, (-2, -1)), (3, (-2, -1))),
}


def _rule_for(target):
    if target in _RULES:
        return _RULES[target]
    if isinstance(target, torch._ops.OpOverload) and target._schema.name in _KERNEL_RULES:
        return _KERNEL_RULES[target._schema.name]
    if isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags:
        return _rule_row_local
    return None


def _graph_symbols(gm: torch.fx.GraphModule) -> list[sympy.Symbol]:
    symbols = set()
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor):
                for size in v.shape:
                    symbols |= _expr(size).free_symbols
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                symbols |= v.node.expr.free_symbols
    return sorted(symbols, key=str)


def _bindable(gm, symbols) -> dict[sympy.Symbol, str]:
    """Symbols that no input names directly (a SymInt placeholder or a `c * s` dim)."""
    bound = set()
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
            bound.add(value.node.expr)
        elif isinstance(value, torch.Tensor):
            for size in value.shape:
                linear = _linear_in_one_symbol(_expr(size))
                if linear is not None:
                    bound.add(linear[1])
    return {s: "no input gives its value" for s in symbols if s not in bound}


def plan_bucketing(gm: torch.fx.GraphModule) -> BucketPlan:
    """Which symbols can be padded in `gm` and how each combining op is masked."""
    symbols = _graph_symbols(gm)
    plan = BucketPlan(symbols, pinned=_bindable(gm, symbols))
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes):
        plan.pinned.update((s, "control flow in the graph") for s in symbols)
    shared = _shared_layouts(gm)
    while True:
        try:
            plan.layouts = _reshape_layouts(gm, plan.pinned, shared)
            plan.masks = _masks(gm, plan.pinned, plan.layouts)
            shared.update(plan.layouts)
            return plan
        except _Pin as pin:
            plan.pinned.update((s, pin.reason) for s in pin.symbols)


def _shared_layouts(gm: torch.fx.GraphModule) -> dict:
    """The layouts earlier graphs of the same trace recorded (kept on their shared ShapeEnv).

    A backward graph receives the forward's saved activations, cropped to their true sizes
    by the forward's layouts, and must pad them back the same way: a flattened `[b*s]`
    target saved from the forward has no reshape in the backward to say where its padding
    goes, while the logits it is read with, row by row, do (`[b, s, v] -> [b*s, v]`)."""
    for node in gm.graph.nodes:
        values = node.meta.get("val")
        for value in values if isinstance(values, (list, tuple)) else [values]:
            sizes = value.shape if isinstance(value, torch.Tensor) else [value]
            for size in sizes:
                if isinstance(size, torch.SymInt):
                    shape_env = size.node.shape_env
                    if not hasattr(shape_env, "tpu_bucket_layouts"):
                        shape_env.tpu_bucket_layouts = {}
                    return shape_env.tpu_bucket_layouts
    return {}


_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)

# Ops whose integer arguments are sizes of what they make (padded is right); any other
# integer argument holding a symbolic size is an index or offset (`narrow(x, 0, n, 2)`),
# where the padded value would read other positions. `slice`'s end is a size too (a
# prefix, cropped to the true length afterwards); its start is not, nor the start and the
# index of `slice` and `select`'s backwards (GPT-2's `hidden[:, -logits_to_keep:]` under
# `dynamic=True`: a padded start wrote the gradient into the last row only).
_SIZE_ARGUMENT_OPS = {
    *_RESHAPES, aten.expand.default, aten.new_zeros.default, aten.new_ones.default,
    aten.new_empty.default, aten.new_full.default, aten.full.default, aten.zeros.default,
    aten.ones.default, aten.empty.memory_format, aten.empty_strided.default,
    *_ARANGES, aten.native_group_norm.default, aten.native_group_norm_backward.default,
    aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
    aten.split.Tensor, aten.split_with_sizes.default, aten.embedding_dense_backward.default,
    aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
}  # fmt: skip


_SIZE_ARGUMENTS = {  # the size arguments of ops whose other integer arguments are offsets
    aten.slice.Tensor: {"end"},
    aten.slice_backward.default: {"input_sizes", "end"},
    aten.select_backward.default: {"input_sizes"},
}


def _check_size_arguments(node, pinned) -> None:
    """Pin the symbols of a symbolic size passed where the op reads an index or offset."""
    if node.target in _SIZE_ARGUMENT_OPS:
        return
    schema = node.target._schema.arguments
    named = [(schema[i], a) for i, a in enumerate(node.args) if i < len(schema)]
    named += [(next((s for s in schema if s.name == k), None), a) for k, a in node.kwargs.items()]
    for argument, value in named:
        if argument is None or not _wants_size(argument.type):
            continue  # numbers (Scalar) get the true value
        if argument.name in _SIZE_ARGUMENTS.get(node.target, ()):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            meta = _val(item)
            if _is_symbolic_scalar(meta) and meta.node.expr.free_symbols - set(pinned):
                raise _Pin(meta.node.expr.free_symbols - set(pinned), f"{node.target} takes a size as {argument.name}")


def _reshape_layouts(gm, pinned, known: dict) -> dict:
    layouts = {expr: layout for expr, layout in known.items() if expr.free_symbols.isdisjoint(pinned)}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _RESHAPES:
            _record_reshape_layout(node, layouts, pinned)
    return layouts


def _masks(gm, pinned, layouts) -> dict:
    cache: dict = {}

    def dyn(arg):
        if arg not in cache:
            cache[arg] = _symbolic_dims(_val(arg), pinned, layouts)
        return cache[arg]

    masks = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        value = node.meta.get("val")
        outputs = value if isinstance(value, (list, tuple)) else [value]
        touched = {}
        for _, arg in _tensor_args(node):
            touched.update(dyn(arg))
        for out in outputs:
            touched.update(_symbolic_dims(out, pinned, layouts))
        if isinstance(node.target, (list, tuple)) or not isinstance(node.target, torch._ops.OpOverload):
            continue  # getitem, size arithmetic: evaluated from their expressions
        for arg in node.args:
            if isinstance(arg, (list, tuple)):  # tensor lists (cat, stack)
                for item in arg:
                    if isinstance(_val(item), torch.Tensor):
                        touched.update(dyn(item))
        if not touched:
            continue
        _check_size_arguments(node, pinned)
        rule = _rule_for(node.target)
        if rule is None:
            raise _Pin(set().union(*touched.values()), f"{node.target} has no padding rule")
        masking = rule(node, dyn)
        if masking is not None:
            masks[node] = masking
    return masks


# --------------------------------------------------------------------- the bucketed function


def _wants_size(schema_type) -> bool:
    """A schema argument that takes sizes/indices (padded) rather than a number (true)."""
    return "int" in str(schema_type).lower()


class BucketedGraphFunction(GraphFunction):
    """`GraphFunction` run at padded sizes: `fn([key,] padded_sizes, *inputs, *true_sizes)`.

    `padded_sizes` (a static tuple) and `true_sizes` (int32 scalars) follow
    `plan.symbols`. Inputs arrive padded; outputs leave padded (the caller slices).
    """

    def __init__(self, gm: torch.fx.GraphModule, name: str, plan: BucketPlan):
        super().__init__(gm, name)
        self.plan = plan

    def __call__(self, *args):
        key = None
        if self.needs_rng:
            key, *args = args
        padded_sizes, *rest = args
        n = len(self.placeholders)
        inputs, true_sizes = rest[:n], rest[n:]
        self._padded = dict(zip(self.plan.symbols, padded_sizes))
        self._true = dict(zip(self.plan.symbols, true_sizes))
        inputs = [
            self._sized(ph.meta.get("val")) if _is_symbolic_scalar(ph.meta.get("val")) else value
            for ph, value in zip(self.placeholders, inputs)
        ]
        try:
            new_key, outputs = self.run(inputs, key)
        except Exception as error:
            if self.plan.padded_symbols:
                raise _PaddingFailed(error) from error
            raise
        outputs = type(outputs)(None if isinstance(o, Sized) else o for o in outputs)
        return (new_key, outputs) if self.needs_rng else outputs

    def _sized(self, value):
        expr = value.node.expr
        if isinstance(value, torch.SymBool):
            return bool(evaluate(expr, self._padded))
        return Sized(evaluate(expr, self._padded), evaluate(expr, self._true))

    def _evaluate(self, node, env, state):
        value = node.meta.get("val")
        if node.op == "call_function" and _is_symbolic_scalar(value):
            return self._sized(value)
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            return super()._evaluate(node, _Padded(env), state)
        schema = node.target._schema.arguments
        ranges = node.target in _ARANGES  # their Scalar bounds are sizes: `arange(s)` has s elements
        args = [
            self._argument(a, env, schema[i].type if i < len(schema) else None, ranges) for i, a in enumerate(node.args)
        ]
        by_name = {a.name: a.type for a in schema}
        kwargs = {k: self._argument(v, env, by_name.get(k), ranges) for k, v in node.kwargs.items()}
        masking = self.plan.masks.get(node)
        if masking is not None:
            for position, dims, neutral in masking.args:
                args[position] = self._mask(args[position], _val(node.args[position]), dims, neutral)
        lowering = self._lowering(node.target)
        if lowering.needs_rng:
            state["key"], kwargs["key"] = jax.random.split(state["key"])
        try:
            result = lowering.fn(*args, **kwargs)
        except Exception as error:
            error.add_note(
                f"tpu: while lowering {node.target} in bucketed graph {self.name!r}, node: {node.format_node()}"
            )
            raise
        if masking is not None and masking.rescale_dims is not None:
            result = self._rescale_mean(result, _val(node.args[0]), masking.rescale_dims)
        return result

    @staticmethod
    def _lowering(target):
        from tpu_backend.compile.interpreter import lowering_for

        return lowering_for(target)

    def _argument(self, value, env, schema_type, scalars_are_sizes=False):
        value = _map(value, env)
        wants_size = schema_type is not None and (scalars_are_sizes or _wants_size(schema_type))
        return _resolve(value, wants_size)

    def _extent(self, size):
        """(padded, true) extent of one dim."""
        expr = _expr(size)
        if not expr.free_symbols:
            return int(expr), int(expr)
        return evaluate(expr, self._padded), evaluate(expr, self._true)

    def _mask(self, x, meta, dims, neutral):
        keep = None
        for d in dims:
            inside = self._valid(_expr(meta.shape[d]), x.ndim, d, x.shape[d])
            if inside is not None:
                keep = inside if keep is None else keep & inside
        if keep is None:
            return x
        return jnp.where(keep, x, jnp.asarray(neutral, dtype=x.dtype))

    def _valid(self, expr, rank, d, padded_size):
        """Boolean (broadcastable along dim d) of the valid positions of a dim, or None if all are."""
        shape = [1] * rank
        shape[d] = padded_size
        position = jax.lax.broadcasted_iota(jnp.int32, shape, d)
        keep = None
        for factor in reversed(self.plan.layouts.get(expr, (expr,))):  # mixed radix, innermost first
            padded, true = evaluate(factor, self._padded), evaluate(factor, self._true)
            digit = position % padded
            position = position // padded
            if isinstance(true, int) and true == padded:
                continue
            inside = digit < true
            keep = inside if keep is None else keep & inside
        return keep

    def _rescale_mean(self, result, meta, dims):
        padded_count, true_count = 1, 1
        for d in dims:
            padded, true = self._extent(meta.shape[d])
            padded_count, true_count = padded_count * padded, true_count * true
        return (result * (padded_count / jnp.asarray(true_count, result.dtype))).astype(result.dtype)


class _Padded(dict):
    """The environment seen by nodes evaluated the ordinary way: sizes are padded."""

    def __init__(self, env):
        super().__init__()
        self.env = env

    def __getitem__(self, node):
        value = self.env[node]
        return value.padded if isinstance(value, Sized) else value


def _map(value, env):
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, env) for v in value)
    return value


def _resolve(value, wants_size):
    if isinstance(value, Sized):
        return value.padded if wants_size else value.true
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, wants_size) for v in value)
    return value


# --------------------------------------------------------------------- at call time


def _bind(plan: BucketPlan, placeholders, args) -> dict:
    """Each symbol's true value, read from the inputs."""
    true = {}
    for ph, arg in zip(placeholders, args):
        value = ph.meta.get("val")
        if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
            true[value.node.expr] = int(arg)
        elif isinstance(value, torch.Tensor) and isinstance(arg, torch.Tensor):
            for size, actual in zip(value.shape, arg.shape):
                linear = _linear_in_one_symbol(_expr(size))
                if linear is not None:
                    true[linear[1]] = actual // linear[0]
    return true


def _factor_shape(meta_shape, layouts, env) -> list[int]:
    """The array's shape with each merged dim split into its layout's factors, under `env`."""
    shape = []
    for size in meta_shape:
        expr = _expr(size)
        shape += [evaluate(f, env) for f in layouts.get(expr, (expr,))]
    return shape


def _resizing(meta_shape, layouts, have_env, want_env) -> tuple | None:
    """How an array of `meta_shape` sized by `have_env` becomes sized by `want_env`: (its
    factored shape, the factored shape wanted, the final shape), each merged dim split into
    its layout's factors (an end-padded dim is one factor); None when it already is."""
    have, want = _factor_shape(meta_shape, layouts, have_env), _factor_shape(meta_shape, layouts, want_env)
    if have == want:
        return None
    return tuple(have), tuple(want), tuple(evaluate(_expr(s), want_env) for s in meta_shape)


@functools.lru_cache(maxsize=512)
def _resizer(plans: tuple) -> Callable:
    """One jitted function that zero-pads or crops each array to its plan's shape (a new true
    size compiles one program for all the arrays of a call, not one per array: 75 crops of a
    BERT step's outputs took 0.4 s of compiling on the CPU backend, more on a TPU)."""

    def resize(*arrays):
        out = []
        for array, (have, want, final) in zip(arrays, plans):
            array = array.reshape(have)
            if all(w >= h for h, w in zip(have, want)):
                array = jnp.pad(array, [(0, w - h) for h, w in zip(have, want)])
            else:
                array = array[tuple(slice(0, w) for w in want)]
            out.append(array.reshape(final))
        return out

    return jax.jit(resize)


def _resize_all(arrays: list, plans: list) -> list:
    """`arrays` with those whose plan is not None resized in one call of `_resizer`."""
    moving = [i for i, plan in enumerate(plans) if plan is not None]
    if moving:
        resized = _resizer(tuple(plans[i] for i in moving))(*[arrays[i] for i in moving])
        for i, array in zip(moving, resized):
            arrays[i] = array
    return arrays


class BucketedProgram(GraphProgram):
    """A `Program` of a `BucketedGraphFunction`: compiled once per bucket combination."""

    def __init__(self, fn: BucketedGraphFunction, name: str, source, policy: Buckets):
        super().__init__(fn, name, source)
        self.plan = fn.plan
        self.policy = policy
        self._first_values: dict[sympy.Symbol, list[int]] = {}  # run at their own size

    def run_tensors(self, args: list, key=None) -> tuple[list, dict]:
        """Pad `args` (tensors as JAX arrays, sizes as ints) and run; returns the padded
        outputs and each symbol's true and padded values (to crop them)."""
        fn = self.graph_fn
        true = _bind(self.plan, fn.placeholders, args)
        padded = self.padded_sizes(true)
        values, plans = [], []
        for ph, arg in zip(fn.placeholders, args):
            meta = ph.meta.get("val")
            plan = None
            if isinstance(meta, torch.Tensor):
                plan = _resizing(meta.shape, self.plan.layouts, true, padded)
            elif _is_symbolic_scalar(meta):
                arg = evaluate(meta.node.expr, padded)  # its true value travels in `trues`
            values.append(arg)
            plans.append(plan)
        values = _resize_all(values, plans)
        sizes = tuple(padded[s] for s in self.plan.symbols)
        trues = [np.asarray(true[s], np.int32) for s in self.plan.symbols]
        try:
            if fn.needs_rng:
                key, outputs = self(key, sizes, *values, *trues)
            else:
                outputs = self(sizes, *values, *trues)
        except _PaddingFailed as failed:
            self._pin_all(failed.error)
            return self.run_tensors(args, key)
        return list(outputs), true, padded

    def _pin_all(self, error: Exception) -> None:
        """A lowering refused the padded sizes (an op needs a padded size equal to one the
        plan cannot see is the same): every symbol of the graph is kept exact from now on."""
        where = next((note for note in getattr(error, "__notes__", ()) if "while lowering" in note), "")
        what = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        reason = f"padded sizes failed ({what}){where.split(', node:')[0].replace('tpu: ', ' ')}"
        self.plan.pinned.update((s, reason) for s in self.plan.padded_symbols)
        self.plan.masks.clear()
        warnings.warn(
            f"tpu: graph {self.name!r}: sizes not bucketed (one program per value): {reason}",
            ExactShapesWarning,
            stacklevel=2,
        )

    def padded_sizes(self, true: dict) -> dict:
        """Each symbol's size in this call's program: a pinned symbol's true one; any other
        its bucket, unless it is one of the policy's first values of that symbol
        (`Buckets.exact_first`) or a pinned symbol has the same true value. Two symbols can
        be one size that only the run says is equal (a loss in a graph of its own: the
        logits' rows and the labels' rows come in as separate inputs), and an op that needs
        them equal fails when one is padded and the other is not."""
        exact = {true[s] for s in self.plan.pinned}
        for s in self.plan.padded_symbols:
            first = self._first_values.setdefault(s, [])
            if true[s] not in first and len(first) < self.policy.exact_first:
                first.append(true[s])
        return {
            s: true[s]
            if s in self.plan.pinned or true[s] in exact or true[s] in self._first_values.get(s, ())
            else self.policy(true[s])
            for s in self.plan.symbols
        }


def compile_bucketed(gm: torch.fx.GraphModule, name: str, policy: Buckets) -> BucketedProgram:
    """`gm` as a program padded to `policy`'s buckets; warns once per graph for each
    symbol kept exact (one program per size for it) and why."""
    plan = plan_bucketing(gm)
    if plan.pinned:
        reasons = "; ".join(f"{s}: {why}" for s, why in plan.pinned.items())
        warnings.warn(
            f"tpu: graph {name!r}: sizes not bucketed (one program per value): {reasons}",
            ExactShapesWarning,
            stacklevel=2,
        )
    fn = BucketedGraphFunction(gm, name, plan)
    return BucketedProgram(fn, name, lambda: gm.print_readable(print_output=False), policy)


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
    """The graph has size symbols, all readable from its inputs (unbacked ones, such as
    an `.item()` result used as a size, leave the graph to exact-shape compilation)."""
    symbols = _graph_symbols(gm)
    return bool(symbols) and not _bindable(gm, symbols)


class BucketedCompiledGraph:
    """What AOTAutograd calls for a graph with symbolic sizes (boxed, like `CompiledGraph`)."""

    def __init__(self, program: BucketedProgram, gm: torch.fx.GraphModule, output_devices):
        self.program = program
        self.output_devices = output_devices
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.output_meta = [
            item.meta.get("val") if isinstance(item, torch.fx.Node) else None for item in output.args[0]
        ]
        self._boxed_call = True

    @property
    def plan(self) -> BucketPlan:
        return self.program.plan

    def __call__(self, args: list) -> list:
        from tpu_backend import random as device_random
        from tpu_backend.compile.interop import jax_to_tensor, tensor_to_jax
        from tpu_backend.compile.program import is_array

        fallback = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        values = [tensor_to_jax(a) if isinstance(a, torch.Tensor) else a for a in args]
        args.clear()
        key = device_random.next_key() if self.program.needs_rng else None
        outputs, true, padded = self.program.run_tensors(values, key)
        layouts = self.plan.layouts
        crops = [
            _resizing(meta.shape, layouts, padded, true) if is_array(out) and isinstance(meta, torch.Tensor) else None
            for out, meta in zip(outputs, self.output_meta)
        ]
        outputs = _resize_all(outputs, crops)
        results = []
        for out, meta, device in zip(outputs, self.output_meta, self.output_devices):
            if isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                results.append(evaluate(meta.node.expr, true) if meta.node.expr.free_symbols else out)
            elif is_array(out):
                results.append(jax_to_tensor(out, device or fallback))
            else:
                results.append(out)
        return results


__all__ = [
    "BucketPlan",
    "BucketedProgram",
    "ExactShapesWarning",
    "BucketedCompiledGraph",
    "Buckets",
    "as_buckets",
    "buckets",
    "compile_bucketed",
    "has_symbolic_sizes",
    "plan_bucketing",
    "set_buckets",
    "using_buckets",
]
