"""Value checks for OpInfo entries with random outputs.

The device draws from jax.random, so its samples cannot equal CPU's. What a user can still
check, and what each checker here asserts on the device's output for one OpInfo sample:
the values lie in the distribution's support, and the sample moments (or, for dropout, the
kept fraction and the scaling of the kept values) agree with the distribution's parameters
within `SIGMAS` standard errors for the sample's size. The harness also checks that the same
seed gives the same output on the device. An entry counts as value-checked ("pass") only
when every sample passes all of these.

Each checker gets the sample's arguments (CPU tensors, as they were before the op ran) and
the device's output moved to CPU, and raises `Mismatch` naming what is wrong.
"""

from __future__ import annotations

import math

import torch

SIGMAS = 6.0  # a correct sampler fails one bound in about 5e8 draws


class RandomCheckFailed(AssertionError):
    """The device's random output is outside its distribution (wrapped into a Mismatch)."""


def snapshot(value):
    """A deep copy of a sample part (the op may write into its input: dropout inplace, uniform_)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def _fail(what: str) -> None:
    raise RandomCheckFailed(what)


def _check_mean(what: str, values: torch.Tensor, mean: float, std: float) -> None:
    """The sample mean of `values` (i.i.d. with this mean and std) within SIGMAS standard errors."""
    n = values.numel()
    if n == 0:
        return
    got = values.double().mean().item()
    bound = SIGMAS * std / math.sqrt(n) + 1e-6 * (1 + abs(mean))
    if not abs(got - mean) <= bound:
        _fail(f"{what}: sample mean {got:.6g} of {n} draws, expected {mean:.6g} +- {bound:.3g}")


def _check_standard_normal(what: str, z: torch.Tensor) -> None:
    """z ~ N(0, 1): its mean and its mean square (variance 2) within bounds."""
    _check_mean(f"{what} (standardised mean)", z, 0.0, 1.0)
    _check_mean(f"{what} (standardised second moment)", z.double() ** 2, 1.0, math.sqrt(2.0))


def _check_within(what: str, values: torch.Tensor, low: float, high: float, high_open: bool = True) -> None:
    if values.numel() == 0:
        return
    inside = (values >= low) & ((values < high) if high_open else (values <= high))
    if not bool(inside.all()):
        bad = values[~inside][0].item()
        _fail(f"{what}: value {bad} outside [{low}, {high}{')' if high_open else ']'}")


def _check_integral(what: str, values: torch.Tensor) -> None:
    if values.numel() and not bool((values == values.round()).all()):
        _fail(f"{what}: non-integer values")


# --------------------------------------------------------------------- distributions


def _bernoulli(args, out):
    p = args["input"].double()
    out = out.double()
    _check_within("bernoulli", out, 0, 1, high_open=False)
    _check_integral("bernoulli", out)
    if out.numel():
        # independent Bernoulli(p_i) draws: mean(draw - p) has variance mean(p_i (1 - p_i)) / n
        _check_mean("bernoulli (mean of draws minus p)", out - p, 0.0, math.sqrt((p * (1 - p)).mean().item()))


def _uniform(args, out):
    low, high = args["args"]
    _check_within("uniform", out, low, high, high_open=False)
    _check_mean("uniform", out, (low + high) / 2, (high - low) / math.sqrt(12))


def _cauchy(args, out):
    median, sigma = args["args"]
    # no moments: the fraction within one scale of the median is 1/2
    inside = ((out.double() - median).abs() <= sigma).double()
    _check_mean("cauchy (fraction within one scale of the median)", inside, 0.5, 0.5)


def _exponential(args, out):
    (rate,) = args["args"]
    _check_within("exponential", out, 0, math.inf)
    _check_mean("exponential", out, 1 / rate, 1 / rate)


def _geometric(args, out):
    (p,) = args["args"]
    _check_within("geometric", out, 1, math.inf)
    _check_integral("geometric", out)
    _check_mean("geometric", out, 1 / p, math.sqrt(1 - p) / p)


def _log_normal(args, out):
    mean, std = args["args"]
    _check_within("log_normal", out, 0, math.inf)
    _check_standard_normal("log_normal (log of draws)", (out.double().log() - mean) / std)


def _normal(args, out):
    mean, std = args["input"], args["args"][0]
    _check_standard_normal("normal", (out.double() - torch.as_tensor(mean).double()) / torch.as_tensor(std).double())


def _normal_in_place(args, out):
    mean, std = args["args"]
    _check_standard_normal("normal_", (out.double() - mean) / std)


def _normal_number_mean(args, out):
    std, mean = args["input"], args["args"][0]  # OpInfo's op is `lambda std, mean, ...: torch.normal(mean, std, ...)`
    _check_standard_normal("normal(float mean)", (out.double() - mean) / torch.as_tensor(std).double())


def _randn_like(args, out):
    _check_standard_normal("randn_like", out.double())


def _check_randint(what, low, high, out):
    _check_within(what, out, low, high)
    _check_integral(what, out)
    _check_mean(what, out, (low + high - 1) / 2, math.sqrt(((high - low) ** 2 - 1) / 12))


def _randint_like(args, out):
    bounds = args["args"]
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds[:2]
    _check_randint("randint_like", low, high, out.double())


def _randint(args, out):
    bounds = (args["input"], *args["args"][:-1])
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds[:2]
    _check_randint("randint", low, high, out.double())


def _randn(args, out):
    _check_standard_normal("randn", out.double())


def _multinomial(args, out):
    weights = args["input"].double()
    draws = args["args"][0]
    replacement = args["kwargs"].get("replacement", False)
    rows = weights.reshape(-1, weights.shape[-1])
    out = out.reshape(rows.shape[0], draws)
    _check_within("multinomial", out, 0, rows.shape[1])
    for row, picked in zip(rows, out):
        if bool((row[picked] == 0).any()):
            _fail("multinomial: drew a category of weight 0")
        if not replacement:
            if picked.unique().numel() != draws:
                _fail(f"multinomial without replacement drew a category twice: {picked.tolist()}")
            continue
        p = row / row.sum()
        for k in range(rows.shape[1]):  # each category's count is Binomial(draws, p_k)
            _check_mean(
                f"multinomial (frequency of category {k})",
                (picked == k).double(),
                p[k].item(),
                math.sqrt(p[k].item() * (1 - p[k].item())),
            )


# --------------------------------------------------------------------- dropout


def _dropout_parts(args, training_default: bool):
    """(input, p, training) with the functional's defaults (alpha dropouts default to eval)."""
    x = args["input"].double()
    kwargs = args["kwargs"]
    return x, kwargs.get("p", 0.5), kwargs.get("training", training_default)


def _rounding(dtype: torch.dtype) -> float:
    """Relative rounding of the output's dtype (float32's 1e-5 or coarser)."""
    return max(4 * torch.finfo(dtype).eps, 1e-5) if dtype.is_floating_point else 1e-5


def _check_kept(what, x, out, kept, p, kept_value, group: int, rtol: float):
    """Kept entries equal `kept_value`, the kept fraction is 1 - p (draws are per `group` elements)."""
    if not torch.allclose(out[kept], kept_value[kept], rtol=rtol, atol=rtol):
        _fail(f"{what}: kept values are not the input scaled as ATen scales them")
    if x.numel() and 0 < p < 1:
        _check_mean(
            f"{what} (kept fraction, p={p})", kept.double().reshape(-1, group)[:, 0], 1 - p, math.sqrt(p * (1 - p))
        )


def _check_identity(what, x, out):
    if not torch.equal(out.double(), x):
        _fail(f"{what}: without training (or with p=0) the output must be the input")


def _feature_mask_constant(what, kept, group):
    rows = kept.reshape(-1, group)
    if rows.numel() and not bool((rows == rows[:, :1]).all()):
        _fail(f"{what}: a feature map is partly dropped (the mask must be per channel)")


def _trivial_dropout(what: str, x, out, p: float, training: bool) -> bool:
    """Checks the cases with no randomness (eval, p=0, p=1); True when one of them applied."""
    if not training or p == 0:
        _check_identity(what, x, out)
        return True
    if p == 1:
        if bool((out != 0).any()):
            _fail(f"{what}: p=1 must zero everything")
        return True
    return False


def _dropout_checker(what: str, feature_dims: int = 0):
    def check(args, out):
        x, p, training = _dropout_parts(args, training_default=True)
        rtol = _rounding(out.dtype)
        out = out.double()
        if _trivial_dropout(what, x, out, p, training):
            return
        group = math.prod(x.shape[x.ndim - feature_dims :]) if feature_dims and x.ndim > feature_dims else 1
        last = x.shape[-1] if feature_dims and x.ndim else 1
        nonzero = x != 0
        kept = (out != 0) | ~nonzero
        if bool((out[~kept] != 0).any()):
            _fail(f"{what}: dropped values are not 0")
        if feature_dims:
            _feature_mask_constant(what, kept, last)
        _check_kept(what, x, out, kept, p, x / (1 - p), group, rtol)

    return check


ALPHA = 1.7580993408473766  # SELU's -scale * alpha: alpha dropout's value for a dropped unit


def _alpha_dropout_checker(what: str, feature: bool = False):
    def check(args, out):
        x, p, training = _dropout_parts(args, training_default=False)
        rtol = _rounding(out.dtype)
        out = out.double()
        if _trivial_dropout(what, x, out, p, training):
            return
        # ATen: a = ((alpha^2 p + 1)(1 - p))^-1/2; kept: a x + alpha a p; dropped: alpha a (p - 1)
        a = 1 / math.sqrt((ALPHA * ALPHA * p + 1) * (1 - p))
        dropped_value = ALPHA * a * (p - 1)
        kept_value = a * x + ALPHA * a * p
        kept = (out - kept_value).abs() <= rtol * (1 + kept_value.abs())
        dropped = (out - dropped_value).abs() <= rtol * (1 + abs(dropped_value))
        if not bool((kept | dropped).all()):
            _fail(f"{what}: values that are neither a kept unit (a x + b) nor a dropped one ({dropped_value:.6g})")
        # in bfloat16 a kept unit can round onto the dropped value: such units fit either
        kept, dropped = kept & ~dropped, dropped & ~kept
        group = math.prod(x.shape[2:]) if feature and x.ndim > 2 else 1  # ATen: one draw per (N, C)
        kept_groups, dropped_groups = kept.reshape(-1, group).any(1), dropped.reshape(-1, group).any(1)
        if bool((kept_groups & dropped_groups).any()):
            _fail(f"{what}: a feature map is partly dropped (the mask must be per channel)")
        if x.numel() and 0 < p < 1:
            _check_mean(f"{what} (kept fraction, p={p})", kept_groups.double(), 1 - p, math.sqrt(p * (1 - p)))

    return check


def _rrelu(args, out):
    """Non-negative inputs pass; a negative one is scaled by a slope from U(lower, upper) in
    training (their mean within bounds), by (lower + upper) / 2 in eval."""
    x, kwargs = args["input"].double(), args["kwargs"]
    lower, upper = kwargs.get("lower", 1 / 8), kwargs.get("upper", 1 / 3)
    rtol = _rounding(out.dtype)
    out = out.double()
    if not torch.equal(out[x >= 0], x[x >= 0]):
        _fail("rrelu: non-negative inputs must pass unchanged")
    negative = x < 0
    slopes = out[negative] / x[negative]
    if not kwargs.get("training", False):
        if not torch.allclose(slopes, torch.full_like(slopes, (lower + upper) / 2), rtol=rtol):
            _fail("rrelu (eval): negative inputs must be scaled by (lower + upper) / 2")
        return
    _check_within("rrelu (slopes)", slopes, lower * (1 - rtol), upper * (1 + rtol), high_open=False)
    _check_mean("rrelu (slopes)", slopes, (lower + upper) / 2, (upper - lower) / math.sqrt(12))


# --------------------------------------------------------------------- fractional max pooling


def _fractional_max_pool_checker(what: str, spatial: int):
    """The windows are random; every output must still be its plane's input value at the
    returned index (without indices: a value that occurs in its plane). The window rule
    itself is checked against CPU with given samples in test_opinfo.py."""

    def check(args, values, indices=None):
        x = args["input"]
        if x.numel() == 0:
            return
        planes = x.reshape(-1, math.prod(x.shape[-spatial:]))
        got = values.reshape(planes.shape[0], -1)
        if indices is None:  # values only: each must occur in its plane
            if got.numel() and not bool((got[:, :, None] == planes[:, None, :]).any(-1).all()):
                _fail(f"{what}: an output value does not occur in its input plane")
            return
        flat = indices.reshape(planes.shape[0], -1)
        if flat.numel() and not (bool((flat >= 0).all()) and bool((flat < planes.shape[1]).all())):
            _fail(f"{what}: an index outside its input plane")
        if not torch.equal(planes.gather(1, flat), got):
            _fail(f"{what}: values are not the input at the returned indices")

    return check


RANDOM_CHECKS = {
    "bernoulli": _bernoulli,
    "cauchy": _cauchy,
    "exponential": _exponential,
    "geometric": _geometric,
    "log_normal": _log_normal,
    "normal": _normal,
    "normal.in_place": _normal_in_place,
    "normal.number_mean": _normal_number_mean,
    "uniform": _uniform,
    "multinomial": _multinomial,
    "rand_like": _randn_like,  # OpInfo's rand_like entry calls torch.randn_like
    "randn_like": _randn_like,
    "randint_like": _randint_like,
    "randint": _randint,
    "randn": _randn,
    "nn.functional.dropout": _dropout_checker("dropout"),
    "nn.functional.dropout2d": _dropout_checker("dropout2d", feature_dims=2),
    "nn.functional.dropout3d": _dropout_checker("dropout3d", feature_dims=3),
    "nn.functional.alpha_dropout": _alpha_dropout_checker("alpha_dropout"),
    "nn.functional.feature_alpha_dropout.with_train": _alpha_dropout_checker("feature_alpha_dropout", feature=True),
    "nn.functional.feature_alpha_dropout.without_train": _alpha_dropout_checker("feature_alpha_dropout", feature=True),
    "nn.functional.rrelu": _rrelu,
    "nn.functional.fractional_max_pool2d": _fractional_max_pool_checker("fractional_max_pool2d", 2),
    "nn.functional.fractional_max_pool3d": _fractional_max_pool_checker("fractional_max_pool3d", 3),
}
