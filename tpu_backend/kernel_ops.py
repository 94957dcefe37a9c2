"""The kernels as torch custom ops (`torch.ops.tpu_kernels.*`), for "tpu" and CPU tensors.

Each op is a `torch.library.custom_op` with a fake (shape) function and, where it has a
backward, an autograd formula whose backward is another custom op. On "tpu" tensors an
op runs through the device's ATen -> JAX table (`tpu_backend.ops.registry`): the same
JAX function serves strict/debug/fused eager and `torch.compile(backend="tpu")` graphs.
On CPU tensors it runs the same JAX function on copies (handy for checks).

The last argument of every op, `impl`, names the implementation ("pallas",
"interpret", "reference"; see `kernels._common`). It is a static argument, so jitted
programs, fused graphs and compiled graphs are keyed by it and never reuse a program
built for another choice. `tpu_backend.kernels` fills it from the current mode.
(The kernels themselves, `kernels/`, are pure JAX; this module is the torch side.)

Ops (forward -> saved for backward):
- flash_attention(q, k, v, mask?, causal, scale, impl) -> (out, logsumexp)
- norm(x, residual?, weight?, bias?, centered, eps, impl) -> (y, h): RMSNorm
  (centered=False) or LayerNorm over the last dim, h = x + residual ((0,) when no residual;
  the backward recomputes the row statistics from h)
- cross_entropy(logits, targets, ignore_index, impl) -> (per-row loss, logsumexp)
- decode_attention(q, k_cache, v_cache, lengths, scale, impl) -> out (no backward)
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import torch

from tpu_backend import dispatch
from tpu_backend import tensor as device_tensor
from tpu_backend.ops.registry import lowers, torch_dtype

Tensor = torch.Tensor
NAMESPACE = "tpu_kernels"


# --------------------------------------------------------------------------- JAX side


# Under a mesh (`kernels.sharded.current`: `tpu_backend.aot`'s plan, `tpu_backend.distributed`'s
# mesh) each call runs per shard inside `jax.shard_map`: XLA cannot partition a Mosaic kernel.


def flash_attention_jax(q, k, v, mask, causal, scale, impl):
    from kernels import flash_attention as fa
    from kernels import sharded

    if km := sharded.current(impl):
        return sharded.attention_forward(km, q, k, v, mask, causal, scale, impl)
    return fa.attention_forward(q, k, v, mask, fa.resolve_config(q, k, causal, scale, impl))


def flash_attention_backward_jax(dout, q, k, v, mask, out, lse, causal, scale, impl):
    from kernels import flash_attention as fa
    from kernels import sharded

    if km := sharded.current(impl):
        return sharded.attention_backward(km, dout, q, k, v, mask, out, lse, causal, scale, impl)
    return fa.attention_backward(dout, q, k, v, mask, out, lse, fa.resolve_config(q, k, causal, scale, impl))


def _rows(x):
    return None if x is None else x.reshape(-1, x.shape[-1])


def norm_jax(x, residual, weight, bias, centered, eps, impl):
    from kernels import norms, sharded

    if km := sharded.current(impl):
        return sharded.norm_forward(km, x, residual, weight, bias, centered, eps, impl)
    rows = _rows(x)
    y, h = norms.norm_forward(rows, _rows(residual), weight, bias, norms.resolve_config(rows, centered, eps, impl))
    h = h.reshape(x.shape) if residual is not None else jnp.zeros((0,), x.dtype)
    return y.reshape(x.shape), h


def norm_backward_jax(dy, dh, h, weight, bias, centered, eps, impl):
    from kernels import norms, sharded

    if km := sharded.current(impl):
        return sharded.norm_backward(km, dy, dh, h, weight, bias, centered, eps, impl)
    rows = _rows(h)
    config = norms.resolve_config(rows, centered, eps, impl)
    dx, dw, db = norms.norm_backward(_rows(dy), _rows(dh), rows, weight, bias, config)
    empty = jnp.zeros((0,), h.dtype)
    return dx.reshape(h.shape), empty if dw is None else dw, empty if db is None else db


def cross_entropy_jax(logits, targets, ignore_index, impl):
    from kernels import cross_entropy as ce
    from kernels import sharded

    if km := sharded.current(impl):
        return sharded.cross_entropy_forward(km, logits, targets, ignore_index, impl)
    return ce.cross_entropy_forward(logits, targets, ce.resolve_config(logits, ignore_index, impl))


def cross_entropy_backward_jax(grad_losses, logits, targets, lse, ignore_index, impl):
    from kernels import cross_entropy as ce
    from kernels import sharded

    if km := sharded.current(impl):
        return sharded.cross_entropy_backward(km, grad_losses, logits, targets, lse, ignore_index, impl)
    return ce.cross_entropy_backward(grad_losses, logits, targets, lse, ce.resolve_config(logits, ignore_index, impl))


def decode_attention_jax(q, k_cache, v_cache, lengths, scale, impl):
    from kernels import decode_attention as da

    return da.decode_forward(q, k_cache, v_cache, lengths, da.resolve_config(q, k_cache, scale, impl))


# --------------------------------------------------------------------------- CPU tensors


def _on_cpu(fn, *args):
    """Run JAX function `fn` on CPU tensors: tensors in as JAX copies, JAX results out as tensors."""
    values = [device_tensor.cpu_to_jax(a.contiguous()) if isinstance(a, Tensor) else a for a in args]
    out = fn(*values)
    if isinstance(out, tuple):
        return tuple(device_tensor.numpy_to_torch(device_tensor.to_numpy(o), torch_dtype(o.dtype)) for o in out)
    return device_tensor.numpy_to_torch(device_tensor.to_numpy(out), torch_dtype(out.dtype))


# --------------------------------------------------------------------------- flash attention


@torch.library.custom_op(f"{NAMESPACE}::flash_attention", mutates_args=())
def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool, scale: float, impl: str
) -> tuple[Tensor, Tensor]:
    return _on_cpu(flash_attention_jax, q, k, v, mask, causal, scale, impl)


@flash_attention.register_fake
def _(q, k, v, mask, causal, scale, impl):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    out: Tensor,
    lse: Tensor,
    causal: bool,
    scale: float,
    impl: str,
) -> tuple[Tensor, Tensor, Tensor]:
    return _on_cpu(flash_attention_backward_jax, dout, q, k, v, mask, out, lse, causal, scale, impl)


@flash_attention_backward.register_fake
def _(dout, q, k, v, mask, out, lse, causal, scale, impl):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flash_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale, impl = inputs
    ctx.save_for_backward(q, k, v, mask, *output)
    ctx.static = (causal, scale, impl)


def _flash_backward(ctx, dout, dlse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward(dout.contiguous(), q, k, v, mask, out, lse, *ctx.static)
    return dq, dk, dv, None, None, None, None


flash_attention.register_autograd(_flash_backward, setup_context=_flash_setup)


# --------------------------------------------------------------------------- RMSNorm / LayerNorm


@torch.library.custom_op(f"{NAMESPACE}::norm", mutates_args=())
def norm(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    centered: bool,
    eps: float,
    impl: str,
) -> tuple[Tensor, Tensor]:
    return _on_cpu(norm_jax, x, residual, weight, bias, centered, eps, impl)


@norm.register_fake
def _(x, residual, weight, bias, centered, eps, impl):
    h = torch.empty_like(x) if residual is not None else x.new_empty((0,))
    return torch.empty_like(x), h


@torch.library.custom_op(f"{NAMESPACE}::norm_backward", mutates_args=())
def norm_backward(
    dy: Tensor,
    dh: Optional[Tensor],
    h: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    centered: bool,
    eps: float,
    impl: str,
) -> tuple[Tensor, Tensor, Tensor]:
    return _on_cpu(norm_backward_jax, dy, dh, h, weight, bias, centered, eps, impl)


@norm_backward.register_fake
def _(dy, dh, h, weight, bias, centered, eps, impl):
    empty = h.new_empty((0,))
    return (
        torch.empty_like(h),
        torch.empty_like(weight) if weight is not None else empty,
        torch.empty_like(bias) if bias is not None else empty.clone(),
    )


def _norm_setup(ctx, inputs, output):
    x, residual, weight, bias, centered, eps, impl = inputs
    y, h = output
    ctx.save_for_backward(h if residual is not None else x, weight, bias)
    ctx.has_residual = residual is not None
    ctx.static = (centered, eps, impl)


def _norm_backward(ctx, dy, dh):
    h, weight, bias = ctx.saved_tensors
    dh = dh if ctx.has_residual else None
    dx, dw, db = norm_backward(dy.contiguous(), dh, h, weight, bias, *ctx.static)
    return (
        dx,
        dx if ctx.has_residual else None,
        dw if weight is not None else None,
        db if bias is not None else None,
        None,
        None,
        None,
    )


norm.register_autograd(_norm_backward, setup_context=_norm_setup)


# --------------------------------------------------------------------------- cross-entropy


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, impl: str) -> tuple[Tensor, Tensor]:
    return _on_cpu(cross_entropy_jax, logits, targets, ignore_index, impl)


@cross_entropy.register_fake
def _(logits, targets, ignore_index, impl):
    rows = logits.new_empty(logits.shape[:1], dtype=torch.float32)
    return rows, torch.empty_like(rows)


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(
    grad_losses: Tensor, logits: Tensor, targets: Tensor, lse: Tensor, ignore_index: int, impl: str
) -> Tensor:
    return _on_cpu(cross_entropy_backward_jax, grad_losses, logits, targets, lse, ignore_index, impl)


@cross_entropy_backward.register_fake
def _(grad_losses, logits, targets, lse, ignore_index, impl):
    return torch.empty_like(logits)


def _ce_setup(ctx, inputs, output):
    logits, targets, ignore_index, impl = inputs
    ctx.save_for_backward(logits, targets, output[1])
    ctx.static = (ignore_index, impl)


def _ce_backward(ctx, grad_losses, dlse):
    logits, targets, lse = ctx.saved_tensors
    return cross_entropy_backward(grad_losses.contiguous(), logits, targets, lse, *ctx.static), None, None, None


cross_entropy.register_autograd(_ce_backward, setup_context=_ce_setup)


# --------------------------------------------------------------------------- decode attention


@torch.library.custom_op(f"{NAMESPACE}::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor, scale: float, impl: str) -> Tensor:
    return _on_cpu(decode_attention_jax, q, k_cache, v_cache, lengths, scale, impl)


@decode_attention.register_fake
def _(q, k_cache, v_cache, lengths, scale, impl):
    return torch.empty_like(q)


# --------------------------------------------------------------------------- the tpu table


_JAX_FUNCTIONS = {
    flash_attention: flash_attention_jax,
    flash_attention_backward: flash_attention_backward_jax,
    norm: norm_jax,
    norm_backward: norm_backward_jax,
    cross_entropy: cross_entropy_jax,
    cross_entropy_backward: cross_entropy_backward_jax,
    decode_attention: decode_attention_jax,
}


def _register_on_device() -> None:
    for op, fn in _JAX_FUNCTIONS.items():
        lowers(op._opoverload)(fn)
    dispatch.register_table()


_register_on_device()
