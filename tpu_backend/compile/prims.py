"""JAX meanings for the `torch.ops.prims` and symbolic-size ops that reach compiled graphs.

AOTAutograd graphs are decomposed to core ATen, which the lowering table covers, but a
few decompositions emit primitives (`prims.convert_element_type` from type-promotion
wrappers, `prims.broadcast_in_dim`...), and graphs traced with symbolic shapes ask for
sizes (`aten.sym_size.int`). Inside `jax.jit` every shape is concrete, so the size ops
simply read them: a graph Dynamo made shape-generic runs specialised per shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops._common import canonical_dim
from tpu_backend.ops.registry import GRAPH_LOWERINGS, jax_dtype, lowers
from tpu_backend.ops.views import view_dtype

prims = torch.ops.prims
aten = torch.ops.aten


def graph_lowering(*targets):
    """Register a lowering that only compiled graphs reach (`lowers(*targets, kind="graph")`;
    a target is lowered once across the whole table)."""
    return lowers(*targets, kind="graph")


# --------------------------------------------------------------------- prims


@graph_lowering(prims.convert_element_type.default)
def convert_element_type(x, dtype):
    return jnp.asarray(x).astype(jax_dtype(dtype))


@graph_lowering(prims.broadcast_in_dim.default)
def broadcast_in_dim(x, shape, broadcast_dimensions):
    return jax.lax.broadcast_in_dim(x, tuple(shape), tuple(broadcast_dimensions))


@graph_lowering(prims.squeeze.default)
def squeeze(x, dimensions):
    return jnp.squeeze(x, tuple(canonical_dim(d, x.ndim) for d in dimensions))


@graph_lowering(prims.view_of.default)
def view_of(x):
    return x


@graph_lowering(prims.view_of_dtype.default)
def view_of_dtype(x, dtype):
    return view_dtype(x, dtype)


@graph_lowering(prims.iota.default)
def iota(length, *, start, step, dtype, device=None, requires_grad=False):
    """`arange`'s decomposition: start, start + step, ... (`length` values), behind the
    barrier `aten.arange`'s lowering has (a TPU compiler bug: `ops/creation.py`)."""
    return jax.lax.optimization_barrier(start + step * jnp.arange(length, dtype=jax_dtype(dtype)))


@graph_lowering(prims.full.default)
def full(shape, fill_value, *, dtype, device=None, requires_grad=False):
    return jnp.full(tuple(shape), fill_value, jax_dtype(dtype))


@graph_lowering(prims.fill.default)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)


@graph_lowering(prims.where.default)
def where(pred, a, b):
    return jnp.where(pred, a, b)


@graph_lowering(prims.scalar_tensor.default)
def scalar_tensor(value, *, dtype=None, device=None):
    return jnp.asarray(value, jax_dtype(dtype or torch.get_default_dtype()))


@graph_lowering(prims.collapse_view.default, prims.collapse.default)
def collapse(x, start, end):
    """Merge dims start..end-1 into one."""
    return jnp.reshape(x, x.shape[:start] + (-1,) + x.shape[end:])


@graph_lowering(prims.add.default)
def add(a, b):
    """Reached from decompositions traced inside a nested compile region (`rms_norm`'s
    `x + eps` in a `scan_layers` block); prims take operands of one dtype already."""
    return jnp.add(a, b)


@graph_lowering(prims.sub.default)
def sub(a, b):
    return jnp.subtract(a, b)


@graph_lowering(prims.mul.default)
def mul(a, b):
    return jnp.multiply(a, b)


@graph_lowering(prims.div.default)
def div(a, b):
    """prims.div: true division for floating operands, truncation for integers."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        return jax.lax.div(a, b)
    return jnp.true_divide(a, b)


@graph_lowering(prims.rsqrt.default)
def rsqrt(x):
    return jax.lax.rsqrt(x)


# --------------------------------------------------------------------- sizes (static inside jit)


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


@graph_lowering(aten.sym_size.int)
def sym_size(x, dim):
    return x.shape[canonical_dim(dim, x.ndim)]


@graph_lowering(aten.sym_numel.default)
def sym_numel(x):
    return x.size


@graph_lowering(aten.sym_stride.int)
def sym_stride(x, dim):
    """Values in a compiled graph are contiguous (functional graphs have no layout)."""
    return _contiguous_strides(x.shape)[canonical_dim(dim, x.ndim)]


@graph_lowering(aten.sym_storage_offset.default)
def sym_storage_offset(x):
    return 0


# --------------------------------------------------------------------- runtime checks Dynamo inserts


@graph_lowering(
    aten._assert_scalar.default,
    aten._assert_tensor_metadata.default,
    aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
)
def checked_at_trace_time(*args, **kwargs):
    """Shape/metadata assertions: shapes are static here, so tracing already checked them."""
    return None


@graph_lowering(aten._assert_async.default, aten._assert_async.msg)
def assert_on_values(*args, **kwargs):
    """A check on tensor *values* cannot stop a compiled XLA program; it is dropped (as
    Inductor does on devices without device-side asserts)."""
    return None


__all__ = ["GRAPH_LOWERINGS"]
