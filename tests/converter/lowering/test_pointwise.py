"""Elementwise math, comparisons, logic and where: LiteRT vs PyTorch on tiny tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 4)
POSITIVE = torch.rand(2, 3, 4) + 0.1
INTS = torch.randint(-9, 10, (2, 3, 4))

BINARY = {
    "add": lambda a, b: a + b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5),
    "add_scalar": lambda a, b: a + 1.5,
    "sub": lambda a, b: a - b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5),
    "rsub_scalar": lambda a, b: 2 - a,
    "mul": lambda a, b: a * b,
    "mul_scalar": lambda a, b: a * 3,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "div_scalar": lambda a, b: a / 4,
    "scalar_div": lambda a, b: 2 / (a.abs() + 0.5),
    "broadcast": lambda a, b: a * b[0, :, :1] + b[:1, :1, :],
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "floor_divide": lambda a, b: torch.floor_divide(a, b.abs() + 0.5),
    "remainder": lambda a, b: a % 0.7,
    "remainder_tensor": lambda a, b: torch.remainder(a, b.abs() + 0.5),
    "fmod": lambda a, b: torch.fmod(a, 0.7),
    "fmod_negative_divisor": lambda a, b: torch.fmod(a, -(b.abs() + 0.5)),
    "div_trunc": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="floor"),
    "pow_tensor": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "pow_scalar_base": lambda a, b: torch.pow(2.0, a),
    "hypot": torch.hypot,
    "hypot_broadcast": lambda a, b: torch.hypot(a, b[0, :, :1]),
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name):
    assert_converts(Fn(BINARY[name]), (X, torch.randn(2, 3, 4)))


UNARY = {
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.1),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "abs": torch.abs,
    "neg": torch.neg,
    "sin": torch.sin,
    "cos": torch.cos,
    "floor": lambda x: torch.floor(x * 3),
    "ceil": lambda x: torch.ceil(x * 3),
    "round": lambda x: torch.round(x * 3),
    "round_half_even": lambda x: torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]) + x[0, 0, :1] * 0),
    "round_decimals": lambda x: torch.round(x, decimals=2),
    "trunc": lambda x: torch.trunc(x * 3),
    "sign": lambda x: torch.sign(torch.round(x)),
    "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5),
    "square": torch.square,
    "pow2": lambda x: x**2,
    "pow3": lambda x: x**3,
    "pow_half": lambda x: x.abs() ** 0.5,
    "pow_minus_one": lambda x: (x.abs() + 0.5) ** -1,
    "expm1": torch.expm1,
    "log1p": lambda x: torch.log1p(x.abs()),
}


def test_hypot_neither_overflows_nor_divides_zero_by_zero():
    big = torch.tensor([1e20, 3e30, 0.0, -4.0, 0.0])
    other = torch.tensor([1e20, -4e30, 0.0, 3.0, -2.5])
    edge = assert_converts(Fn(torch.hypot), (big, other))
    inf = float("inf")
    infinite = (torch.tensor([inf, -inf, 1.0, 0.0, 5.0]), torch.tensor([inf, 2.0, -inf, 0.0, 12.0]))
    np.testing.assert_array_equal(edge(*infinite), torch.hypot(*infinite).numpy())  # inf, not inf / inf


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
    assert_converts(Fn(UNARY[name]), (X,))


def test_erf_is_accurate_over_a_wide_range():
    x = torch.linspace(-6, 6, 2001).reshape(1, -1)
    assert_converts(Fn(torch.erf), (x,), rtol=1e-6, atol=1e-6)
    small = torch.linspace(-1e-3, 1e-3, 101)
    assert_converts(Fn(torch.erf), (small,), rtol=1e-6)


COMPARE = {
    "eq": lambda a, b: a == b,
    "ne_scalar": lambda a, b: a != 1,
    "lt": lambda a, b: a < b,
    "le_scalar": lambda a, b: a <= 0.5,
    "gt": lambda a, b: a > b,
    "ge_scalar": lambda a, b: a >= 0,
    "and": lambda a, b: (a > 0) & (b > 0),
    "or": lambda a, b: (a > 0) | (b > 0),
    "not": lambda a, b: ~(a > 0),
    "xor": lambda a, b: (a > 0) ^ (b > 0),
    "logical_and_float": lambda a, b: torch.logical_and(a, b > 0),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "where_scalar": lambda a, b: torch.where(a > 0, a, 0.0),
    "masked_fill": lambda a, b: a.masked_fill(b > 0, -1.0),
}


@pytest.mark.parametrize("name", list(COMPARE))
def test_comparison_and_logic(name):
    a = torch.randint(-2, 3, (2, 3, 4)).float()
    b = torch.randint(-2, 3, (2, 3, 4)).float()
    assert_converts(Fn(COMPARE[name]), (a, b))


INTEGER = {
    "add": lambda a: a + 3,
    "mul": lambda a: a * a,
    "floor_divide": lambda a: a // 4,
    "remainder": lambda a: a % 4,
    "true_divide_promotes": lambda a: a / 4,
    "add_float_promotes": lambda a: a + 0.5,
    "compare": lambda a: a > 2,
    "div_trunc": lambda a: torch.div(a, 4, rounding_mode="trunc"),
}


@pytest.mark.parametrize("name", list(INTEGER))
def test_integer_inputs(name):
    assert_converts(Fn(INTEGER[name]), (INTS.int(),))


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "div_trunc", "mul"])
def test_int64_inputs(name):
    """int64 is PyTorch's default integer dtype (index arithmetic): FLOOR_DIV lacks it."""
    assert_converts(Fn(INTEGER[name]), (INTS,))
