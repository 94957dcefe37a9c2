"""Random ops (rand, randn, randint, randperm, normal, uniform, bernoulli, multinomial,
exponential and friends, native_dropout), all registered with `needs_rng=True`.

Each receives a `key=` keyword: a `jax.random` key the device draws from its key
stream (`tpu_backend/random.py`), so results are reproducible under
`torch.manual_seed` but are not the same numbers as PyTorch's CPU generator.
Generator arguments are accepted and ignored. Half-precision samples are drawn in
float32 and rounded, so bfloat16 `rand` never returns values outside [0, 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_backend.eager.errors import torch_dtype_name
from tpu_backend.ops._common import default_float, elementwise, is_floating, jax_dtype
from tpu_backend.ops.registry import Functionalized, lowers, torch_dtype

aten = torch.ops.aten


def _sample_dtype(dtype):
    """Draw in float32 (or float64) and cast: jax.random's half-precision draws are coarse."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _float_dtype(dtype):
    return jax_dtype(dtype) if dtype is not None else default_float()


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    sample = jax.random.uniform(key, tuple(shape), _sample_dtype(dtype), low, high)
    if dtype == _sample_dtype(dtype):
        return sample
    # Rounding to a narrower dtype can reach `high`: clamp to the largest value below it.
    # (A test of the rounded value fails on a TPU, whose compiler may compare before rounding.)
    below_high = np.nextafter(np.asarray(high, jnp.dtype(dtype)), np.asarray(low, jnp.dtype(dtype)))
    return jnp.minimum(sample, below_high.astype(np.float32)).astype(dtype)


def _normal(key, shape, dtype):
    return jax.random.normal(key, tuple(shape), _sample_dtype(dtype)).astype(dtype)


@lowers(aten.rand.default, aten.rand.generator, needs_rng=True)
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _uniform(key, size, _float_dtype(dtype))


@lowers(aten.randn.default, aten.randn.generator, needs_rng=True)
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _normal(key, size, _float_dtype(dtype))


@lowers(aten.rand_like.default, aten.rand_like.generator, needs_rng=True)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return _uniform(key, x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


@lowers(aten.randn_like.default, aten.randn_like.generator, needs_rng=True)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return _normal(key, x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


def _randint(key, low, high, shape, dtype):
    return jax.random.randint(key, tuple(shape), low, high, jnp.int64).astype(dtype)


@lowers(aten.randint.default, aten.randint.generator, needs_rng=True)
def randint(high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _randint(key, 0, high, size, jax_dtype(dtype) if dtype is not None else jnp.int64)


@lowers(aten.randint.low, aten.randint.low_generator, needs_rng=True)
def randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return _randint(key, low, high, size, jax_dtype(dtype) if dtype is not None else jnp.int64)


@lowers(
    aten.randint_like.default,
    aten.randint_like.generator,
    aten.randint_like.Tensor,
    aten.randint_like.Tensor_generator,
    needs_rng=True,
)
def randint_like(
    x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _randint(key, 0, high, x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


@lowers(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, needs_rng=True)
def randint_like_low(
    x, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _randint(key, low, high, x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


@lowers(aten.randperm.default, aten.randperm.generator, needs_rng=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n).astype(jax_dtype(dtype) if dtype is not None else jnp.int64)


@lowers(aten.random.default, needs_rng=True)
def random_(x, *, generator=None, key):
    """Integers in [0, 2**mantissa] for floats (exactly representable), the dtype's range for ints."""
    if x.dtype == jnp.bool_:
        return jax.random.bernoulli(key, 0.5, x.shape)
    high = 2 ** (jnp.finfo(x.dtype).nmant + 1) + 1 if is_floating(x.dtype) else jnp.iinfo(x.dtype).max
    return _randint(key, 0, high, x.shape, x.dtype)


# ATen spells this overload "from", a Python keyword.
@lowers(getattr(aten.random, "from"), needs_rng=True)
def random_from(x, from_, to=None, *, generator=None, key):
    high = (
        to
        if to is not None
        else (jnp.iinfo(x.dtype).max if not is_floating(x.dtype) else 2 ** (jnp.finfo(x.dtype).nmant + 1))
    )
    return _randint(key, from_, high, x.shape, x.dtype)


@lowers(aten.random.to, needs_rng=True)
def random_to(x, to, *, generator=None, key):
    return _randint(key, 0, to, x.shape, x.dtype)


# --- distributions shaped like an input ------------------------------------------------------


@lowers(aten.normal_functional.default, needs_rng=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    return (mean + std * _normal(key, x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowers(aten.normal.Tensor_float, needs_rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return (mean + std * _normal(key, mean.shape, _sample_dtype(mean.dtype))).astype(mean.dtype)


@lowers(aten.normal.float_Tensor, needs_rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return (mean + std * _normal(key, std.shape, _sample_dtype(std.dtype))).astype(std.dtype)


@lowers(aten.normal.Tensor_Tensor, needs_rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    dtype = jnp.result_type(mean.dtype, std.dtype)
    return (mean + std * _normal(key, shape, _sample_dtype(dtype))).astype(dtype)


@lowers(aten.normal.float_float, needs_rng=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    out_dtype = _float_dtype(dtype)
    return (mean + std * _normal(key, size, _sample_dtype(out_dtype))).astype(out_dtype)


@lowers(aten.uniform.default, needs_rng=True)
def uniform(x, from_=0.0, to=1.0, *, generator=None, key, **kwargs):
    """`from` is a Python keyword; it can also arrive as `from=` in kwargs."""
    from_ = kwargs.pop("from", from_)
    return (from_ + (to - from_) * _uniform(key, x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowers(aten.bernoulli.default, needs_rng=True)
def bernoulli(x, *, generator=None, key):
    """`x` holds the probabilities; the result has x's dtype."""
    return (_uniform(key, x.shape, _sample_dtype(x.dtype)) < x).astype(x.dtype)


@lowers(aten.bernoulli.p, needs_rng=True)
def bernoulli_p(x, p=0.5, *, generator=None, key):
    return (_uniform(key, x.shape, jnp.float32) < p).astype(x.dtype)


@lowers(aten.bernoulli.Tensor, needs_rng=True)
def bernoulli_tensor(x, p, *, generator=None, key):
    return (_uniform(key, x.shape, jnp.float32) < jnp.broadcast_to(p, x.shape)).astype(x.dtype)


@lowers(aten.exponential.default, needs_rng=True)
def exponential(x, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(key, x.shape, _sample_dtype(x.dtype)) / lambd).astype(x.dtype)


@lowers(aten.cauchy.default, needs_rng=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    return (median + sigma * jax.random.cauchy(key, x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowers(aten.log_normal.default, needs_rng=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(mean + std * _normal(key, x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowers(aten.geometric.default, needs_rng=True)
def geometric(x, p, *, generator=None, key):
    u = _uniform(key, x.shape, _sample_dtype(x.dtype))
    return jnp.ceil(jnp.log1p(-u) / jnp.log1p(-p)).astype(x.dtype)


@lowers(aten.poisson.default, needs_rng=True)
def poisson(x, generator=None, *, key):
    return jax.random.poisson(key, x, x.shape).astype(x.dtype)


@lowers(aten._standard_gamma.default, needs_rng=True)
def standard_gamma(x, generator=None, *, key):
    return jax.random.gamma(key, x.astype(_sample_dtype(x.dtype))).astype(x.dtype)


@lowers(aten.multinomial.default, needs_rng=True)
def multinomial(x, num_samples, replacement=False, *, generator=None, key):
    """Samples category indices from (unnormalised) row weights; without replacement by
    the Gumbel-top-k trick (exact for sampling without replacement). The checks are ATen's
    (its meta kernel makes few of them); those of the weights' values are not made."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got: {torch_dtype_name(torch_dtype(x.dtype))}"
        )
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if x.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if not replacement and num_samples > x.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    logits = jnp.log(x.astype(jnp.float32))
    if replacement:
        shape = x.shape[:-1] + (num_samples,)
        samples = jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
        return samples.astype(jnp.int64)
    gumbel = jax.random.gumbel(key, x.shape, jnp.float32)
    return jax.lax.top_k(logits + gumbel, num_samples)[1].astype(jnp.int64)


# --- dropout ----------------------------------------------------------------------------------


@lowers(aten.native_dropout.default, needs_rng=True)
def native_dropout(x, p, train, *, key):
    """(output, keep mask as bool). `train=None` means training, like ATen; p may be a
    traced scalar, so no Python branch on its value."""
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = _uniform(key, x.shape, jnp.float32) >= p
    scale = jnp.where(p < 1, 1.0 / (1.0 - jnp.minimum(p, 0.999999)), 0.0)
    return jnp.where(keep, x * scale.astype(x.dtype), jnp.zeros((), x.dtype)), keep


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    # ATen computes grad * mask * scale: integer and bool grads promote to the float dtype
    return elementwise(lambda g, m, s: g * m * s, grad_output, mask, scale)


def _rrelu_functional(x, noise, lower, upper, training, key):
    """(output, noise): in training each negative input gets a slope drawn from U(lower, upper)
    (recorded in `noise`, 1 for non-negative inputs); in eval the mean slope, noise untouched."""
    if not training:
        return jnp.where(x >= 0, x, x * jnp.asarray((lower + upper) / 2, x.dtype)), noise
    slope = _uniform(key, x.shape, x.dtype, lower, upper)
    new_noise = jnp.where(x >= 0, jnp.ones((), x.dtype), slope)
    return x * new_noise, new_noise.astype(noise.dtype)


@lowers(aten.rrelu_with_noise_functional.default, needs_rng=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    return _rrelu_functional(x, noise, lower, upper, training, key)


@lowers(
    aten.rrelu_with_noise.default,
    needs_rng=True,
    functionalized=Functionalized(aten.rrelu_with_noise_functional.default, {1: 1}, 1),
)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    """The output; the noise written back into its argument: `functionalized`."""
    return _rrelu_functional(x, noise, lower, upper, training, key)[0]


@lowers(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad_output, x, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:  # ATen's rule: the recorded slopes
        return (grad_output * noise).astype(grad_output.dtype)
    slope = jnp.asarray((lower + upper) / 2, grad_output.dtype)
    return jnp.where(x > 0, grad_output, grad_output * slope)
