"""Loss functions and their backward ops (nll, mse, bce, smooth-l1, huber, soft margin, ctc).

`reduction` is ATen's enum: 0 = none, 1 = mean, 2 = sum. Cross-entropy reaches the
device as `_log_softmax` + `nll_loss_forward` (its composite decomposition).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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


# --- CTC (connectionist temporal classification) -----------------------------------------------
# The alpha/beta recursions of Graves et al. in log space, over the extended label sequence
# (blank, y1, blank, y2, ..., blank), one `lax.scan` step per time step and all batch rows at
# once; rows end at their own input length. log_probs: (T, N, C).


def _logsumexp3(a, b, c):
    top = jnp.maximum(jnp.maximum(a, b), c)
    shift = jnp.where(jnp.isfinite(top), top, 0)
    return shift + jnp.log(jnp.exp(a - shift) + jnp.exp(b - shift) + jnp.exp(c - shift))


def _ctc_labels(targets, target_lengths, blank):
    """(N, 2S+1) extended labels (S = the longest target); targets padded (N, S) or concatenated."""
    longest = max(target_lengths, default=0)
    if targets.ndim == 1:  # concatenated: row n starts after the earlier rows' targets
        starts = np.cumsum([0, *target_lengths[:-1]])
        index = np.minimum(starts[:, None] + np.arange(longest), max(targets.shape[0] - 1, 0))
        padded = targets[index] if targets.shape[0] else jnp.zeros(index.shape, targets.dtype)
    else:
        padded = targets[:, :longest]
    labels = jnp.full((len(target_lengths), 2 * longest + 1), blank, jnp.int64)
    return labels.at[:, 1::2].set(padded.astype(jnp.int64))


def _ctc_shift(x, by):
    """x[..., s - by] (by > 0) or x[..., s + |by|] (by < 0), -inf where that is outside."""
    pad = jnp.full(x.shape[:-1] + (abs(by),), -jnp.inf, x.dtype)
    return jnp.concatenate([pad, x[..., :-by]] if by > 0 else [x[..., -by:], pad], axis=-1)


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    labels = _ctc_labels(targets, target_lengths, blank)
    batch = jnp.arange(labels.shape[0])[:, None]
    label_log_probs = log_probs[:, batch, labels]  # (T, N, 2S+1): log p_t(l'_s)
    position = jnp.arange(labels.shape[1])
    # a step from s-2 to s skips a blank: allowed between two different labels
    skips = (position >= 2) & (labels != blank) & (labels != _ctc_roll(labels))
    ends = 2 * jnp.asarray(target_lengths, jnp.int64)[:, None]  # the last blank's position
    return labels, label_log_probs, skips, position < ends + 1, ends, jnp.asarray(input_lengths, jnp.int64)


def _ctc_roll(labels):
    return jnp.concatenate([jnp.full_like(labels[:, :2], -1), labels[:, :-2]], axis=1)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank):
    """(negative log likelihood (N,), log_alpha (N, T, 2S+1), -inf past each row's input)."""
    _, label_lp, skips, valid, ends, lengths = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    position = jnp.arange(label_lp.shape[-1])
    first = jnp.where((position == 0) | ((position == 1) & (ends > 0)), label_lp[0], -jnp.inf)

    def step(alpha, inputs):
        lp, t = inputs
        new = lp + _logsumexp3(alpha, _ctc_shift(alpha, 1), jnp.where(skips, _ctc_shift(alpha, 2), -jnp.inf))
        return jnp.where(valid, new, -jnp.inf), None

    def frozen_step(alpha, inputs):  # rows past their input length keep their last alpha
        new, _ = step(alpha, inputs)
        new = jnp.where(inputs[1] < lengths[:, None], new, alpha)
        return new, new

    steps = jnp.arange(1, label_lp.shape[0])
    last, alphas = jax.lax.scan(frozen_step, first, (label_lp[1:], steps))
    log_alpha = jnp.concatenate([first[None], alphas], axis=0)
    log_alpha = jnp.where(jnp.arange(label_lp.shape[0])[:, None, None] < lengths[:, None], log_alpha, -jnp.inf)
    final = jnp.take_along_axis(last, ends, axis=1)[:, 0]
    before = jnp.where(ends[:, 0] > 0, jnp.take_along_axis(last, jnp.maximum(ends - 1, 0), axis=1)[:, 0], -jnp.inf)
    return -jnp.logaddexp(final, before), jnp.moveaxis(log_alpha, 0, 1)


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity):
    """ATen's gradient, which is with respect to the logits behind log_probs = log_softmax(logits):
    exp(log_probs) - exp(log(sum over s with l'_s = c of alpha * beta) + nll - log_probs)."""
    labels, label_lp, skips, valid, ends, lengths = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    position = jnp.arange(labels.shape[1])
    skips_ahead = jnp.concatenate([skips[:, 2:], jnp.zeros_like(skips[:, :2])], axis=1)

    def step(beta, inputs):
        lp, t = inputs
        new = lp + _logsumexp3(beta, _ctc_shift(beta, -1), jnp.where(skips_ahead, _ctc_shift(beta, -2), -jnp.inf))
        new = jnp.where(valid, new, -jnp.inf)
        start = jnp.where((position == ends) | ((position == ends - 1) & (ends > 0)), lp, -jnp.inf)
        last_step = t == lengths[:, None] - 1
        new = jnp.where(last_step, start, jnp.where(t < lengths[:, None] - 1, new, -jnp.inf))
        return new, new

    time = label_lp.shape[0]
    initial = jnp.full(label_lp.shape[1:], -jnp.inf, log_probs.dtype)
    _, log_beta = jax.lax.scan(step, initial, (label_lp, jnp.arange(time)), reverse=True)
    # only where alpha is defined (ATen leaves the rest of its log_alpha uninitialised)
    alpha = jnp.where(
        valid & (jnp.arange(time)[:, None, None] < lengths[:, None]), jnp.moveaxis(log_alpha, 1, 0), -jnp.inf
    )
    both = alpha + log_beta  # (T, N, 2S+1)
    top = jnp.max(both, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0)
    one_hot = jax.nn.one_hot(labels, log_probs.shape[-1], dtype=log_probs.dtype)  # (N, 2S+1, C)
    per_class = jnp.log(jnp.einsum("tns,nsc->tnc", jnp.exp(both - top), one_hot, precision="highest")) + top
    out = (jnp.exp(log_probs) - jnp.exp(per_class + nll[None, :, None] - log_probs)) * grad[None, :, None]
    out = jnp.where(jnp.arange(time)[:, None, None] < lengths[None, :, None], out, 0)
    if zero_infinity:
        out = jnp.where(jnp.isinf(nll)[None, :, None], 0, out)
    return out.astype(log_probs.dtype)


@lowers(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc_forward(log_probs, targets, list(input_lengths), list(target_lengths), blank)


@lowers(aten._ctc_loss.Tensor, data_dependent=True)
def _ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """Lengths as tensors: read on the host (they fix log_alpha's shape), then as above."""
    return _ctc_loss(log_probs, targets, _host_ints(input_lengths), _host_ints(target_lengths), blank, zero_infinity)


@lowers(aten._ctc_loss_backward.default)
def _ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    return _ctc_backward(
        grad, log_probs, targets, list(input_lengths), list(target_lengths), nll, log_alpha, blank, zero_infinity
    )


@lowers(aten._ctc_loss_backward.Tensor, data_dependent=True)
def _ctc_loss_backward_tensor(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    return _ctc_loss_backward(
        grad, log_probs, targets, _host_ints(input_lengths), _host_ints(target_lengths), nll, log_alpha, blank,
        zero_infinity,
    )  # fmt: skip


def _host_ints(values):
    return [int(v) for v in np.asarray(values).reshape(-1)]
