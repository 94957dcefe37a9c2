"""Elementwise math, comparisons, logic and `where`.

Binary ops rely on TFLite's own broadcasting (ADD/SUB/MUL up to rank 6, DIV and the
comparisons up to rank 5 or 4 depending on the kernel). Python scalars become 0-d
constants of the computation dtype; operands whose dtype differs from it (PyTorch's type
promotion, e.g. int64 tensor + float) are CAST first, so every TFLite op sees one dtype.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


# ---- dtype promotion ----------------------------------------------------------------------


def _category(dtype: np.dtype) -> int:
    if dtype == np.bool_:
        return 0
    return 2 if np.issubdtype(dtype, np.floating) else 1


def _scalar_dtype(value) -> np.dtype:
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    return np.dtype(np.int64 if isinstance(value, int) else np.float32)


def compute_dtype(*operands) -> np.dtype:
    """PyTorch's result dtype for tensors and Python scalars (category first: bool < int <
    float; a scalar or 0-d tensor only matters when it lifts the category)."""
    dims = [x.dtype for x in operands if isinstance(x, Tensor) and x.rank > 0]
    zero_d = [x.dtype for x in operands if isinstance(x, Tensor) and x.rank == 0]
    scalars = [_scalar_dtype(x) for x in operands if not isinstance(x, Tensor)]
    result = None
    for group in (dims, zero_d, scalars):
        for dtype in group:
            if result is None or _category(dtype) > _category(result):
                result = dtype
            elif group is dims and _category(dtype) == _category(result):
                result = np.promote_types(result, dtype)
    return result


def _operands(ctx, *values, dtype=None) -> list[Tensor]:
    """Every operand as a Tensor of `dtype` (default: the node's output dtype)."""
    dtype = np.dtype(dtype or ctx.out_dtype())
    return [emit.as_tensor(ctx, v, dtype) for v in values]


# ---- arithmetic ---------------------------------------------------------------------------

_ARITH_OPTIONS = {"fusedActivationFunction": "NONE"}


def _scaled(ctx, value, alpha, dtype):
    """alpha * value, folded when value is a scalar."""
    if alpha == 1:
        return value
    if not isinstance(value, Tensor):
        return value * alpha
    value = emit.cast(ctx, value, dtype)
    return emit.binary(ctx, "MUL", value, emit.scalar_like(ctx, alpha, dtype))


@lowers(aten.add.Tensor, aten.add.Scalar)
def add(ctx, a, b, alpha=1):
    dtype = ctx.out_dtype()
    a, b = _operands(ctx, a, _scaled(ctx, b, alpha, dtype))
    return ctx.emit("ADD", [a, b], _ARITH_OPTIONS)


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx, a, b, alpha=1):
    dtype = ctx.out_dtype()
    a, b = _operands(ctx, a, _scaled(ctx, b, alpha, dtype))
    return ctx.emit("SUB", [a, b], _ARITH_OPTIONS)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx, a, b, alpha=1):
    dtype = ctx.out_dtype()
    b, a = _operands(ctx, b, _scaled(ctx, a, alpha, dtype))
    return ctx.emit("SUB", [b, a], _ARITH_OPTIONS)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx, a, b):
    if ctx.out_dtype() == np.bool_:
        return ctx.emit("LOGICAL_AND", _operands(ctx, a, b))
    return ctx.emit("MUL", _operands(ctx, a, b), _ARITH_OPTIONS)


@lowers(aten.div.Tensor, aten.div.Scalar)
def div(ctx, a, b):
    a, b = _operands(ctx, a, b)
    return ctx.emit("DIV", [a, b], _ARITH_OPTIONS)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, a, b, rounding_mode=None):
    if rounding_mode is None:
        return div(ctx, a, b)
    if rounding_mode == "floor":
        return _floor_div(ctx, a, b)
    # "trunc": round the true quotient toward zero; integers go through float32
    # (exact for |values| < 2**24).
    out_dtype = ctx.out_dtype()
    if np.issubdtype(out_dtype, np.floating):
        a, b = _operands(ctx, a, b)
        return _trunc(ctx, emit.binary(ctx, "DIV", a, b), final=True)
    a, b = _operands(ctx, a, b, dtype=np.float32)
    return emit.cast(ctx, _trunc(ctx, emit.binary(ctx, "DIV", a, b)), out_dtype)


def _trunc(ctx, x: Tensor, final: bool = False) -> Tensor:
    """Round toward zero: CEIL for negatives, FLOOR otherwise."""
    negative = emit.binary(ctx, "LESS", x, emit.scalar_like(ctx, 0, x.dtype), dtype=np.bool_)
    up = emit.unary(ctx, "CEIL", x)
    down = emit.unary(ctx, "FLOOR", x)
    if final:
        return ctx.emit("SELECT_V2", [negative, up, down])
    return ctx.emit("SELECT_V2", [negative, up, down], shape=x.shape, dtype=x.dtype, signature=x.shape_signature)


@lowers(aten.trunc.default)
def trunc(ctx, x):
    return _trunc(ctx, x, final=True)


def _floor_div(ctx, a, b):
    """FLOOR_DIV; its kernel has no int64, so int64 goes through int32 (exact below 2**31,
    which covers index arithmetic)."""
    if ctx.out_dtype() != np.int64:
        return ctx.emit("FLOOR_DIV", _operands(ctx, a, b))
    a, b = _operands(ctx, a, b, dtype=np.int32)
    return emit.cast(ctx, emit.binary(ctx, "FLOOR_DIV", a, b), np.int64)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, a, b):
    return _floor_div(ctx, a, b)


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(ctx, a, b):
    # PyTorch's remainder takes the divisor's sign, like TFLite's FLOOR_MOD.
    return ctx.emit("FLOOR_MOD", _operands(ctx, a, b))


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(ctx, a, b):
    """C's fmod takes the dividend's sign: FLOOR_MOD, minus the divisor where the signs
    of the result and the dividend disagree."""
    a, b = _operands(ctx, a, b)
    r = emit.binary(ctx, "FLOOR_MOD", a, b)
    zero = emit.scalar_like(ctx, 0, r.dtype)
    r_negative = emit.binary(ctx, "LESS", r, zero, dtype=np.bool_)
    a_negative = emit.binary(ctx, "LESS", a, zero, dtype=np.bool_)
    nonzero = emit.binary(ctx, "NOT_EQUAL", r, zero, dtype=np.bool_)
    signs_differ = emit.binary(ctx, "NOT_EQUAL", r_negative, a_negative, dtype=np.bool_)
    fix = emit.binary(ctx, "LOGICAL_AND", signs_differ, nonzero, dtype=np.bool_)
    return ctx.emit("SELECT_V2", [fix, emit.binary(ctx, "SUB", r, b), r])


@lowers(aten.minimum.default)
def minimum(ctx, a, b):
    return ctx.emit("MINIMUM", _operands(ctx, a, b))


@lowers(aten.maximum.default)
def maximum(ctx, a, b):
    return ctx.emit("MAXIMUM", _operands(ctx, a, b))


@lowers(aten.hypot.default)
def hypot(ctx, a, b):
    """sqrt(a^2 + b^2) without overflow: big * sqrt(1 + (small / big)^2), so 1e20 and
    1e20 give 1.41e20 in float32 where the squares alone would be inf; an infinite
    operand gives inf (inf / inf would be NaN)."""
    a, b = (emit.unary(ctx, "ABS", x) for x in _operands(ctx, a, b))
    big, small = emit.binary(ctx, "MAXIMUM", a, b), emit.binary(ctx, "MINIMUM", a, b)
    tiny = emit.scalar_like(ctx, np.finfo(big.dtype).tiny, big.dtype)  # 0 / 0 would be NaN
    ratio = emit.binary(ctx, "DIV", small, emit.binary(ctx, "MAXIMUM", big, tiny))
    one_plus = emit.binary(ctx, "ADD", emit.binary(ctx, "MUL", ratio, ratio), emit.scalar_like(ctx, 1, big.dtype))
    scaled = emit.binary(ctx, "MUL", big, emit.unary(ctx, "SQRT", one_plus))
    infinite = emit.binary(ctx, "EQUAL", big, emit.scalar_like(ctx, np.inf, big.dtype), dtype=np.bool_)
    return ctx.emit("SELECT_V2", [infinite, big, scaled])


# ---- unary math ---------------------------------------------------------------------------


def _unary(opcode: str):
    def lower(ctx, x):
        (x,) = _operands(ctx, x)
        return ctx.emit(opcode, [x])

    lower.__name__ = opcode.lower()
    lower.__doc__ = f"One {opcode} (integer inputs are cast to the node's float dtype first)."
    return lower


for _target, _opcode in [
    (aten.exp.default, "EXP"),
    (aten.log.default, "LOG"),
    (aten.sqrt.default, "SQRT"),
    (aten.rsqrt.default, "RSQRT"),
    (aten.neg.default, "NEG"),
    (aten.sin.default, "SIN"),
    (aten.cos.default, "COS"),
    (aten.floor.default, "FLOOR"),
    (aten.ceil.default, "CEIL"),
    (aten.sign.default, "SIGN"),
]:
    lowers(_target)(_unary(_opcode))


@lowers(aten.abs.default)
def abs_(ctx, x):
    """ABS; int64 (an index sum, a cumsum of int32) as MAXIMUM(x, NEG(x)): LiteRT's ABS
    kernel refuses INT64 at run time (found by tests/reliability/test_fuzz_convert.py)."""
    (x,) = _operands(ctx, x)
    if x.dtype == np.int64:
        return ctx.emit("MAXIMUM", [x, emit.unary(ctx, "NEG", x)])
    return ctx.emit("ABS", [x])


@lowers(aten.round.default)
def round_(ctx, x):
    # TFLite ROUND rounds half to even, as torch.round does.
    (x,) = _operands(ctx, x)
    return ctx.emit("ROUND", [x])


@lowers(aten.round.decimals)
def round_decimals(ctx, x, decimals=0):
    (x,) = _operands(ctx, x)
    scale = emit.scalar_like(ctx, 10.0**decimals, x.dtype)
    rounded = emit.unary(ctx, "ROUND", emit.binary(ctx, "MUL", x, scale))
    return ctx.emit("DIV", [rounded, scale], _ARITH_OPTIONS)


@lowers(aten.reciprocal.default)
def reciprocal(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("DIV", [emit.scalar_like(ctx, 1, x.dtype), x], _ARITH_OPTIONS)


@lowers(aten.square.default)
def square(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("MUL", [x, x], _ARITH_OPTIONS)


@lowers(aten.expm1.default)
def expm1(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("SUB", [emit.unary(ctx, "EXP", x), emit.scalar_like(ctx, 1, x.dtype)], _ARITH_OPTIONS)


@lowers(aten.log1p.default)
def log1p(ctx, x):
    (x,) = _operands(ctx, x)
    return ctx.emit("LOG", [emit.binary(ctx, "ADD", x, emit.scalar_like(ctx, 1, x.dtype))])


@lowers(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx, x, exponent):
    """Common exponents become cheaper ops (x*x, SQRT, RSQRT, 1/x); the rest POW."""
    (x,) = _operands(ctx, x)
    if exponent == 1:
        return x
    if exponent == 2:
        return ctx.emit("MUL", [x, x], _ARITH_OPTIONS)
    if exponent == 0.5:
        return ctx.emit("SQRT", [x])
    if exponent == -0.5:
        return ctx.emit("RSQRT", [x])
    if exponent == -1:
        return ctx.emit("DIV", [emit.scalar_like(ctx, 1, x.dtype), x], _ARITH_OPTIONS)
    return ctx.emit("POW", [x, emit.scalar_like(ctx, exponent, x.dtype)])


@lowers(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(ctx, base, exponent):
    return ctx.emit("POW", _operands(ctx, base, exponent))


# erf has no TFLite builtin. Two accurate branches, chosen per element:
# |x| < 1: the Maclaurin series erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)),
#          11 terms (the first omitted term is below 2e-9);
# |x| >= 1: Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7 (erf >= 0.84 there).
_ERF_SERIES = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(11)]
_AS_P = 0.3275911
_AS_A = [0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]


def _horner(ctx, t: Tensor, coefficients) -> Tensor:
    """sum coefficients[k] * t**k by Horner's rule (lowest order first)."""
    acc = emit.scalar_like(ctx, coefficients[-1], t.dtype)
    for c in reversed(coefficients[:-1]):
        acc = emit.binary(ctx, "ADD", emit.binary(ctx, "MUL", t, acc), emit.scalar_like(ctx, c, t.dtype))
    return acc


@lowers(aten.erf.default)
def erf(ctx, x):
    (x,) = _operands(ctx, x)
    f = lambda v: emit.scalar_like(ctx, v, x.dtype)  # noqa: E731
    # small |x|: x * P(x^2)
    series = emit.binary(ctx, "MUL", x, _horner(ctx, emit.binary(ctx, "MUL", x, x), _ERF_SERIES))
    # large |x|: sign(x) * (1 - t*Q(t) * exp(-x^2)), t = 1 / (1 + p|x|)
    ax = emit.unary(ctx, "ABS", x)
    t = emit.binary(ctx, "DIV", f(1.0), emit.binary(ctx, "ADD", emit.binary(ctx, "MUL", ax, f(_AS_P)), f(1.0)))
    poly = emit.binary(ctx, "MUL", t, _horner(ctx, t, _AS_A))
    gauss = emit.unary(ctx, "EXP", emit.unary(ctx, "NEG", emit.binary(ctx, "MUL", x, x)))
    tail = emit.binary(ctx, "SUB", f(1.0), emit.binary(ctx, "MUL", poly, gauss))
    tail = emit.binary(ctx, "MUL", emit.unary(ctx, "SIGN", x), tail)
    small = emit.binary(ctx, "LESS", ax, f(1.0), dtype=np.bool_)
    return ctx.emit("SELECT_V2", [small, series, tail])


# ---- comparisons and logic ----------------------------------------------------------------


def _comparison(opcode: str):
    def lower(ctx, a, b):
        a, b = _operands(ctx, a, b, dtype=compute_dtype(a, b))
        return ctx.emit(opcode, [a, b])

    lower.__name__ = opcode.lower()
    lower.__doc__ = f"{opcode} after promoting both sides to one dtype."
    return lower


for _packet, _opcode in [
    (aten.eq, "EQUAL"),
    (aten.ne, "NOT_EQUAL"),
    (aten.lt, "LESS"),
    (aten.le, "LESS_EQUAL"),
    (aten.gt, "GREATER"),
    (aten.ge, "GREATER_EQUAL"),
]:
    lowers(_packet.Tensor, _packet.Scalar)(_comparison(_opcode))


def _as_bool(ctx, x) -> Tensor:
    """Truthiness of x (non-zero), as a bool tensor."""
    if not isinstance(x, Tensor):
        return emit.scalar_like(ctx, bool(x), np.bool_)
    if x.dtype == np.bool_:
        return x
    return emit.binary(ctx, "NOT_EQUAL", x, emit.scalar_like(ctx, 0, x.dtype), dtype=np.bool_)


@lowers(aten.logical_and.default)
def logical_and(ctx, a, b):
    return ctx.emit("LOGICAL_AND", [_as_bool(ctx, a), _as_bool(ctx, b)])


@lowers(aten.logical_or.default)
def logical_or(ctx, a, b):
    return ctx.emit("LOGICAL_OR", [_as_bool(ctx, a), _as_bool(ctx, b)])


@lowers(aten.logical_xor.default)
def logical_xor(ctx, a, b):
    return ctx.emit("NOT_EQUAL", [_as_bool(ctx, a), _as_bool(ctx, b)])


@lowers(aten.logical_not.default)
def logical_not(ctx, x):
    return ctx.emit("LOGICAL_NOT", [_as_bool(ctx, x)])


def _require_bool(ctx, *values):
    for v in values:
        if isinstance(v, Tensor) and v.dtype != np.bool_:
            raise emit.unsupported(
                ctx,
                f"bitwise ops on {v.dtype} tensors have no TFLite builtin",
                "Use bool masks (comparisons) with &, |, ~, or logical_and/or/not.",
            )


@lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
def bitwise_and(ctx, a, b):
    _require_bool(ctx, a, b)
    return logical_and(ctx, a, b)


@lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
def bitwise_or(ctx, a, b):
    _require_bool(ctx, a, b)
    return logical_or(ctx, a, b)


@lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
def bitwise_xor(ctx, a, b):
    if ctx.out_dtype() != np.bool_:
        return ctx.emit("BITWISE_XOR", _operands(ctx, a, b))
    return logical_xor(ctx, a, b)


@lowers(aten.bitwise_not.default)
def bitwise_not(ctx, x):
    _require_bool(ctx, x)
    return ctx.emit("LOGICAL_NOT", [x])


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, condition, a, b):
    a, b = _operands(ctx, a, b)
    return ctx.emit("SELECT_V2", [_as_bool(ctx, condition), a, b])


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    """`value` (cast to x's dtype) where `mask` is true, x elsewhere."""
    return ctx.emit("SELECT_V2", [_as_bool(ctx, mask), emit.as_tensor(ctx, value, x.dtype), x])


# ---- Python-operator spellings torch.export leaves whole (lowered directly) ----------------


@lowers(aten.__and__.Tensor, aten.__and__.Scalar)
def and_operator(ctx, a, b):
    return bitwise_and(ctx, a, b)


@lowers(aten.__or__.Tensor, aten.__or__.Scalar)
def or_operator(ctx, a, b):
    return bitwise_or(ctx, a, b)


@lowers(aten.__xor__.Tensor, aten.__xor__.Scalar)
def xor_operator(ctx, a, b):
    return bitwise_xor(ctx, a, b)


@lowers(aten.min.other)
def min_other(ctx, a, b):
    return minimum(ctx, a, b)


@lowers(aten.max.other)
def max_other(ctx, a, b):
    return maximum(ctx, a, b)


@lowers(aten.diff.default)
def diff(ctx, x, n=1, dim=-1, prepend=None, append=None):
    """n-th forward difference along `dim`: SUB of two shifted slices, n times (what the
    decomposition traces, without tracing it per call)."""
    parts = [t for t in (prepend, x, append) if t is not None]
    if x.dtype == np.bool_ or any(p.is_dynamic or p.dtype != x.dtype for p in parts):
        raise NotImplementedError("diff of bool, mixed-dtype or dynamic-shaped tensors")
    axis = emit.normalize_dim(dim, x.rank)
    if all(p.is_const for p in parts):
        return ctx.const(np.diff(np.concatenate([p.data for p in parts], axis=axis), n=n, axis=axis))
    y = emit.concat(ctx, parts, axis)
    for _ in range(n):
        length = y.shape[axis]
        if length == 0:
            break
        later, earlier = emit.slice_axis(ctx, y, axis, 1, length), emit.slice_axis(ctx, y, axis, 0, length - 1)
        y = emit.binary(ctx, "SUB", later, earlier)
    return y
