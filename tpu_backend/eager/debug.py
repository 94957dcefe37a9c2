"""Debug mode: synchronise after each op, check tensor indices as the CPU does, compare with
PyTorch's meta kernel, look for NaN/Inf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager.arguments import flatten_args
from tpu_backend.eager.errors import TpuDebugError, cpu_stand_in, to_meta, user_frame


def _leaves(out) -> list:
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _leaves(o)]
    return [out]


_INDEX_ARGUMENTS = ("index", "indices")  # the schemas' names (index_select, gather, embedding, index...)


def _with_index_values(name: str, value):
    if name not in _INDEX_ARGUMENTS:
        return cpu_stand_in(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_with_index_values(name, v) for v in value)
    return value.cpu() if isinstance(value, torch.Tensor) else value


def check_indices(op, args, kwargs) -> None:
    """A tensor index out of range raises what PyTorch's CPU kernel raises (`IndexError:
    index out of range in self`, gather's `index 5 is out of bounds...`): that kernel runs on
    the index values, with one-element stand-ins for the other tensors. Debug mode only:
    strict and fused modes would have to wait for the chip at every indexing op to look."""
    names = [argument.name for argument in op._schema.arguments]
    if not any(name in _INDEX_ARGUMENTS for name in [*names[: len(args)], *kwargs]):
        return
    try:
        op(
            *[_with_index_values(name, value) for name, value in zip(names, args)],
            **{name: _with_index_values(name, value) for name, value in kwargs.items()},
        )
    except NotImplementedError:  # no CPU kernel: nothing to compare with
        return
    except (IndexError, RuntimeError) as error:
        raise error.with_traceback(None) from None


def debug_check(op, args, kwargs, out) -> None:
    """Synchronise, check tensor indices, compare with PyTorch's meta kernel, look for NaN/Inf."""
    where = user_frame()
    results = [o for o in _leaves(out) if isinstance(o, jax.Array)]
    jax.block_until_ready(results)
    kwargs = {k: v for k, v in kwargs.items() if k != "key"}
    check_indices(op, args, kwargs)
    meta_kwargs = dict(kwargs)
    if meta_kwargs.get("device") is not None:  # factory ops (zeros, full): asked of the tpu, they re-entered this check
        meta_kwargs["device"] = "meta"
    try:
        expected = _leaves(op(*to_meta(args), **meta_kwargs))
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
