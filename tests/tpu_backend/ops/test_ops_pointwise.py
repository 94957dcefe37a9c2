"""Pointwise lowerings agree with PyTorch's CPU kernels in values, shapes and dtypes."""

import mpmath
import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check, run_lowering

from tests import chip

aten = torch.ops.aten
torch.manual_seed(0)

X = torch.randn(3, 4)
POS = torch.rand(3, 4) + 0.1  # strictly positive
UNIT = torch.rand(3, 4) * 1.8 - 0.9  # inside (-1, 1)
INTS = torch.randint(-5, 6, (3, 4))
INTS_NZ = torch.tensor([[3, -7, 5, 9], [-2, 4, -6, 1], [8, -3, 2, -9]])
BOOLS = torch.rand(3, 4) > 0.5
SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.5, 0.5, float("inf"), float("-inf"), float("nan")])
# a tiny positive float64 (a TPU stores float64 as two float32s, float32's exponent range: 1e-300
# is 0 there, and below ~2e-31 the low word is subnormal, so float64's precision is gone:
# K1(1e-37) was 8.9e-5 off on a v5e)
TINY64 = chip.tolerance("float64", cpu=1e-300, tpu=1e-30)
# float64 rounding: the chip's two float32 mantissas hold 48 bits (3.6e-15 a rounding)
RTOL64_EXACT = chip.tolerance("float64", cpu=1e-15, tpu=1e-13)
# float64 special functions' relative bound: the chip's emulated float64 loses digits in their
# series (J0 2.8e-10, K0 1.0e-10 measured on a v5e)
RTOL64 = chip.tolerance("float64", cpu=1e-10, tpu=1e-8)

UNARY_FLOAT = [
    (aten.exp.default, X),
    (aten.exp2.default, X),
    (aten.expm1.default, X),
    (aten.log.default, POS),
    (aten.log1p.default, POS),
    (aten.log2.default, POS),
    (aten.log10.default, POS),
    (aten.sqrt.default, POS),
    (aten.rsqrt.default, POS),
    (aten.reciprocal.default, POS),
    (aten.sin.default, X),
    (aten.cos.default, X),
    (aten.tan.default, UNIT),
    (aten.asin.default, UNIT),
    (aten.acos.default, UNIT),
    (aten.atan.default, X),
    (aten.sinh.default, X),
    (aten.cosh.default, X),
    (aten.tanh.default, X),
    (aten.asinh.default, X),
    (aten.acosh.default, POS + 1),
    (aten.atanh.default, UNIT),
    (aten.erf.default, X),
    (aten.erfc.default, X),
    (aten.erfinv.default, UNIT),
    (aten.sigmoid.default, X),
    (aten.lgamma.default, POS * 3),
    (aten.digamma.default, POS * 3),
    (aten.i0.default, X),
    (aten.sinc.default, X),
    (aten.deg2rad.default, X),
    (aten.rad2deg.default, X),
    (aten.special_ndtri.default, POS / 1.2),
    (aten.special_i0e.default, X),
    (aten.special_i1.default, X),
    (aten.special_i1e.default, X),
    (aten.special_erfcx.default, X),
]


@pytest.mark.parametrize("op,x", UNARY_FLOAT, ids=lambda v: str(v) if not isinstance(v, torch.Tensor) else "")
def test_unary_float_ops(op, x):
    check(op, x, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "op", [aten.exp.default, aten.sqrt.default, aten.sin.default, aten.sigmoid.default, aten.reciprocal.default]
)
def test_unary_float_ops_turn_integers_into_float32(op):
    check(op, INTS.abs() + 1)
    check(op, BOOLS)


DTYPE_KEEPING = [
    aten.abs.default,
    aten.neg.default,
    aten.sign.default,
    aten.sgn.default,
    aten.floor.default,
    aten.ceil.default,
    aten.trunc.default,
    aten.round.default,
    aten.frac.default,
    aten.square.default,
    aten.isnan.default,
    aten.isinf.default,
    aten.isfinite.default,
    aten.isposinf.default,
    aten.isneginf.default,
    aten.signbit.default,
    aten.nan_to_num.default,
    aten.positive.default,
    aten.angle.default,
]


@pytest.mark.parametrize("op", DTYPE_KEEPING, ids=str)
@pytest.mark.parametrize("x", [SPECIAL, INTS, X], ids=["special", "int64", "float"])
def test_dtype_keeping_unary_ops(op, x):
    if op is aten.frac.default and not x.is_floating_point():
        pytest.skip("frac is float-only in ATen")
    check(op, x)


def test_round_decimals_and_bool_ops():
    check(aten.round.decimals, X * 100, decimals=2)
    check(aten.round.decimals, X * 1000, decimals=-2)
    check(aten.square.default, BOOLS)
    check(aten.bitwise_not.default, INTS)
    check(aten.bitwise_not.default, BOOLS)
    check(aten.logical_not.default, X)
    check(aten.nan_to_num.default, SPECIAL, 1.0, 2.0, -2.0)
    check(aten.logit.default, POS / 1.2)
    check(aten.logit.default, POS / 1.2, 0.2)
    check(aten.polygamma.default, 1, POS * 2, rtol=1e-4)
    check(aten.mvlgamma.default, POS + 2, 3, rtol=1e-4)


Y = torch.randn(3, 4)
BINARY = [
    (aten.add.Tensor, (X, Y), {}),
    (aten.add.Tensor, (X, Y), {"alpha": 2.5}),
    (aten.add.Tensor, (INTS, 2.5), {}),
    (aten.add.Scalar, (INTS, 3), {}),
    (aten.add.Tensor, (BOOLS, BOOLS), {}),
    (aten.add.Tensor, (INTS.int(), torch.tensor(2.0)), {}),
    (aten.sub.Tensor, (X, Y), {"alpha": 2}),
    (aten.sub.Scalar, (INTS, 1.5), {}),
    (aten.rsub.Scalar, (X, 2.0), {}),
    (aten.rsub.Tensor, (X, Y), {"alpha": 3}),
    (aten.mul.Tensor, (X, Y), {}),
    (aten.mul.Tensor, (BOOLS, INTS), {}),
    (aten.mul.Tensor, (BOOLS, BOOLS), {}),
    (aten.mul.Scalar, (INTS, 0.5), {}),
    (aten.div.Tensor, (INTS, INTS_NZ), {}),
    (aten.div.Tensor, (X, Y), {}),
    (aten.div.Scalar, (INTS, 2), {}),
    (aten.div.Tensor_mode, (INTS, INTS_NZ), {"rounding_mode": "trunc"}),
    (aten.div.Tensor_mode, (INTS, INTS_NZ), {"rounding_mode": "floor"}),
    (aten.div.Tensor_mode, (X * 5, Y), {"rounding_mode": "trunc"}),
    (aten.div.Tensor_mode, (X * 5, Y), {"rounding_mode": "floor"}),
    (aten.div.Scalar_mode, (X * 5, -1.5), {"rounding_mode": "floor"}),
    (aten.div.Tensor_mode, (X, Y), {"rounding_mode": None}),
    (aten.floor_divide.default, (INTS, INTS_NZ), {}),
    (aten.floor_divide.Scalar, (X * 5, 0.7), {}),
    (aten.remainder.Tensor, (X * 5, Y), {}),
    (aten.remainder.Tensor, (INTS, INTS_NZ), {}),
    (aten.remainder.Scalar, (INTS, 3), {}),
    (aten.remainder.Scalar_Tensor, (7, INTS_NZ), {}),
    (aten.fmod.Tensor, (X * 5, Y), {}),
    (aten.fmod.Scalar, (INTS, 3), {}),
    (aten.pow.Tensor_Tensor, (POS, Y), {}),
    (aten.pow.Tensor_Scalar, (X, 2), {}),
    (aten.pow.Tensor_Scalar, (X, 3.0), {}),
    (aten.pow.Tensor_Scalar, (POS, 0.5), {}),
    (aten.pow.Tensor_Scalar, (POS, -1.7), {}),
    (aten.pow.Tensor_Scalar, (INTS, 3), {}),
    (aten.pow.Tensor_Scalar, (INTS, 0.5), {}),
    (aten.pow.Scalar, (2.0, X), {}),
    (aten.pow.Scalar, (2, INTS.abs()), {}),
    (aten.pow.Tensor_Tensor, (INTS, INTS.abs()), {}),
    (aten.atan2.default, (X, Y), {}),
    (aten.hypot.default, (X, Y), {}),
    (aten.copysign.Tensor, (X, Y), {}),
    (aten.copysign.Scalar, (INTS, -1.0), {}),
    (aten.maximum.default, (X, Y), {}),
    (aten.minimum.default, (INTS, X), {}),
    (aten.fmax.default, (SPECIAL, SPECIAL.flip(0)), {}),
    (aten.fmin.default, (SPECIAL, SPECIAL.flip(0)), {}),
    (aten.maximum.default, (SPECIAL, SPECIAL.flip(0)), {}),
    (aten.xlogy.Tensor, (torch.tensor([0.0, 1, 2, 0]), torch.tensor([0.0, 2, float("nan"), 3])), {}),
    (aten.xlogy.Scalar_Self, (2.0, POS), {}),
    (aten.xlogy.Scalar_Other, (X, 3.0), {}),
    (aten.special_xlog1py.default, (X, POS), {}),
    (aten.logaddexp.default, (X, Y), {}),
    (aten.logaddexp2.default, (X, Y), {}),
    (aten.heaviside.default, (torch.tensor([-1.0, 0, 2]), torch.tensor([0.5, 0.5, 0.5])), {}),
    (aten.nextafter.default, (X, Y), {}),
    (aten.ldexp.Tensor, (X, INTS), {}),
    (aten.gcd.default, (INTS, INTS_NZ), {}),
    (aten.lcm.default, (INTS, INTS_NZ), {}),
]


@pytest.mark.parametrize("op,args,kwargs", BINARY, ids=[f"{i}-{op}" for i, (op, _, _) in enumerate(BINARY)])
def test_binary_ops(op, args, kwargs):
    check(op, *args, **kwargs, rtol=1e-5, atol=1e-5)


COMPARE = [aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge]


@pytest.mark.parametrize("packet", COMPARE, ids=str)
def test_comparisons(packet):
    check(packet.Tensor, X, Y)
    check(packet.Tensor, INTS, X)
    check(packet.Scalar, INTS, 0.5)
    check(packet.Tensor, X, torch.tensor(0.0))


def test_logic_and_bit_ops():
    for op in (aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default):
        check(op, X, BOOLS)
    for packet in (aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor):
        check(packet.Tensor, INTS, INTS_NZ)
        check(packet.Tensor, BOOLS, BOOLS)
        check(packet.Scalar, INTS, 6)
    check(aten.bitwise_left_shift.Tensor, INTS, INTS.abs() % 4)
    check(aten.bitwise_right_shift.Tensor, INTS_NZ, INTS.abs() % 3)
    check(aten.bitwise_right_shift.Tensor_Scalar, INTS_NZ, 1)
    check(aten.__lshift__.Scalar, INTS, 2)


def test_clamp_where_lerp_and_friends():
    check(aten.clamp.default, X, -0.5, 0.5)
    check(aten.clamp.default, X, None, 0.5)
    check(aten.clamp.default, INTS, -2.5, None)
    check(aten.clamp.default, X, 1.0, -1.0)  # min > max: everything becomes max
    check(aten.clamp.Tensor, X, Y, None)
    check(aten.clamp.Tensor, X, -Y.abs(), Y.abs())
    check(aten.clamp.default, SPECIAL, -1, 1)
    check(aten.clamp_min.default, INTS, 0)
    check(aten.clamp_max.Tensor, X, Y)
    check(aten.where.self, BOOLS, X, INTS)
    check(aten.where.self, BOOLS, INTS, torch.tensor(1.5))
    check(aten.masked_fill.Scalar, X, BOOLS, -1e9)
    check(aten.masked_fill.Tensor, INTS, BOOLS, torch.tensor(7))
    check(aten.threshold.default, X, 0.1, 20.0)
    check(aten.lerp.Scalar, X, Y, 0.3)
    check(aten.lerp.Scalar, X, Y, 1.0)
    check(aten.lerp.Tensor, X, Y, POS)
    check(aten.addcmul.default, X, Y, POS, value=0.5)
    check(aten.addcdiv.default, X, Y, POS, value=-2)
    check(aten.addcmul.default, INTS, INTS, INTS_NZ, value=2)


def test_half_precision_keeps_its_dtype():
    check(aten.add.Tensor, X.bfloat16(), Y.bfloat16(), atol=1e-2, rtol=1e-2)
    check(aten.mul.Tensor, X.half(), 2.0, atol=1e-3, rtol=1e-3)
    check(aten.exp.default, X.bfloat16(), atol=1e-2, rtol=1e-2)
    check(aten.add.Tensor, X.bfloat16(), torch.tensor(1.5, dtype=torch.float64), atol=1e-2, rtol=1e-2)


def test_special_functions():
    check(aten.special_entr.default, torch.tensor([0.0, 0.5, 2.0, -1.0, float("nan")]))
    check(aten.special_log_ndtr.default, X * 3, rtol=1e-4)
    check(aten.special_bessel_j0.default, X * 3, atol=1e-5, rtol=1e-4)
    check(aten.special_bessel_j1.default, X * 3, atol=1e-5, rtol=1e-4)
    check(aten.igamma.default, POS * 3, POS * 2, rtol=1e-4)
    check(aten.igammac.default, POS * 3, POS * 2, rtol=1e-4)
    check(aten.special_zeta.default, POS + 1.5, POS + 0.5, rtol=1e-4)
    check(aten.special_zeta.other_scalar, POS + 1.5, 2.0, rtol=1e-4)
    check(aten.frexp.Tensor, X * 100)


def test_special_functions_of_integers_and_special_values():
    ints = torch.arange(-9, 10)
    check(aten.special_bessel_j0.default, ints, atol=1e-6, rtol=1e-5)  # J0(0) = 1
    check(aten.special_bessel_j1.default, ints, atol=1e-6, rtol=1e-5)
    tiny = torch.tensor([0.0, 1e-30, 1e-8, -1e-5, 1.78e-5, 5e-4, -2e-3], dtype=torch.float64)
    check(aten.special_bessel_j0.default, tiny, atol=0, rtol=RTOL64_EXACT)
    check(aten.special_bessel_j1.default, tiny, atol=0, rtol=RTOL64_EXACT)
    # poles and domain: x == 1 -> inf, x < 1 -> nan, q a non-positive integer -> inf
    x, q = torch.meshgrid(torch.arange(-2, 5), torch.arange(-3, 4), indexing="ij")
    check(aten.special_zeta.default, x, q, rtol=1e-4)
    check(aten.special_zeta.default, x.double(), q.double() - 0.5, rtol=1e-7)
    check(aten.special_zeta.default, x.double() + 0.5, q.double() - 0.5, rtol=1e-7)


def test_zeta_below_zero_matches_aten():
    """Hurwitz zeta at q < 0 (integral x), far below the range the Euler-Maclaurin sum
    holds for: shifted up with the terms it passes (zeta(4, -20.5) was -3.6e-5, not 32.47)."""
    x = torch.tensor([2.0, 3.0, 4.0, 3.0, 6.0, 5.0, 7.0], dtype=torch.float64)
    q = torch.tensor([-0.75, -20.5, -20.5, -100.25, -1e4 - 0.5, -9.5, -2.5], dtype=torch.float64)
    # the terms (q + k)^-x (up to 64 here) cancel to results as small as 2.5e-5: an absolute bound
    check(aten.special_zeta.default, x, q, rtol=RTOL64, atol=chip.tolerance("float64", cpu=1e-10, tpu=1e-7))
    # even x: every term positive, no cancellation, float32 too
    check(aten.special_zeta.default, x[2:3].float(), q[2:3].float(), rtol=1e-5)
    assert_lowers_for_tpu(aten.special_zeta.default, x.float(), q.float())  # the loop compiles for the chip


def test_float64_powers_of_negative_bases_keep_their_sign():
    """Negative float64 bases to integral tensor exponents (odd, even, negative, huge), to
    fractional ones (NaN) and infinities; float_power always computes in float64. A TPU's
    float64 power dropped the sign (seen through zeta on a v5e)."""
    base = torch.tensor([-3.5, -0.5, -2.0, -1.0, -float("inf"), 2.0, -2.0, -2.0], dtype=torch.float64)
    exponent = torch.tensor([3.0, -3.0, 4.0, 1e20 + 1, 3.0, -1.5, 0.5, float("inf")], dtype=torch.float64)
    check(aten.pow.Tensor_Tensor, base, exponent, rtol=RTOL64)
    check(aten.float_power.Tensor_Tensor, base.float(), exponent, rtol=RTOL64)
    check(aten.float_power.Tensor_Scalar, base, -3, rtol=RTOL64)


def test_erfcx_far_out_and_regularized_gamma_at_zero():
    """erfcx from 1e2 to inf (its log_ndtr form cancels there: 3e-4 relative at 1e6, NaN at
    inf); P(0, x) = 1 and Q(0, x) = 0 for x > 0 as in ATen (JAX: NaN), Q never negative."""
    x = torch.tensor([-7.25, -1.0, 0.0, 1.0, 9.9, 10.0, 50.0, 99.0, 100.0, 1e3, 1e6, float("inf")], dtype=torch.float64)
    check(aten.special_erfcx.default, x, rtol=chip.tolerance("float64", cpu=1e-11, tpu=1e-8), atol=0)
    check(aten.special_erfcx.default, x.float(), rtol=2e-5, atol=0)
    a = torch.tensor([0.0, 0.0, 0.0, 2.0, 1e-30], dtype=torch.float64)
    y = torch.tensor([1e-30, 1.0, 1e6, 3.0, 0.5], dtype=torch.float64)
    check(aten.igamma.default, a[:4], y[:4], rtol=1e-12, atol=0)
    check(aten.igammac.default, a[:4], y[:4], rtol=1e-12, atol=0)
    # a tiny a: Q is 1e-30 (ATen) and comes out within float64 rounding of 1 - P, not below 0
    q = torch.igammac(a[4:].to("tpu"), y[4:].to("tpu")).cpu()
    assert 0 <= q.item() < 1e-13


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_and_lcm_at_the_integer_limits(dtype):
    """ATen's results where |x| overflows and products wrap (gcd(-2**31, 6) = -2 in int32;
    `jnp.gcd` never returned there), zeros, signs."""
    low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    a = torch.tensor([low, high, -7, 12, 0, 0, 35, -35, low, 1, high], dtype=dtype)
    b = torch.tensor([6, 6, 21, -18, 0, 5, 0, -14, low, high, high - 1], dtype=dtype)
    check(aten.gcd.default, a, b, atol=0, rtol=0)
    check(aten.lcm.default, a, b, atol=0, rtol=0)
    if dtype == torch.int32:
        assert_lowers_for_tpu(aten.gcd.default, a, b)


POLYNOMIALS = [
    f"special_{kind}_polynomial_{letter}"
    for kind, letters in [("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ["h", "he"])]
    for letter in letters
] + ["special_laguerre_polynomial_l", "special_legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomials_match_aten(name):
    """Every degree up to 12 (the recurrence, and the trigonometric forms ATen switches to past
    6 or 8 inside [-1, 1]), fractional, negative and non-finite degrees (0, as in ATen) in the
    same tensor as the others: the recurrence's loop runs to the largest degree, and a NaN
    there once gave every other element P_1."""
    op = getattr(aten, name).default
    x = torch.tensor([-3.5, -1.0, -0.7, -0.2, 0.0, 0.3, 0.5, 0.95, 1.0, 1.5, 2.5], dtype=torch.float64)
    n = [0, 1, 2, 3, 4.5, 6, 7, 8, 9, 12, -1, -2.5, float("nan"), float("inf"), -float("inf")]
    xs, ns = torch.meshgrid(x, torch.tensor(n, dtype=torch.float64), indexing="ij")
    check(op, xs.contiguous(), ns.contiguous(), rtol=1e-9, atol=1e-9)
    check(op, xs.float().contiguous(), ns.float().contiguous(), rtol=1e-4, atol=1e-4)


def test_integer_power_and_truncating_division():
    base = torch.arange(-4, 5).reshape(9, 1)
    exponent = torch.tensor([-3, -2, -1, 0, 1, 2, 63, 64, 65, 100])
    check(aten.pow.Tensor_Tensor, base, exponent, atol=0, rtol=0)  # negative powers: 0, or +-1 for +-1
    check(aten.pow.Scalar, 3, exponent, atol=0, rtol=0)  # 3 ** 64 wraps around as in ATen
    check(aten.pow.Tensor_Tensor, base.int(), exponent.int(), atol=0, rtol=0)
    check(aten.div.Tensor_mode, torch.tensor([[7], [-7], [9]]), torch.tensor([2, -3]), rounding_mode="trunc")


@pytest.mark.parametrize("order", [0, 1])
def test_bessel_j_matches_float64(order):
    """J0/J1 on both sides of the switch from the series to Hankel's expansion at 12, against
    mpmath (ATen's own float64 J1(7) is 5.6e-6 off); NaN at +-inf as in ATen."""
    xs = [1e-6, 0.5, 3.0, -7.0, 11.99, 12.0, 12.01, 12.5, 30.0, 1e4]
    x = torch.tensor(xs, dtype=torch.float64)
    want = torch.tensor([float(mpmath.besselj(order, v)) for v in xs], dtype=torch.float64)
    op = aten.special_bessel_j0.default if order == 0 else aten.special_bessel_j1.default
    torch.testing.assert_close(run_lowering(op, x), want, rtol=RTOL64, atol=0)
    edges = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=torch.float64)
    check(op, edges)


@pytest.mark.slow  # libtpu compiles each series for 6-7 s on a 2-core host
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("order", [0, 1])
def test_bessel_j_compiles_for_a_tpu(order, dtype):
    op = aten.special_bessel_j0.default if order == 0 else aten.special_bessel_j1.default
    assert_lowers_for_tpu(op, torch.tensor([0.5, 12.5], dtype=dtype))


@pytest.mark.parametrize(
    "op",
    [
        aten.special_modified_bessel_k0.default,
        aten.special_modified_bessel_k1.default,
        aten.special_scaled_modified_bessel_k0.default,
        aten.special_scaled_modified_bessel_k1.default,
    ],
)
def test_bessel_k_matches_float64(op):
    """K0/K1 from their integral (JAX has none): float64 accuracy from tiny to huge x, ATen's edges."""
    x = torch.tensor(
        [0.0, -1.0, float("nan"), float("inf"), TINY64, 1e-6, 0.01, 0.5, 1.0, 2.5, 7.0, 30.0, 90.0, 700.0, 1e4],
        dtype=torch.float64,
    )
    check(op, x, rtol=RTOL64, atol=1e-300)
    check(op, x.float().clamp(max=80), rtol=1e-5, atol=1e-6)


def test_airy_ai_matches_aten():
    """Ai from Cephes' approximations: each branch (below -2.09, series, from 2.09, past 8.32)
    and ATen's edges; float32's phase rounding at large -x is ~3e-6 from float64 for both."""
    x = torch.tensor(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            -200.0,
            -10.0,
            -2.09,
            -1.0,
            0.0,
            1.0,
            2.08,
            2.09,
            8.4,
            103.0,
            104.0,
        ],
        dtype=torch.float64,
    )
    check(aten.special_airy_ai.default, x, rtol=1e-12, atol=1e-300)
    wide = torch.linspace(-30, 30, 2001)
    check(aten.special_airy_ai.default, wide, rtol=1e-4, atol=5e-6)
    assert_lowers_for_tpu(aten.special_airy_ai.default, wide)


@pytest.mark.parametrize("op", [aten.special_bessel_y0.default, aten.special_bessel_y1.default])
def test_bessel_y_matches_float64(op):
    """Y0/Y1 (JAX has none): series up to 12, Hankel's expansion beyond; ATen's edges."""
    x = torch.tensor(
        [0.0, -1.0, float("nan"), float("inf"), TINY64, 1e-6, 0.01, 0.5, 1.0, 2.5, 7.0, 11.9, 12.1, 30.0, 700.0, 1e4],
        dtype=torch.float64,
    )
    # ATen's own float64 Y0(7) is 1.2e-8 off the true value (scipy, mpmath); ours is not
    check(op, x, rtol=1e-8, atol=3e-8)
    # at 1e4, ATen's float32 sine of the phase is off by 2e-6
    check(op, x[:-1].float(), rtol=1e-5, atol=1e-6)
