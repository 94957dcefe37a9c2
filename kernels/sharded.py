"""The kernels over a device mesh: each call wrapped in `jax.shard_map`, split where the
kernel's math allows, so XLA never has to partition a Mosaic kernel (it cannot: "Mosaic
kernels cannot be automatically partitioned. Please wrap the call in a shard_map").

A `KernelMesh` names the mesh and the role of its axes: `batch` (data parallel, FSDP:
the axes a batch is split over) and `model` (tensor parallel: heads, vocabulary). Inside
`split_over(kernel_mesh)` every kernel call of `kernels/` made through this module runs
per shard:

- flash attention: batch over `batch`, heads over `model` (K/V heads must divide too:
  a query head reads the K/V head of its group, which stays on its shard); the backward
  is split the same way (no collective);
- RMSNorm / LayerNorm: rows (the first leading dim that divides: batch, else sequence)
  over `batch`; weight and bias gradients are summed over those axes (`psum`);
- cross-entropy: rows over `batch`, vocabulary over `model`: each shard's logsumexp
  (the kernel) is combined across the vocabulary shards (`pmax`, then `psum` of the
  scaled sums) and the target's logit is taken on the shard that holds it (`psum`); the
  backward needs no collective (each shard's probabilities from the global logsumexp).

A dim that an axis does not divide stays whole over it (the shard computes it in full,
as every device would without a mesh). The specs only say where the kernel wants its
operands: XLA moves them there if they live elsewhere, so any split is numerically the
unsplit call. "reference" calls (plain XLA) are never wrapped: XLA partitions them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from kernels import cross_entropy as ce
from kernels import flash_attention as fa
from kernels import norms


@dataclasses.dataclass(frozen=True)
class KernelMesh:
    """A mesh and the axes the kernels may split over: `batch` (rows, batch) and `model`
    (attention heads, vocabulary; None: no tensor-parallel axis)."""

    mesh: jax.sharding.Mesh
    batch: tuple[str, ...] = ()
    model: str | None = None

    def __post_init__(self):
        unknown = [a for a in (*self.batch, self.model) if a is not None and a not in self.mesh.axis_names]
        if unknown:
            raise ValueError(f"kernel mesh axes {unknown} are not axes of the mesh {dict(self.mesh.shape)}")


_STACK: list[KernelMesh | None] = []
_default: KernelMesh | None = None


def set_default(kernel_mesh: KernelMesh | None) -> None:
    """The kernel mesh outside any `split_over` (`tpu_backend.distributed.set_mesh` sets it)."""
    global _default
    _default = kernel_mesh


@contextlib.contextmanager
def split_over(kernel_mesh: KernelMesh | None):
    """Inside, kernel calls are split over `kernel_mesh` (None: never split)."""
    _STACK.append(kernel_mesh)
    try:
        yield kernel_mesh
    finally:
        _STACK.pop()


def current(impl: str) -> KernelMesh | None:
    """The kernel mesh a call of implementation `impl` is split over, or None: no mesh,
    a one-device mesh, or the XLA reference (which XLA partitions itself)."""
    kernel_mesh = _STACK[-1] if _STACK else _default
    if impl == "reference" or kernel_mesh is None or kernel_mesh.mesh.size == 1:
        return None
    return kernel_mesh


def _split(km: KernelMesh, size: int, axes) -> str | tuple[str, ...] | None:
    """The longest prefix of `axes` (those of more than one device) whose device count
    divides `size`, as a PartitionSpec entry; None: the dim stays whole."""
    axes = tuple(a for a in axes if a is not None and km.mesh.shape[a] > 1)
    while axes and size % math.prod(km.mesh.shape[a] for a in axes):
        axes = axes[:-1]
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _shard_map(km: KernelMesh, body, in_specs, out_specs):
    # check_vma off: a pallas_call does not type which mesh axes its outputs vary over
    return jax.shard_map(body, mesh=km.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def shard_shape(km: KernelMesh, shape, spec: P) -> tuple[int, ...]:
    """The per-shard shape of an operand of `shape` split by `spec` (what the kernel sees)."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    return tuple(size // math.prod(km.mesh.shape[a] for a in _axes(e)) for size, e in zip(shape, entries))


# --------------------------------------------------------------------------- attention


def attention_spec(km: KernelMesh, q_shape, k_shape) -> P:
    """q's and k's split: batch over the batch axes, heads over the model axis (when the
    K/V heads divide: then the query heads do too)."""
    return P(_split(km, q_shape[0], km.batch), _split(km, k_shape[1], (km.model,)))


def _attention_specs(km: KernelMesh, q, k, mask):
    """(q spec, k/v spec, mask spec) for q (B, H, Lq, D), k (B, Hkv, Lk, D)."""
    spec = attention_spec(km, q.shape, k.shape)
    if mask is None:
        return spec, spec, None
    full = (q.shape[0], q.shape[1])
    lead = (1,) * (4 - mask.ndim) + tuple(mask.shape[:-2])
    entries = [entry if size == extent and size > 1 else None for entry, size, extent in zip(spec, lead, full)]
    return spec, spec, P(*entries[4 - mask.ndim :]) if mask.ndim > 2 else P()


def attention_forward(km: KernelMesh, q, k, v, mask, causal, scale, impl):
    """`flash_attention.attention_forward` per shard: (out, logsumexp)."""
    qs, kvs, ms = _attention_specs(km, q, k, mask)

    def body(q, k, v, mask):
        return fa.attention_forward(q, k, v, mask, fa.resolve_config(q, k, causal, scale, impl))

    return _shard_map(km, body, (qs, kvs, kvs, ms), (qs, qs))(q, k, v, mask)


def attention_backward(km: KernelMesh, dout, q, k, v, mask, out, lse, causal, scale, impl):
    """`flash_attention.attention_backward` per shard: (dq, dk, dv)."""
    qs, kvs, ms = _attention_specs(km, q, k, mask)

    def body(dout, q, k, v, mask, out, lse):
        config = fa.resolve_config(q, k, causal, scale, impl)
        return fa.attention_backward(dout, q, k, v, mask, out, lse, config)

    return _shard_map(km, body, (qs, qs, kvs, kvs, ms, qs, qs), (qs, kvs, kvs))(dout, q, k, v, mask, out, lse)


# --------------------------------------------------------------------------- norms


def rows_spec(km: KernelMesh, shape) -> P:
    """Split the first leading dim (batch, else sequence...) the batch axes divide."""
    for dim, size in enumerate(shape[:-1]):
        entry = _split(km, size, km.batch)
        if entry is not None:
            return P(*([None] * dim), entry)
    return P()


def _flat(x):
    return None if x is None else x.reshape(-1, x.shape[-1])


def norm_forward(km: KernelMesh, x, residual, weight, bias, centered, eps, impl):
    """`norms.norm_forward` per row shard over x (..., D): (y, h) shaped like x (h: the
    residual sum, or an empty (0,) array without a residual)."""
    rows = rows_spec(km, x.shape)

    def body(x, residual, weight, bias):
        config = norms.resolve_config(_flat(x), centered, eps, impl)
        y, h = norms.norm_forward(_flat(x), _flat(residual), weight, bias, config)
        return y.reshape(x.shape), (h.reshape(x.shape) if residual is not None else jnp.zeros((0,), x.dtype))

    h_spec = rows if residual is not None else P()
    return _shard_map(km, body, (rows, rows, P(), P()), (rows, h_spec))(x, residual, weight, bias)


def norm_backward(km: KernelMesh, dy, dh, h, weight, bias, centered, eps, impl):
    """`norms.norm_backward` per row shard: (dx, dweight, dbias) with the weight and bias
    gradients summed over the row shards (empty (0,) arrays where there is none)."""
    rows = rows_spec(km, h.shape)
    row_axes = tuple(a for entry in rows for a in _axes(entry))

    def body(dy, dh, h, weight, bias):
        config = norms.resolve_config(_flat(h), centered, eps, impl)
        dx, dw, db = norms.norm_backward(_flat(dy), _flat(dh), _flat(h), weight, bias, config)
        empty = jnp.zeros((0,), h.dtype)
        dw, db = (empty if g is None else lax.psum(g, row_axes) if row_axes else g for g in (dw, db))
        return dx.reshape(h.shape), dw, db

    return _shard_map(km, body, (rows, rows, rows, P(), P()), (rows, P(), P()))(dy, dh, h, weight, bias)


# --------------------------------------------------------------------------- cross-entropy


def cross_entropy_spec(km: KernelMesh, shape) -> P:
    """(N, V) logits: rows over the batch axes, vocabulary over the model axis."""
    return P(_split(km, shape[0], km.batch), _split(km, shape[1], (km.model,)))


def _global_logsumexp(lse, axes):
    """logsumexp over vocabulary shards from each shard's logsumexp (rows (N,))."""
    top = lax.stop_gradient(lax.pmax(lse, axes))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return top + jnp.log(lax.psum(jnp.exp(lse - top), axes))


def _shard_columns(logits, targets, axes):
    """(targets as this shard's columns, whether this shard holds them)."""
    width = logits.shape[1]
    start = lax.axis_index(axes) * width
    local = targets.astype(jnp.int32) - start
    return local, (local >= 0) & (local < width)


def cross_entropy_forward(km: KernelMesh, logits, targets, ignore_index, impl):
    """`cross_entropy.cross_entropy_forward` over shards of rows and vocabulary: (per-row
    loss, logsumexp), both (N,) float32."""
    rows, vocab = cross_entropy_spec(km, logits.shape)

    def body(logits, targets):
        config = ce.resolve_config(logits, ignore_index, impl)
        if vocab is None:
            return ce.cross_entropy_forward(logits, targets, config)
        lse = _global_logsumexp(ce.row_logsumexp(logits, config), vocab)
        local, here = _shard_columns(logits, targets, vocab)
        picked = ce.picked_logits(logits, jnp.where(here, local, 0))
        picked = lax.psum(jnp.where(here, picked, 0.0), vocab)
        return jnp.where(targets != ignore_index, lse - picked, 0.0), lse

    return _shard_map(km, body, (P(rows, vocab), P(rows)), (P(rows), P(rows)))(logits, targets)


def cross_entropy_backward(km: KernelMesh, grad_losses, logits, targets, lse, ignore_index, impl):
    """d logits per shard of rows and vocabulary (the global logsumexp is saved)."""
    rows, vocab = cross_entropy_spec(km, logits.shape)

    def body(grad_losses, logits, targets, lse):
        config = ce.resolve_config(logits, ignore_index, impl)
        if vocab is None:
            return ce.cross_entropy_backward(grad_losses, logits, targets, lse, config)
        local, here = _shard_columns(logits, targets, vocab)
        scale = jnp.where(targets != ignore_index, grad_losses.astype(jnp.float32), 0.0)
        return ce.logits_gradient(logits, jnp.where(here, local, -1), lse, scale, config)

    specs = (P(rows), P(rows, vocab), P(rows), P(rows))
    return _shard_map(km, body, specs, P(rows, vocab))(grad_losses, logits, targets, lse)
