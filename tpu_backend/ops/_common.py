"""Helpers shared by the ATen -> JAX lowering families: dtype rules and argument shapes.

ATen's type promotion is reproduced by asking PyTorch's own rule
(`torch._prims_common.elementwise_dtypes`) about tiny tensors on the `meta` device that
have the arrays' dtypes and ranks (zero-dim tensors promote differently from
dimensioned ones). This costs a little Python at trace time only: lowerings run
inside `jax.jit`, so it never runs per call.

`data_dependent` / `data_dependent_when` are decorator forms of the `Lowering` record's
fields of the same names (`@lowers(..., data_dependent=True)` says the same).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promotion
from torch._prims_common import elementwise_dtypes

from tpu_backend.ops.registry import DATA_DEPENDENT, DATA_DEPENDENT_WHEN, jax_dtype, mark, torch_dtype  # noqa: F401


def is_array(value) -> bool:
    """True for a JAX (or numpy) array, False for Python scalars and None."""
    return hasattr(value, "dtype") and hasattr(value, "shape")


# A stand-in Python value for each dtype kind of a weakly typed scalar.
_PYTHON_KIND = {"f": 1.5, "c": 1.5j, "i": 2, "u": 2, "b": True}


def is_weak_scalar(value) -> bool:
    """A Python number the dispatcher passed into `jax.jit` as a traced, weakly typed scalar.

    The device traces Python floats (learning rates, alphas) to avoid recompiling per
    value; for promotion they must still count as Python scalars, not 0-dim tensors.
    """
    aval = getattr(value, "aval", None)
    return aval is not None and getattr(aval, "weak_type", False) and value.ndim == 0


def is_static_number(value) -> bool:
    """A concrete Python number (safe to branch on); traced scalars are not."""
    return isinstance(value, (bool, int, float))


def _meta_standin(value):
    """What ATen's promotion rules need to know about a lowering argument."""
    if is_weak_scalar(value):
        return _PYTHON_KIND[jnp.dtype(value.dtype).kind]
    if is_array(value):
        shape = () if value.ndim == 0 else (1,)
        return torch.empty(shape, dtype=torch_dtype(value.dtype), device="meta")
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


def dtypes_for(*values, kind: Promotion = Promotion.DEFAULT):
    """(computation dtype, result dtype) as JAX dtypes, by ATen's elementwise promotion.

    The computation dtype is float32 for float16/bfloat16 results ("opmath"), as
    PyTorch's CPU kernels compute; None values are ignored.
    """
    standins = [_meta_standin(v) for v in values if v is not None]
    compute, result = elementwise_dtypes(*standins, type_promotion_kind=kind)
    return jax_dtype(compute), jax_dtype(result)


def result_dtype(*values, kind: Promotion = Promotion.DEFAULT):
    """The JAX dtype ATen's type promotion gives for these arrays and Python scalars."""
    return dtypes_for(*values, kind=kind)[1]


def elementwise(fn, *values, kind: Promotion = Promotion.DEFAULT):
    """Apply `fn` to the operands cast to the computation dtype; cast the result to ATen's."""
    compute, result = dtypes_for(*values, kind=kind)
    out = fn(*(None if v is None else jnp.asarray(v, dtype=compute) for v in values))
    return out.astype(result)


def is_floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def is_integral(dtype) -> bool:
    """Integer or bool, as ATen's `isIntegralType(includeBool=True)`."""
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def default_float():
    return jax_dtype(torch.get_default_dtype())


def to_float(x):
    """Integer and bool inputs become the default float dtype, as ATen's unary float ops do."""
    x = jnp.asarray(x)
    return x if is_floating(x.dtype) else x.astype(default_float())


def canonical_dim(dim: int, ndim: int) -> int:
    """A non-negative dim; zero-dim tensors accept dims 0 and -1 like ATen."""
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"dimension {dim} is out of range for a tensor of rank {ndim}")
    return dim % rank


def scalar_as_vector(lowering):
    """Run a lowering that works along a `dim` on 0-d inputs as on 1-element vectors.

    ATen treats dim 0 / -1 of a 0-d tensor as its single element; JAX has no axis there.
    When every array argument is 0-d they are reshaped to (1,) and the array outputs
    back to ().
    """

    @functools.wraps(lowering)
    def wrapper(*args, **kwargs):
        arrays = [a for a in args if is_array(a)]
        if not arrays or any(a.ndim for a in arrays):
            return lowering(*args, **kwargs)
        out = lowering(*(a.reshape(1) if is_array(a) else a for a in args), **kwargs)
        return jax.tree.map(lambda o: o.reshape(()) if is_array(o) else o, out)

    return wrapper


def canonical_dims(dims, ndim: int) -> tuple[int, ...]:
    """Reduction dims as a sorted tuple; None or [] means every dim (ATen's rule)."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return tuple(range(ndim))
    if ndim == 0:
        return ()
    return tuple(sorted({canonical_dim(d, ndim) for d in dims}))


def require_shape(op: str, what: str, shape, expected) -> None:
    """Refuse `shape` where ATen requires exactly `expected`: JAX's updates (`.at[...].set`)
    and elementwise maths would broadcast it and compute something PyTorch refuses. The
    failure path (`errors.like_torch`) raises PyTorch's own error in its place."""
    if tuple(shape) != tuple(expected):
        raise RuntimeError(f"aten.{op}: {what} of shape {list(shape)} where {list(expected)} is required")


def expand_param(value, count: int) -> tuple[int, ...]:
    """An int-or-list argument (kernel_size=3, stride=[2]) as a tuple of `count` ints."""
    if isinstance(value, int):
        return (value,) * count
    value = tuple(value)
    if len(value) == 1:
        return value * count
    if len(value) != count:
        raise ValueError(f"expected {count} values, got {list(value)}")
    return value


def reduction_dtype(x, dtype):
    """sum/prod/cumsum: integer and bool inputs accumulate in int64 unless a dtype is given."""
    if dtype is not None:
        return jax_dtype(dtype)
    return jnp.int64 if is_integral(x.dtype) else x.dtype


def data_dependent_when(*targets, predicate):
    """Mark ATen overloads that need host values when `predicate(args, kwargs)` holds
    (same as `@lowers(..., data_dependent_when=predicate)`)."""

    def decorate(fn):
        for target in targets:
            mark(target, data_dependent_when=predicate)
        return fn

    return decorate


def data_dependent(*targets):
    """Mark ATen overloads whose lowering reads values on the host (cannot be jitted);
    same as `@lowers(..., data_dependent=True)`."""

    def decorate(fn):
        for target in targets:
            mark(target, data_dependent=True)
        return fn

    return decorate
