"""Debug mode: synchronise after each op, compare with PyTorch's meta kernel, look for NaN/Inf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager.arguments import flatten_args
from tpu_backend.eager.errors import TpuDebugError, user_frame


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _leaves(out) -> list:
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _leaves(o)]
    return [out]


def debug_check(op, args, kwargs, out) -> None:
    """Synchronise, then compare with PyTorch's meta kernel and look for NaN/Inf."""
    where = user_frame()
    results = [o for o in _leaves(out) if isinstance(o, jax.Array)]
    jax.block_until_ready(results)
    kwargs = {k: v for k, v in kwargs.items() if k != "key"}
    meta_kwargs = dict(kwargs)
    if meta_kwargs.get("device") is not None:  # factory ops (zeros, full): asked of the tpu, they re-entered this check
        meta_kwargs["device"] = "meta"
    try:
        expected = _leaves(op(*_to_meta(args), **meta_kwargs))
    except Exception:  # no meta kernel: nothing to compare against
        expected = None
    if expected is not None:
        expected = [e for e in expected if isinstance(e, torch.Tensor)]
        got = [(tuple(r.shape), tpu_tensor.torch_dtype(r.dtype)) for r in results]
        want = [(tuple(e.shape), e.dtype) for e in expected]
        if got != want:
            raise TpuDebugError(
                f"tpu lowering of {op} returned (shape, dtype) {got}, PyTorch's meta says {want} "
                f"(called from {where}); fix the lowering in tpu_backend/ops/"
            )
    inputs_finite = all(
        bool(jnp.isfinite(a).all())
        for a in _leaves(flatten_args(args, kwargs, False, defer_views=False)[0])
        if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jnp.inexact)
    )
    for index, r in enumerate(results):
        if jnp.issubdtype(r.dtype, jnp.inexact) and not bool(jnp.isfinite(r).all()) and inputs_finite:
            raise TpuDebugError(f"{op} produced NaN/Inf in output {index} from finite inputs (called from {where})")
