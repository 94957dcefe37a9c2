"""Loss functions and their backward ops (nll, mse, bce, smooth-l1, huber, soft margin).

`reduction` is ATen's enum: 0 = none, 1 = mean, 2 = sum. Cross-entropy reaches the
device as `_log_softmax` + `nll_loss_forward` (its composite decomposition).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops.registry import lowers

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == NONE:
        return loss
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    raise ValueError(f"loss reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction}")


def _reduce_grad(grad_output, shape, reduction):
    """The upstream gradient broadcast to every loss element (divided by N for mean)."""
    if reduction == NONE:
        return grad_output
    count = 1
    for size in shape:
        count *= size
    return jnp.broadcast_to(grad_output / count if reduction == MEAN else grad_output, shape)


# --- negative log likelihood ------------------------------------------------------------------


def _nll_parts(x, target, weight, ignore_index):
    """Per-sample (picked log-prob, sample weight) with classes on dim 1 (dim 0 if unbatched)."""
    class_axis = 0 if x.ndim == 1 else 1
    classes = jnp.moveaxis(x, class_axis, -1)
    valid = target != ignore_index
    safe_target = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(classes, safe_target[..., None].astype(jnp.int32), axis=-1)[..., 0]
    sample_weight = weight[safe_target] if weight is not None else jnp.ones(target.shape, x.dtype)
    sample_weight = jnp.where(valid, sample_weight, 0).astype(x.dtype)
    return picked, sample_weight, safe_target, class_axis


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    """(output, total_weight); total_weight is the summed weight of non-ignored targets
    (0 with reduction 'none', where ATen does not compute it)."""
    picked, sample_weight, _, _ = _nll_parts(x, target, weight, ignore_index)
    losses = -picked * sample_weight
    if reduction == NONE:
        return losses, jnp.zeros((), x.dtype)
    total_weight = jnp.sum(sample_weight)
    if reduction == SUM:
        return jnp.sum(losses), total_weight
    return jnp.sum(losses) / total_weight, total_weight


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    _, sample_weight, safe_target, class_axis = _nll_parts(x, target, weight, ignore_index)
    if reduction == MEAN:
        scale = grad_output / total_weight
    else:
        scale = grad_output  # per-sample for 'none', a scalar for 'sum'
    per_sample = -sample_weight * scale
    one_hot = jax.nn.one_hot(safe_target, x.shape[class_axis], dtype=x.dtype, axis=-1)
    grad = one_hot * per_sample[..., None]
    return jnp.moveaxis(grad, -1, class_axis)


# --- regression losses ----------------------------------------------------------------------------


@lowers(aten.mse_loss.default)
def mse_loss(x, target, reduction=MEAN):
    return _reduce(jnp.square(x - target), reduction)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, x, target, reduction):
    diff = x - target
    return 2 * diff * _reduce_grad(grad_output, diff.shape, reduction)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, target, reduction=MEAN, beta=1.0):
    diff = jnp.abs(x - target)
    # beta == 0 is plain L1: `diff < 0` is never true, so the division is never used.
    loss = jnp.where(diff < beta, 0.5 * diff * diff / jnp.where(diff < beta, beta, 1), diff - 0.5 * beta)
    return _reduce(loss, reduction)


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, x, target, reduction, beta):
    diff = x - target
    local = jnp.where(jnp.abs(diff) < beta, diff / jnp.where(jnp.abs(diff) < beta, beta, 1), jnp.sign(diff))
    return local * _reduce_grad(grad_output, diff.shape, reduction)


@lowers(aten.huber_loss.default)
def huber_loss(x, target, reduction=MEAN, delta=1.0):
    diff = jnp.abs(x - target)
    loss = jnp.where(diff < delta, 0.5 * diff * diff, delta * (diff - 0.5 * delta))
    return _reduce(loss, reduction)


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, x, target, reduction, delta):
    diff = x - target
    return jnp.clip(diff, -delta, delta) * _reduce_grad(grad_output, diff.shape, reduction)


# --- classification losses ---------------------------------------------------------------------


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=MEAN):
    # ATen clamps the logs at -100 so that x = 0 or 1 gives a finite loss.
    loss = -(target * jnp.maximum(jnp.log(x), -100) + (1 - target) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, x, target, weight=None, reduction=MEAN):
    local = (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        local = local * weight
    return local * _reduce_grad(grad_output, x.shape, reduction)


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=MEAN):
    log_sigmoid_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # -log(sigmoid(x))
    if pos_weight is not None:
        loss = (1 - target) * x + (1 + (pos_weight - 1) * target) * log_sigmoid_neg
    else:
        loss = (1 - target) * x + log_sigmoid_neg
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowers(aten.soft_margin_loss.default)
def soft_margin_loss(x, target, reduction=MEAN):
    return _reduce(jnp.log1p(jnp.exp(-target * x)), reduction)


@lowers(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad_output, x, target, reduction):
    z = jnp.exp(-target * x)
    return -target * z / (1 + z) * _reduce_grad(grad_output, x.shape, reduction)


# --- margin losses over classes (their forwards reach the device decomposed; the backwards
# are the vjp of the same formulas) ---------------------------------------------------------


def _multi_margin_loss(x, target, p, margin, weight, reduction):
    """mean over classes j != y of (w[y] *) max(0, margin - x[y] + x[j])^p, per sample."""
    classes = x.shape[-1] if x.ndim else 1  # a 0-d input is one sample of one class
    rows = x.reshape(-1, classes)
    labels = target.reshape(-1)
    picked = jnp.take_along_axis(rows, labels[:, None], axis=1)
    hinge = jnp.maximum(margin - picked + rows, 0) ** p
    if weight is not None:
        hinge = hinge * weight[labels][:, None]
    hinge = jnp.where(jnp.arange(rows.shape[1])[None, :] == labels[:, None], 0, hinge)
    loss = jnp.sum(hinge, axis=1) / rows.shape[1]
    return _reduce(loss.reshape(x.shape[:-1] if x.ndim else ()), reduction)


@lowers(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=MEAN):
    forward = lambda v: _multi_margin_loss(v, target, p, margin, weight, reduction)
    return jax.vjp(forward, x)[1](grad_output.astype(x.dtype))[0]


def _multilabel_margin_loss(x, target, reduction):
    """sum over target classes j and non-target classes c of max(0, 1 - x[j] + x[c]) / C;
    a row's targets are its leading entries before the first -1."""
    width = x.shape[-1] if x.ndim else 1  # a 0-d input is one sample of one class
    rows, labels = x.reshape(-1, width), target.reshape(-1, width)
    listed = jnp.cumprod(labels >= 0, axis=1).astype(bool)
    classes = jnp.arange(rows.shape[1])
    is_target = jnp.any(listed[:, :, None] & (labels[:, :, None] == classes[None, None, :]), axis=1)
    target_values = jnp.take_along_axis(rows, jnp.maximum(labels, 0), axis=1)  # (N, slots)
    hinge = jnp.maximum(1 - target_values[:, :, None] + rows[:, None, :], 0)
    hinge = jnp.where(listed[:, :, None] & ~is_target[:, None, :], hinge, 0)
    loss = jnp.sum(hinge, axis=(1, 2)) / rows.shape[1]
    return _reduce(loss.reshape(x.shape[:-1] if x.ndim else ()), reduction)


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    forward = lambda v: _multilabel_margin_loss(v, target, reduction)
    return jax.vjp(forward, x)[1](grad_output.astype(x.dtype))[0]
