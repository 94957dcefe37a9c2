"""Softmax, layer/batch/group normalisation and their backward ops.

Statistics are computed in float32 for half-precision inputs ("opmath"), as PyTorch's
CPU kernels do; saved mean/rstd come back in the dtype and shape ATen's meta functions
give (in eval mode, the running statistics used, where ATen's CPU kernel returns empty
tensors).

Batch norm and running statistics. In ATen, `native_batch_norm` and
`_native_batch_norm_legit` update `running_mean`/`running_var` IN PLACE (training
mode), but a lowering is a pure function. So:
- `_native_batch_norm_legit_functional` returns ATen's five outputs
  (out, save_mean, save_invstd, new_running_mean, new_running_var): this is the form
  AOTAutograd/`torch.compile` graphs contain.
- `native_batch_norm` and `_native_batch_norm_legit` return ATen's three outputs.
  Their records' `functionalized=` tells the eager dispatcher how to honour the mutation:
  run the functional op's lowering on the same arguments, write its outputs 3 and 4
  back into arguments 3 and 4 (running_mean, running_var) and return outputs 0..2.
  Without that write-back the running statistics would silently stay unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops._common import canonical_dim, require_shape, scalar_as_vector
from tpu_backend.ops.registry import Functionalized, jax_dtype, lowers

aten = torch.ops.aten


def _opmath(x):
    """Half-precision inputs are normalised in float32 and cast back at the end."""
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


# --- softmax ----------------------------------------------------------------------------


@lowers(aten._softmax.default)
@scalar_as_vector
def softmax(x, dim, half_to_float):
    out = jax.nn.softmax(_opmath(x), axis=canonical_dim(dim, x.ndim))
    return out if half_to_float else out.astype(x.dtype)


@lowers(aten._log_softmax.default)
@scalar_as_vector
def log_softmax(x, dim, half_to_float):
    out = jax.nn.log_softmax(_opmath(x), axis=canonical_dim(dim, x.ndim))
    return out if half_to_float else out.astype(x.dtype)


@lowers(aten._safe_softmax.default)
@scalar_as_vector
def safe_softmax(x, dim, dtype=None):
    """Softmax whose fully masked rows (all -inf) give zeros instead of NaN (SDPA's math path)."""
    xf = _opmath(x if dtype is None else x.astype(jax_dtype(dtype)))
    axis = canonical_dim(dim, x.ndim)
    out = jax.nn.softmax(xf, axis=axis)
    all_masked = jnp.all(xf == -jnp.inf, axis=axis, keepdims=True)
    out = jnp.where(all_masked, 0.0, out)
    return out.astype(jax_dtype(dtype) if dtype is not None else x.dtype)


@lowers(aten._softmax_backward_data.default)
@scalar_as_vector
def softmax_backward_data(grad_output, output, dim, input_dtype):
    axis = canonical_dim(dim, output.ndim)
    g, y = _opmath(grad_output), _opmath(output)
    grad_input = y * (g - jnp.sum(g * y, axis=axis, keepdims=True))
    return grad_input.astype(jax_dtype(input_dtype))


@lowers(aten._log_softmax_backward_data.default)
@scalar_as_vector
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    axis = canonical_dim(dim, output.ndim)
    g, y = _opmath(grad_output), _opmath(output)
    grad_input = g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)
    return grad_input.astype(jax_dtype(input_dtype))


# --- layer norm -------------------------------------------------------------------------


def _layer_norm(x, normalized_shape, weight, bias, eps):
    require_shape(
        "native_layer_norm", "the input's last dims", x.shape[x.ndim - len(normalized_shape) :], normalized_shape
    )
    for name, parameter in (("weight", weight), ("bias", bias)):
        if parameter is not None:
            require_shape("native_layer_norm", name, parameter.shape, normalized_shape)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = _opmath(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True) + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * _opmath(weight)
    if bias is not None:
        out = out + _opmath(bias)
    return out.astype(x.dtype), mean, rstd


@lowers(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    """(out, mean, rstd); mean and rstd keep the normalised dims as size 1."""
    out, mean, rstd = _layer_norm(x, normalized_shape, weight, bias, eps)
    stats_dtype = x.dtype  # ATen's CPU kernel saves stats in the input dtype
    return out, mean.astype(stats_dtype), rstd.astype(stats_dtype)


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """(grad_input, grad_weight, grad_bias), None where output_mask is False or the
    parameter is absent. Uses the saved mean/rstd, like ATen."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    g, xf = _opmath(grad_out), _opmath(x)
    mean, rstd = _opmath(mean), _opmath(rstd)
    x_hat = (xf - mean) * rstd
    g_hat = g * _opmath(weight) if weight is not None else g
    grad_input = rstd * (
        g_hat - jnp.mean(g_hat, axis=axes, keepdims=True) - x_hat * jnp.mean(g_hat * x_hat, axis=axes, keepdims=True)
    )
    grad_weight = jnp.sum(g * x_hat, axis=batch_axes).astype(weight.dtype) if weight is not None else None
    grad_bias = jnp.sum(g, axis=batch_axes).astype(bias.dtype) if bias is not None else None
    outputs = (grad_input.astype(x.dtype), grad_weight, grad_bias)
    return tuple(o if wanted else None for o, wanted in zip(outputs, output_mask))


# --- batch norm -------------------------------------------------------------------------


def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _reduce_axes(x):
    return tuple(d for d in range(x.ndim) if d != 1)


def _batch_stats(x):
    """Per-channel mean and biased variance, in opmath."""
    xf = _opmath(x)
    axes = _reduce_axes(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_channel_shape(x))), axis=axes)
    return mean, var


def _normalize(x, mean, invstd, weight, bias):
    shape = _channel_shape(x)
    out = (_opmath(x) - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _opmath(weight).reshape(shape)
    if bias is not None:
        out = out + _opmath(bias).reshape(shape)
    return out.astype(x.dtype)


def _stats_dtype(x):
    return x.dtype  # ATen's CPU kernels save batch statistics in the input dtype


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """ATen's five batch-norm results: out, save_mean, save_invstd, new running stats."""
    stats = _stats_dtype(x)
    if training:
        mean, var = _batch_stats(x)
        invstd = jax.lax.rsqrt(var + eps)
        count = x.size // x.shape[1]
        new_mean = new_var = None
        if running_mean is not None:
            new_mean = ((1 - momentum) * running_mean + momentum * mean).astype(running_mean.dtype)
        if running_var is not None:
            unbiased = var * (count / max(count - 1, 1))
            new_var = ((1 - momentum) * running_var + momentum * unbiased).astype(running_var.dtype)
        out = _normalize(x, mean, invstd, weight, bias)
        return out, mean.astype(stats), invstd.astype(stats), new_mean, new_var
    if running_mean is None or running_var is None:
        raise ValueError("aten.native_batch_norm: evaluation mode needs running_mean and running_var")
    mean, invstd = _opmath(running_mean), jax.lax.rsqrt(_opmath(running_var) + eps)
    out = _normalize(x, mean, invstd, weight, bias)
    # save_mean/save_invstd in eval mode: the statistics used, as PyTorch's meta kernel (the
    # shapes torch.compile's graphs expect) and CUDA give them; ATen's CPU kernel returns
    # empty tensors there, which a compiled graph refused as a wrong shape
    return out, mean, invstd, running_mean, running_var


# Running stats: run the functional op, write its outputs 3, 4 into arguments 3, 4.
_RUNNING_STATS = Functionalized(aten._native_batch_norm_legit_functional.default, {3: 3, 4: 4}, 3)


@lowers(aten.native_batch_norm.default, aten._native_batch_norm_legit.default, functionalized=_RUNNING_STATS)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd). Running stats: `functionalized` (module docstring)."""
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lowers(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowers(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, training, momentum, eps)[:3]


@lowers(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    """(grad_input, grad_weight, grad_bias); None where output_mask is False."""
    shape = _channel_shape(x)
    axes = _reduce_axes(x)
    if train:
        mean, invstd = _opmath(save_mean), _opmath(save_invstd)
    else:
        mean, invstd = _opmath(running_mean), jax.lax.rsqrt(_opmath(running_var) + eps)
    g = _opmath(grad_out)
    x_hat = (_opmath(x) - mean.reshape(shape)) * invstd.reshape(shape)
    w = _opmath(weight).reshape(shape) if weight is not None else 1.0
    grad_bias = jnp.sum(g, axis=axes)
    grad_weight = jnp.sum(g * x_hat, axis=axes)
    if train:
        count = x.size // x.shape[1]
        grad_input = (
            w
            * invstd.reshape(shape)
            * (g - (grad_bias / count).reshape(shape) - x_hat * (grad_weight / count).reshape(shape))
        )
    else:
        grad_input = g * w * invstd.reshape(shape)
    param_dtype = weight.dtype if weight is not None else x.dtype
    outputs = (grad_input.astype(x.dtype), grad_weight.astype(param_dtype), grad_bias.astype(param_dtype))
    return tuple(o if wanted else None for o, wanted in zip(outputs, output_mask))


# The newer (torch >= 2.3) spelling: "with_update" is training, "no_update" evaluation;
# a fourth output is a backend "reserve" buffer (empty uint8 on CPU).


def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lowers(
    aten._batch_norm_with_update.default,
    functionalized=Functionalized(aten._batch_norm_with_update_functional.default, {3: 4, 4: 5}, 4),
)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    """(out, save_mean, save_invstd, reserve). Running stats: `functionalized`."""
    out, mean, invstd, _, _ = _batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, _reserve()


@lowers(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, _reserve(), new_mean, new_var


@lowers(aten._batch_norm_no_update.default)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None  # no stats: normalise by the batch
    out, mean, invstd = _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]
    return out, mean, invstd, _reserve()


@lowers(aten.batch_norm_backward.default)
def batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    """`save_var` holds the saved inverse std, as in `native_batch_norm_backward`."""
    train = update or running_mean is None
    return native_batch_norm_backward(
        grad_out, x, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask
    )


# --- group norm -------------------------------------------------------------------------


def _group_stats(x, n, c, hxw, group):
    grouped = _opmath(x).reshape(n, group, (c // group) * hxw)
    mean = jnp.mean(grouped, axis=-1)
    var = jnp.mean(jnp.square(grouped - mean[..., None]), axis=-1)
    return grouped, mean, var


@lowers(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    """(out, mean, rstd) with mean/rstd of shape (N, group)."""
    grouped, mean, var = _group_stats(x, N, C, HxW, group)
    rstd = jax.lax.rsqrt(var + eps)
    out = ((grouped - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = _channel_shape(x)
    if weight is not None:
        out = out * _opmath(weight).reshape(shape)
    if bias is not None:
        out = out + _opmath(bias).reshape(shape)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    """(grad_input, grad_weight, grad_bias) from the saved mean/rstd; None where
    output_mask is False."""
    shape = _channel_shape(x)
    per_group = (C // group) * HxW  # explicit: -1 cannot be inferred for an empty batch
    grouped = _opmath(x).reshape(N, group, per_group)
    x_hat = ((grouped - _opmath(mean)[..., None]) * _opmath(rstd)[..., None]).reshape(x.shape)
    g = _opmath(grad_out)
    axes = _reduce_axes(x)
    grad_weight = jnp.sum(g * x_hat, axis=axes)
    grad_bias = jnp.sum(g, axis=axes)
    g_hat = (g * _opmath(weight).reshape(shape) if weight is not None else g).reshape(N, group, per_group)
    x_hat_grouped = x_hat.reshape(N, group, per_group)
    grad_input = _opmath(rstd)[..., None] * (
        g_hat
        - jnp.mean(g_hat, axis=-1, keepdims=True)
        - x_hat_grouped * jnp.mean(g_hat * x_hat_grouped, axis=-1, keepdims=True)
    )
    param_dtype = weight.dtype if weight is not None else x.dtype
    outputs = (
        grad_input.reshape(x.shape).astype(x.dtype),
        grad_weight.astype(param_dtype),
        grad_bias.astype(param_dtype),
    )
    return tuple(o if wanted else None for o, wanted in zip(outputs, output_mask))


# --- weight norm ------------------------------------------------------------------------------


def _norm_except(v, dim):
    """L2 norm over every dim but `dim` (all dims when dim == -1), kept for broadcasting."""
    axes = tuple(d for d in range(v.ndim) if d != dim) if dim != -1 else tuple(range(v.ndim))
    return jnp.sqrt(jnp.sum(jnp.square(_opmath(v)), axis=axes, keepdims=True))


@lowers(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim=0):
    """(w, norms): w = g * v / ||v||, norms shaped like g (float32 for half inputs)."""
    norms = _norm_except(v, dim)
    w = (_opmath(v) * (_opmath(g) / norms)).astype(v.dtype)
    return w, norms.reshape(g.shape)


@lowers(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    _, vjp = jax.vjp(lambda v, g: weight_norm_interface(v, g, dim)[0], saved_v, saved_g)
    return vjp(grad_w)
