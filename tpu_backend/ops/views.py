"""View ops as pure JAX functions, for graphs where views have value semantics.

The lowering table (`registry.py`) leaves view ops out: an eager tpu tensor's views share
its storage, which the device models itself (`tpu_backend/tensor.py`). In a *functional*
graph (what AOTAutograd hands `torch.compile(backend="tpu")`, or what a fused eager trace
records) nothing is written through a view, so a view is just a function of its base:
`view` is a reshape, `slice` a slice, `expand` a broadcast. This table holds those
functions, registered as `Lowering` records of kind "view" in the one table, with the
same calling convention as any lowering (arrays in, array or tuple of arrays out,
non-tensor arguments static). The `*_copy` overloads (what
`torch.export`'s core ATen set spells views as) share the same functions.

`as_strided` is the one view that needs the base's storage layout: here the base is
taken to be contiguous and to start its storage, which holds for every tensor a
functional graph computes; a graph input that is itself a strided view of a larger
storage must be materialised (`.contiguous()`) first.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import torch

from tpu_backend.ops._common import canonical_dim
from tpu_backend.ops.registry import VIEW_LOWERINGS, jax_dtype, lowers

aten = torch.ops.aten


def view_lowering(*targets: torch._ops.OpOverload) -> Callable:
    """Register the decorated function as the functional meaning of each view overload
    (`lowers(*targets, kind="view")`)."""
    return lowers(*targets, kind="view")


def _infer_size(size: Sequence[int], numel: int) -> tuple[int, ...]:
    """`size` with its -1 (if any) resolved, checked against `numel` like ATen's `infer_size`."""
    size = tuple(int(s) for s in size)
    if size.count(-1) > 1:
        raise ValueError(f"view: only one dimension can be inferred, got size {list(size)}")
    known = math.prod(s for s in size if s != -1)
    if -1 in size:
        if known == 0 or numel % known:
            raise ValueError(f"view: shape {list(size)} is invalid for input of size {numel}")
        size = tuple(numel // known if s == -1 else s for s in size)
    if math.prod(size) != numel:
        raise ValueError(f"view: shape {list(size)} is invalid for input of size {numel}")
    return size


# --------------------------------------------------------------------- same elements, new shape


@view_lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def view(x, size):
    return jnp.reshape(x, _infer_size(size, x.size))


@view_lowering(aten._reshape_alias.default)
def _reshape_alias(x, size, stride):
    return view(x, size)


@view_lowering(aten._reshape_copy.default)
def _reshape_copy(x, size):
    return view(x, size)


@view_lowering(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(x, dtype):
    """Reinterpret the bits: the last dim scales by the ratio of item sizes (ATen's rule)."""
    target = jnp.dtype(jax_dtype(dtype))
    if target.itemsize == x.dtype.itemsize:
        return jax.lax.bitcast_convert_type(x, target)
    if target.itemsize < x.dtype.itemsize:  # one element becomes several: new trailing dim
        out = jax.lax.bitcast_convert_type(x, target)
        return out.reshape(*x.shape[:-1], x.shape[-1] * out.shape[-1])
    ratio = target.itemsize // x.dtype.itemsize
    if x.ndim == 0 or x.shape[-1] % ratio:
        raise ValueError(f"view(dtype={dtype}): last dimension {x.shape[-1:]} is not divisible by {ratio}")
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // ratio, ratio)
    return jax.lax.bitcast_convert_type(grouped, target)


@view_lowering(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@view_lowering(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(x):
    if x.ndim == 0 or x.shape[-1] != 2:
        raise ValueError(f"view_as_complex: the last dimension must have size 2, got shape {list(x.shape)}")
    return jax.lax.complex(x[..., 0], x[..., 1])


@view_lowering(
    aten.alias.default, aten.alias_copy.default, aten.detach.default, aten.detach_copy.default, aten.lift_fresh.default
)
def alias(x):
    return x


# --------------------------------------------------------------------- reordering dims


@view_lowering(aten.t.default, aten.t_copy.default)
def t(x):
    return x if x.ndim < 2 else x.T


@view_lowering(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, canonical_dim(dim0, x.ndim), canonical_dim(dim1, x.ndim)) if x.ndim else x


@view_lowering(aten.permute.default, aten.permute_copy.default)
def permute(x, dims):
    return jnp.transpose(x, tuple(canonical_dim(d, x.ndim) for d in dims)) if x.ndim else x


# --------------------------------------------------------------------- adding and removing dims


@view_lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, canonical_dim(dim, x.ndim + 1))


@view_lowering(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(x):
    return jnp.squeeze(x)


@view_lowering(aten.squeeze.dim, aten.squeeze_copy.dim)
def squeeze_dim(x, dim):
    return squeeze_dims(x, [dim])


@view_lowering(aten.squeeze.dims, aten.squeeze_copy.dims)
def squeeze_dims(x, dim):
    """Drop the listed dims that have size 1; others stay (ATen ignores them)."""
    if x.ndim == 0:
        return x
    dims = tuple(d for d in {canonical_dim(d, x.ndim) for d in dim} if x.shape[d] == 1)
    return jnp.squeeze(x, dims) if dims else x


@view_lowering(aten.expand.default, aten.expand_copy.default)
def expand(x, size, implicit=False):
    """Broadcast to `size`; -1 keeps the existing dim, new dims are added on the left."""
    size = tuple(int(s) for s in size)
    lead = len(size) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: size {list(size)} has fewer dims than the tensor's shape {list(x.shape)}")
    target = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, target)


# --------------------------------------------------------------------- picking parts


@view_lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    """Python slicing semantics along `dim` (out-of-range bounds clamp, as in ATen)."""
    dim = canonical_dim(dim, x.ndim)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@view_lowering(aten.narrow.default, aten.narrow_copy.default)
def narrow(x, dim, start, length):
    dim = canonical_dim(dim, x.ndim)
    start = start + x.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim)


@view_lowering(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    dim = canonical_dim(dim, x.ndim)
    size = x.shape[dim]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {size} at dimension {dim}")
    return jax.lax.index_in_dim(x, index % size, axis=dim, keepdims=False)


@view_lowering(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    dim = canonical_dim(dim, x.ndim)
    length = x.shape[dim]
    sizes = [min(split_size, length - start) for start in range(0, length, split_size)] if split_size else [length]
    return split_with_sizes(x, sizes or [0], dim)


@view_lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, split_sizes, dim=0):
    dim = canonical_dim(dim, x.ndim)
    if sum(split_sizes) != x.shape[dim]:
        raise ValueError(f"split_with_sizes: sizes {list(split_sizes)} do not sum to {x.shape[dim]} (dim {dim})")
    starts = [sum(split_sizes[:i]) for i in range(len(split_sizes))]
    return tuple(jax.lax.slice_in_dim(x, s, s + n, axis=dim) for s, n in zip(starts, split_sizes))


@view_lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    dim = canonical_dim(dim, x.ndim)
    return tuple(jax.lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim]))


@view_lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim))


@view_lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, dimension, size, step):
    """Windows of `size` every `step` along `dimension`, as a new last dim (ATen's layout)."""
    if x.ndim == 0:
        return jnp.reshape(x, (1,))
    dim = canonical_dim(dimension, x.ndim)
    count = (x.shape[dim] - size) // step + 1
    starts = jnp.arange(count) * step
    window = starts[:, None] + jnp.arange(size)[None, :]  # (count, size) indices along dim
    picked = jnp.take(x, window, axis=dim)  # dims: ..., count, size, ...
    return jnp.moveaxis(picked, dim + 1, -1)


@view_lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    """Gather (size, stride, offset) out of `x` flattened (see the module docstring)."""
    offset = storage_offset or 0
    size = tuple(int(s) for s in size)
    index = jnp.full(size, offset, jnp.int32 if x.size < 2**31 else jnp.int64)
    for dim, step in enumerate(stride):
        if size[dim] != 1 and step != 0:
            index = index + jax.lax.broadcasted_iota(index.dtype, size, dim) * step
    return jnp.reshape(x, (-1,))[index]


__all__ = ["VIEW_LOWERINGS", "view_lowering"]
