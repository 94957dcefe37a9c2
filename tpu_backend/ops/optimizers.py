"""Fused optimizer steps: what `torch.optim.Adam/AdamW/SGD/Adagrad(..., fused=True)` call.

`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_` and `_fused_adagrad_` update a whole
parameter list in one op. Strict mode runs it one parameter at a time (one small program
per distinct shape: XLA compiles an update over a whole list tensor by tensor, ~50 s for
219 tensors on a v5e), or as one program with `TPU_OPTIMIZER_PROGRAMS=one`; fused mode and
`torch.compile` put it in their one program. (The default foreach path is ~20 `_foreach_*`
programs.)

The math is that of ATen's CPU kernels (`aten/src/ATen/native/cpu/Fused*Kernel.cpp`), per
element, in the parameter's opmath dtype (float32 for bfloat16/float16 parameters, cast
back when stored):
- `grad_scale` (a GradScaler's scale): gradients are divided by it, and the unscaled
  gradients are written back into `grads`;
- `found_inf`: when it holds 1.0 nothing is updated (parameters, state, gradients);
- per-tensor scalars (bias corrections, step sizes, Adagrad's decayed lr) come from the
  tensor's step count in the opmath dtype, written so that they stay within a few ulps of
  ATen's (which computes them in float64 and rounds): a TPU emulates float64 in software,
  and a float64 `pow` per parameter made the program very slow to compile
  (`_one_minus_power`). Shared scalars (1 - beta, 1 - lr * weight_decay) are float64.
Step counts are NOT incremented here: torch's optimizer does that with one
`_foreach_add_(state_steps, 1)` before the fused op (and undoes it with `_foreach_sub_`
when `found_inf` is set), so an optimizer step is that program plus this one.

Learning rate, betas, eps, weight decay, momentum and dampening arrive as dynamic floats
(changing them does not recompile): the lowerings never branch on them in Python
(`jnp.where` where ATen tests `weight_decay != 0`). SGD's momentum branch follows whether
a momentum buffer list was passed (ATen passes none exactly when momentum is 0).

Only functional overloads (`_fused_adam.default`, returning new lists) are lowerings of
their own: they are what `torch.compile` graphs hold after functionalization. The in-place
overloads the optimizers call are `functionalized` records pointing at them: the eager
dispatcher runs the functional lowering once and writes each returned list back into the
matching argument list (`eager/registration.py`). ATen's CompositeExplicitAutograd `.out`
overloads call the functional kernel.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_backend.ops.registry import Functionalized, lowers

aten = torch.ops.aten

_F64 = jnp.float64


def _opmath(dtype):
    """ATen's opmath type: half-precision math runs in float32."""
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _first(flag):
    """The value of a one-element tensor (GradScaler's scale and found_inf are 0-d or (1,))."""
    return flag.reshape(-1)[0]


def _skipped(found_inf):
    return None if found_inf is None else _first(found_inf) == 1.0


def _keep_if(skipped, new, old):
    """`found_inf` set: the old value, unchanged."""
    return new if skipped is None else jnp.where(skipped, old, new)


def _unscaled(grad, grad_scale, ct):
    """(gradient in opmath, gradient to store back): divided by the scale when there is one."""
    g = grad.astype(ct)
    if grad_scale is None:
        return g, grad
    g = g / _first(grad_scale).astype(ct)
    return g, g.astype(grad.dtype)


def _with_weight_decay(g, p, weight_decay, ct):
    """L2 penalty folded into the gradient (Adam, SGD, Adagrad): `g + wd * p` when wd != 0."""
    return jnp.where(weight_decay != 0, g + p * jnp.asarray(weight_decay, _F64).astype(ct), g)


def _one_minus_power(base, step, ct):
    """`1 - base ** step` (Adam's bias corrections) in `ct`, as `-expm1(step * log(base))`: a few
    ulps from ATen's value (computed in float64, then rounded), with no float64 transcendental
    per tensor. A TPU emulates float64 in software: one float64 `pow` per parameter made XLA
    compile a 24-parameter AdamW program for a v5e 18x longer (53 s against 3 s)."""
    log_base = jnp.log1p(-(1 - base).astype(ct))  # 1 - beta in float64 (exact for beta >= 0.5): log1p keeps it
    return -jnp.expm1(step.astype(ct) * log_base)


def _lerp(start, end, weight, ct):
    """`start.lerp_(end, weight)` as ATen computes it (two forms, exact at each end)."""
    w = weight.astype(ct)
    near_start = start + w * (end - start)
    near_end = end - (end - start) * (jnp.asarray(1, ct) - w)
    return jnp.where(jnp.abs(w) < 0.5, near_start, near_end)


# --- Adam / AdamW -----------------------------------------------------------------------


def _adam(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    decoupled,
    grad_scale=None,
    found_inf=None,
):
    lr, beta1, beta2 = (jnp.asarray(v, _F64) for v in (lr, beta1, beta2))
    skipped = _skipped(found_inf)
    out_params, out_grads, out_avgs, out_sqs, out_maxes = [], [], [], [], []
    for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        ct = _opmath(param.dtype)
        bias_correction1 = _one_minus_power(beta1, state_steps[i], ct)
        bias_correction2 = _one_minus_power(beta2, state_steps[i], ct)
        step_size = lr.astype(ct) / bias_correction1
        bias_correction2_sqrt = jnp.sqrt(bias_correction2)

        g, stored_grad = _unscaled(grad, grad_scale, ct)
        if maximize:
            g = -g
        p = param.astype(ct)
        if decoupled:  # AdamW: decay the parameter itself (a factor of exactly 1 when wd == 0)
            p = p * (1 - lr * jnp.asarray(weight_decay, _F64)).astype(ct)
        else:
            g = _with_weight_decay(g, p, weight_decay, ct)
        m = _lerp(exp_avg.astype(ct), g, 1 - beta1, ct)
        v = exp_avg_sq.astype(ct) * beta2.astype(ct) + (1 - beta2).astype(ct) * g * g
        if amsgrad:
            peak = jnp.maximum(max_exp_avg_sqs[i].astype(ct), v)
            out_maxes.append(_keep_if(skipped, peak.astype(param.dtype), max_exp_avg_sqs[i]))
        else:
            peak = v
        denom = jnp.sqrt(peak) / bias_correction2_sqrt + jnp.asarray(eps, _F64).astype(ct)
        p = p - step_size * m / denom

        out_params.append(_keep_if(skipped, p.astype(param.dtype), param))
        out_grads.append(grad if grad_scale is None else _keep_if(skipped, stored_grad, grad))
        out_avgs.append(_keep_if(skipped, m.astype(exp_avg.dtype), exp_avg))
        out_sqs.append(_keep_if(skipped, v.astype(exp_avg_sq.dtype), exp_avg_sq))
    return out_params, out_grads, out_avgs, out_sqs, out_maxes


@lowers(aten._fused_adam.default, aten._fused_adam.tensor_lr)
def fused_adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **options):
    """Adam (L2 weight decay): (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs), updated."""
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, decoupled=False, **options)


@lowers(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)
def fused_adamw(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **options):
    """AdamW (decoupled weight decay): the same five lists as `fused_adam`."""
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, decoupled=True, **options)


# --- SGD --------------------------------------------------------------------------------


def _sgd(
    params,
    grads,
    momentum_buffers,
    *,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    lr, momentum, dampening = (jnp.asarray(v, _F64) for v in (lr, momentum, dampening))
    skipped = _skipped(found_inf)
    out_params, out_grads, out_buffers = [], [], []
    for i, (param, grad) in enumerate(zip(params, grads)):
        ct = _opmath(param.dtype)
        g, stored_grad = _unscaled(grad, grad_scale, ct)
        if maximize:
            g = -g
        p = param.astype(ct)
        g = _with_weight_decay(g, p, weight_decay, ct)
        if momentum_buffers:  # ATen passes buffers exactly when momentum != 0
            buffer = momentum_buffers[i]
            if is_first_step:  # the buffer is `empty_like`: start from the gradient
                b = g
            else:
                b = buffer.astype(ct) * momentum.astype(ct) + g * (1 - dampening).astype(ct)
            out_buffers.append(_keep_if(skipped, b.astype(buffer.dtype), buffer))
            g = g + b * momentum.astype(ct) if nesterov else b
        p = p - g * lr.astype(ct)
        out_params.append(_keep_if(skipped, p.astype(param.dtype), param))
        out_grads.append(grad if grad_scale is None else _keep_if(skipped, stored_grad, grad))
    return out_params, out_grads, out_buffers


@lowers(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def fused_sgd(self, grads, momentum_buffer_list, **options):
    """SGD with momentum/dampening/nesterov: (params, grads, momentum_buffers), updated."""
    return _sgd(self, grads, momentum_buffer_list, **options)


# --- Adagrad ----------------------------------------------------------------------------


def _adagrad(
    params,
    grads,
    state_sums,
    state_steps,
    *,
    lr,
    lr_decay,
    weight_decay,
    eps,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    lr, lr_decay = jnp.asarray(lr, _F64), jnp.asarray(lr_decay, _F64)
    skipped = _skipped(found_inf)
    out_params, out_grads, out_sums = [], [], []
    for param, grad, state_sum, step in zip(params, grads, state_sums, state_steps):
        ct = _opmath(param.dtype)
        decayed_lr = lr.astype(ct) / (1 + (step.astype(ct) - 1) * lr_decay.astype(ct))
        g, stored_grad = _unscaled(grad, grad_scale, ct)
        if maximize:
            g = -g
        p = param.astype(ct)
        g = _with_weight_decay(g, p, weight_decay, ct)
        s = state_sum.astype(ct) + g * g
        std = jnp.sqrt(s) + jnp.asarray(eps, _F64).astype(ct)
        p = p - decayed_lr * g / std
        out_params.append(_keep_if(skipped, p.astype(param.dtype), param))
        out_grads.append(grad if grad_scale is None else _keep_if(skipped, stored_grad, grad))
        out_sums.append(_keep_if(skipped, s.astype(state_sum.dtype), state_sum))
    return out_params, out_grads, out_sums


@lowers(aten._fused_adagrad.default)
def fused_adagrad(self, grads, state_sums, state_steps, **options):
    """Adagrad: (params, grads, state_sums, state_steps), updated (the steps as given)."""
    return (*_adagrad(self, grads, state_sums, state_steps, **options), list(state_steps))


@lowers(aten._fused_adagrad.tensor_lr)
def fused_adagrad_tensor_lr(self, grads, state_sums, state_steps, **options):
    """Adagrad with a tensor learning rate: (params, grads, state_sums), updated."""
    return _adagrad(self, grads, state_sums, state_steps, **options)


# --- the in-place overloads the optimizers call ------------------------------------------
# Each runs its functional overload and writes returned list k back into argument list k
# (`found_inf` set: the values written are the old ones). Adagrad's steps are not written.


def _functional_of(inplace):
    """`aten._fused_adam.tensor_lr` for `aten._fused_adam_.tensor_lr`."""
    name = inplace._schema.name.split("::")[1].rstrip("_")
    return getattr(getattr(aten, name), inplace._overloadname)


for _inplace, _lowering, _lists in [
    (aten._fused_adam_.default, fused_adam, 5),
    (aten._fused_adam_.tensor_lr, fused_adam, 5),
    (aten._fused_adamw_.default, fused_adamw, 5),
    (aten._fused_adamw_.tensor_lr, fused_adamw, 5),
    (aten._fused_sgd_.default, fused_sgd, 3),
    (aten._fused_sgd_.tensor_lr, fused_sgd, 3),
    (aten._fused_adagrad_.default, fused_adagrad, 3),
    (aten._fused_adagrad_.tensor_lr, fused_adagrad_tensor_lr, 3),
]:
    _writes = {k: k for k in range(_lists)}  # argument list k <- returned list k
    _lists_at = tuple(k for k, a in enumerate(_inplace._schema.arguments) if str(a.type) == "List[Tensor]")
    lowers(_inplace, functionalized=Functionalized(_functional_of(_inplace), _writes, 0, _lists_at))(_lowering)
