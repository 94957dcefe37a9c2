"""Neural-network activations and the backward ops autograd emits for them.

Backward formulas follow ATen's derivative kernels (e.g. relu's gradient at exactly
the threshold is 0, hardtanh's is 0 at both edges) so gradients match PyTorch bit for
bit where the math allows; the smooth ones (mish, tanh-gelu) use `jax.vjp` of the
forward lowering, which is the same math.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch

from tpu_backend.ops._common import canonical_dim
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _zeros(x):
    return jnp.zeros_like(x)


@lowers(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x


@lowers(aten.threshold_backward.default)
def threshold_backward(grad_output, x, threshold):
    return jnp.where(x <= threshold, _zeros(grad_output), grad_output)


def _gelu(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1 + jnp.tanh(inner))
    if approximate == "none":
        return 0.5 * x * (1 + jsp.erf(x / math.sqrt(2)))
    raise ValueError(f"aten.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


@lowers(aten.gelu.default)
def gelu(x, *, approximate="none"):
    return _gelu(x, approximate)


@lowers(aten.gelu_backward.default)
def gelu_backward(grad_output, x, *, approximate="none"):
    if approximate == "none":
        cdf = 0.5 * (1 + jsp.erf(x / math.sqrt(2)))
        pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return grad_output * (cdf + x * pdf)
    _, vjp = jax.vjp(lambda v: _gelu(v, approximate), x)
    return vjp(grad_output)[0]


@lowers(aten.silu.default)
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowers(aten.silu_backward.default)
def silu_backward(grad_output, x):
    s = jax.nn.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


@lowers(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@lowers(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


def _softplus(x, beta, threshold):
    # Linear above the threshold, like ATen, to avoid exp overflow.
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(jnp.minimum(scaled, threshold))) / beta)


@lowers(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    return _softplus(x, beta, threshold)


@lowers(aten.softplus_backward.default)
def softplus_backward(grad_output, x, beta, threshold):
    z = jnp.exp(jnp.minimum(x * beta, threshold))
    return jnp.where(x * beta > threshold, grad_output, grad_output * z / (z + 1))


@lowers(aten.mish.default)
def mish(x):
    return x * jnp.tanh(_softplus(x, 1, 20))


@lowers(aten.mish_backward.default)
def mish_backward(grad_output, x):
    _, vjp = jax.vjp(mish, x)
    return vjp(grad_output)[0]


@lowers(aten.hardswish.default)
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lowers(aten.hardswish_backward.default)
def hardswish_backward(grad_output, x):
    # ATen's edges: gradient 0 at x = -3 and 1 at x = 3.
    middle = grad_output * (x / 3 + 0.5)
    return jnp.where(x <= -3, _zeros(grad_output), jnp.where(x < 3, middle, grad_output))


@lowers(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


@lowers(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, x):
    return jnp.where((x > -3) & (x < 3), grad_output / 6, _zeros(grad_output))


@lowers(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, jnp.asarray(min_val, x.dtype)), jnp.asarray(max_val, x.dtype))


@lowers(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), _zeros(grad_output), grad_output)


@lowers(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowers(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad_output, grad_output * negative_slope)


@lowers(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    negative = alpha * jnp.expm1(x * input_scale)
    return scale * jnp.where(x > 0, x, negative)


@lowers(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    if is_result:
        negative = grad_output * input_scale * (self_or_result + alpha * scale)
    else:
        negative = grad_output * input_scale * scale * alpha * jnp.exp(self_or_result * input_scale)
    return jnp.where(self_or_result > 0, grad_output * scale, negative)


@lowers(aten.selu.default)
def selu(x):
    return elu(x, 1.6732632423543772, 1.0507009873554805)


@lowers(aten.celu.default)
def celu(x, alpha=1.0):
    return elu(x, alpha, 1, 1 / alpha)


@lowers(aten.glu.default)
def glu(x, dim=-1):
    first, second = jnp.split(x, 2, axis=canonical_dim(dim, x.ndim))
    return first * jax.nn.sigmoid(second)


@lowers(aten.glu_backward.default)
def glu_backward(grad_output, x, dim):
    _, vjp = jax.vjp(lambda v: glu(v, dim), x)
    return vjp(grad_output)[0]


@lowers(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    """(output, buffer); the buffer is only a placeholder, the backward recomputes from x."""
    return jax.nn.log_sigmoid(x), _zeros(x)


@lowers(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, x, buffer):
    return grad_output * jax.nn.sigmoid(-x)


@lowers(aten.logit_backward.default)
def logit_backward(grad_output, x, eps=None):
    grad = grad_output / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, grad).astype(grad_output.dtype)
    return jnp.where((x < eps) | (x > 1 - eps), _zeros(grad_output), grad)


@lowers(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    return jnp.where(jnp.abs(x) > lambd, x, _zeros(x))


@lowers(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, x, lambd):
    return jnp.where(jnp.abs(x) > lambd, grad_out, _zeros(grad_out))


@lowers(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, _zeros(x)))


@lowers(aten.softshrink_backward.default)
def softshrink_backward(grad_output, x, lambd):
    return jnp.where(jnp.abs(x) > lambd, grad_output, _zeros(grad_output))


@lowers(aten._prelu_kernel.default)
def prelu_kernel(x, weight):
    # `prelu` (composite) has already shaped the weight to broadcast against x.
    return jnp.where(x > 0, x, weight * x)


@lowers(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, x, weight):
    """Per-element gradients; autograd reduces the weight's to its shape."""
    grad_input = jnp.where(x > 0, grad_output, weight * grad_output)
    grad_weight = jnp.where(x > 0, _zeros(grad_output), x * grad_output)
    return grad_input, grad_weight
