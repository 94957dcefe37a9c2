"""Tensor payloads: where the data of a "tpu" tensor lives, and torch <-> JAX.

A tpu tensor is a plain PrivateUse1 TensorImpl (so `detach`, `nn.Parameter`, views and
Dynamo treat it like any device tensor). Its data is a JAX array kept in `_PAYLOADS`,
keyed by the tensor's *storage*: every view and alias of a tensor shares its storage,
hence its payload. An entry is dropped the moment the last tensor using the storage dies
(the table never grows over a training loop; `payload_count()` lets tests measure that):
by a weakref callback on the storage object here, and for op results made on the
compiled path (`tpu_backend/native`) by the storage's own DataPtr, whose deleter does
`StoragePayload.release`'s work.

A storage payload is a JAX array holding all elements of the storage in order. It is
kept in the shape of the tensor that last wrote the whole storage (the common case:
one contiguous tensor per storage), so reading that tensor is free. Other views are a
gather of (sizes, strides, storage_offset) from the flattened payload, and an in-place
write through a view is a scatter back into it; both are jitted once per view geometry.

`empty` does not allocate: a payload starts unmaterialised and becomes zeros when first
read (transformers warms allocators with huge `torch.empty` calls).
"""

from __future__ import annotations

import collections
import functools
import math
import sys
import weakref
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax._src.array import ArrayImpl  # JAX's concrete array class (an exact type test is cheap)

from tpu_backend import chip_limits, native
from tpu_backend._registration import DEVICE_NAME, create_device_tensor, new_device_tensor
from tpu_backend.eager.errors import reraise_as_torch
from tpu_backend.ops.registry import jax_dtype, torch_dtype


class StoragePayload:
    """The data behind one storage: `numel` elements of `dtype`, `array` once materialised.

    `key` is the storage's `_cdata`; `ref` the weakref whose callback releases it (None
    when the storage's DataPtr releases it: results made on the compiled path)."""

    __slots__ = ("numel", "dtype", "array", "key", "ref")

    def __init__(self, numel: int, dtype: torch.dtype, array: jax.Array | None = None):
        self.numel, self.dtype, self.array = numel, dtype, array
        self.key = self.ref = None

    def materialised(self) -> jax.Array:
        if self.array is None:
            self.array = jnp.zeros((self.numel,), jax_dtype(self.dtype))
        return self.array

    @property
    def nbytes(self) -> int:
        return 0 if self.array is None else self.array.nbytes

    def release(self, _dead_ref=None) -> None:
        """The storage died: drop the entry and break the payload <-> weakref cycle now."""
        if _PAYLOADS.get(self.key) is self:
            del _PAYLOADS[self.key]
        self.array = self.ref = None


_PAYLOADS: dict[int, StoragePayload] = {}


# --------------------------------------------------------------------- fused-mode seam


class LazyValue:
    """Base of fused mode's pending arrays (`tpu_backend.fused.LazyArray`): a payload may
    hold one until a sync point; `force()` returns the concrete JAX array."""

    __slots__ = ()

    def force(self) -> jax.Array:
        raise NotImplementedError

    def read_alone(self) -> np.ndarray | None:
        """Its value for the host without running the pending graph, when that is cheap and
        exact (fused mode: a small integer computation of concrete arrays), else None."""
        return None


_record = None  # fused mode's `record(key, fn, inputs)`, None when ops run eagerly
_sync = None  # fused mode's `sync()`

# Wait for every eager computation to finish before issuing the next one. Set by
# tpu_backend.distributed when a mesh spans several devices of JAX's CPU backend, where
# collectives can deadlock: in several processes, gloo collectives of back-to-back
# computations could interleave differently (FSDP on 2 processes x 4 devices, ~10 steps);
# in one process, XLA's CPU client runs both the launches (which block once 32 programs
# are queued on a device) and the collectives' participants (which block until all have
# arrived) on one pool of a thread per device, and strict mode's hundreds of small
# programs per step can fill it (FSDP on 8 virtual devices, one run in 4 on a loaded host).
SYNC_EACH_COMPUTATION = False


def set_lazy_hooks(record, sync) -> None:
    """Installed by `tpu_backend.fused` while fused mode is on (None, None: eager)."""
    global _record, _sync
    _record, _sync = record, sync


# What runs where the host waits for the device to read it (`to_cpu_tensor`,
# `torch.tpu.synchronize`): the eager index checks (`eager/bounds.py` installs them).
_BEFORE_HOST_READ: list[Callable[[], None]] = []


def on_host_read(hook: Callable[[], None]) -> None:
    if hook not in _BEFORE_HOST_READ:
        _BEFORE_HOST_READ.append(hook)


def before_host_read() -> None:
    for hook in _BEFORE_HOST_READ:
        hook()


# Storage gathers/scatters run eagerly (each one launches a program): benchmarks count
# programs per step as these plus the ops' jitted calls (`eager.runner.CACHE_STATS`).
EAGER_STORAGE_CALLS = collections.Counter()


def apply(key, fn, *inputs):
    """`fn(*inputs)` now, or recorded as a fused-graph node keyed by `key` in fused mode."""
    if _record is not None:
        return _record(key, fn, list(inputs))
    EAGER_STORAGE_CALLS[key[0]] += 1
    out = fn(*inputs)
    if SYNC_EACH_COMPUTATION:
        jax.block_until_ready(out)
    return out


def concrete(array):
    """A JAX array for `array`, running fused mode's pending graph if it is not computed."""
    return array.force() if isinstance(array, LazyValue) else array


def for_host(array):
    """`array` for a host read: fused mode's pending value computed alone when that is cheap
    and exact (`LazyValue.read_alone`, a numpy array), else made concrete (which runs fused
    mode's pending graph)."""
    if isinstance(array, LazyValue):
        host = array.read_alone()
        return host if host is not None else array.force()
    return array


def flush() -> None:
    """Run what fused mode has recorded (a no-op in strict and debug modes)."""
    if _sync is not None:
        _sync()


def replace_computed_payloads() -> None:
    """After a fused sync: payloads hold their computed arrays, not placeholders."""
    for payload in _PAYLOADS.values():
        if isinstance(payload.array, LazyValue):
            payload.array = payload.array.force()


python_replace_computed_payloads = replace_computed_payloads  # the definition; in C++:
if hasattr(native.load(), "replace_computed_payloads"):  # no Python call per payload
    replace_computed_payloads = functools.partial(native.module.replace_computed_payloads, _PAYLOADS, LazyValue)


# References to an array only its tensor holds, counted while it sits in a list of program
# arguments: its payload, the list and getrefcount's own argument. Counted in place: an
# array passed to a Python function first may carry one more reference for the call (how
# many depends on the interpreter: after Dynamo has failed once in the process, one more).
_HELD_BY_ITS_TENSOR_ALONE = 3


def held_only_by_their_tensors(arrays: list, positions) -> bool:
    """Whether the arrays at `positions` of `arrays` (a program's arguments) can be donated,
    breaking nothing: each a concrete array referenced only by its storage's payload and the
    list. No user's `to_jax` value, no second storage (`b = a.clone()` may share `a`'s
    immutable array), not another argument of the same call (`x.add_(x)`)."""
    getrefcount = sys.getrefcount
    for position in positions:
        if type(arrays[position]) is not ArrayImpl or getrefcount(arrays[position]) != _HELD_BY_ITS_TENSOR_ALONE:
            return False
    return True


def is_tpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME


def payload_if_tpu(t: torch.Tensor) -> StoragePayload | None:
    """The payload of a tpu tensor, None for tensors on other devices (fast device test)."""
    return _PAYLOADS.get(t.untyped_storage()._cdata)


def _attach(t: torch.Tensor, payload: StoragePayload) -> None:
    storage = t.untyped_storage()
    payload.key = storage._cdata
    # The storage's Python object lives exactly as long as the storage (PyTorch preserves
    # it), so a weakref callback frees the payload the moment the last tensor dies.
    payload.ref = weakref.ref(storage, payload.release)
    _PAYLOADS[payload.key] = payload


def payload_of(t: torch.Tensor) -> StoragePayload:
    try:
        return _PAYLOADS[t.untyped_storage()._cdata]
    except KeyError:
        raise RuntimeError(
            f"tpu tensor of shape {tuple(t.shape)} has no data: it was not created by tpu_backend "
            "(e.g. an UntypedStorage built by hand). Create tpu tensors with torch ops or .to('tpu')."
        ) from None


def payload_count() -> int:
    """Number of live storages on the device (flat over a training loop = no leak)."""
    return len(_PAYLOADS)


def live_bytes() -> int:
    """Bytes held by materialised payloads (an array shared by two storages counts once)."""
    arrays = {id(p.array): p.array for p in _PAYLOADS.values() if p.array is not None}
    return sum(a.nbytes for a in arrays.values())


# --------------------------------------------------------------------- creating tensors


def empty_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """A tpu tensor whose payload is allocated (as zeros) only when first read."""
    t = new_device_tensor(shape, dtype)
    _attach(t, StoragePayload(math.prod(shape), dtype))
    return t


_TORCH_DTYPE_OF = {}  # jax/numpy dtype -> torch dtype, filled on first sight (wrap's hot path)
_ARRAY_DTYPE_OF = {}  # torch dtype -> the numpy dtype of its JAX arrays (write's hot path)


def wrap(array: jax.Array) -> torch.Tensor:
    """A new contiguous tpu tensor owning `array`.

    Every op's result goes through here, so it is `_attach` inlined, with no shape or
    dtype derived twice (a strict-mode op costs a few microseconds in all)."""
    dtype = _TORCH_DTYPE_OF.get(array.dtype)
    if dtype is None:
        dtype = _TORCH_DTYPE_OF[array.dtype] = torch_dtype(array.dtype)
    t = create_device_tensor(array.shape, dtype)
    payload = StoragePayload(t.numel(), dtype, array)
    storage = t.untyped_storage()
    payload.key = key = storage._cdata
    payload.ref = weakref.ref(storage, payload.release)
    _PAYLOADS[key] = payload
    return t


# --------------------------------------------------------------------- reading and writing


def _is_contiguous(shape, strides) -> bool:
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _view_indices(shape, strides, offset):
    """Flat storage index of every element of a strided view (built inside jit from iota)."""
    index = jnp.full(shape, offset, jnp.int64)
    for dim, stride in enumerate(strides):
        if shape[dim] != 1 and stride != 0:
            index = index + jax.lax.broadcasted_iota(jnp.int64, shape, dim) * stride
    return index


def _permuted_block(shape, strides, offset):
    """The view as a transpose (plus broadcast of stride-0 dims) of one contiguous block of
    the storage, or None. Transposed and expanded views (`.t()`, `.permute`, `.expand`)
    are most of the non-contiguous reads in training; a transpose compiles and runs much
    faster than a general gather."""
    dims = [d for d, (size, stride) in enumerate(zip(shape, strides)) if size != 1 and stride != 0]
    order = sorted(dims, key=lambda d: strides[d], reverse=True)  # outermost in memory first
    numel = 1
    for d in reversed(order):
        if strides[d] != numel:
            return None
        numel *= shape[d]
    block_shape = [shape[d] for d in order]
    axes = [order.index(d) for d in dims]
    kept_shape = [shape[d] if d in dims else 1 for d in range(len(shape))]

    def gather(base):
        block = jax.lax.slice(base.reshape(-1), (offset,), (offset + numel,)).reshape(block_shape)
        return jnp.broadcast_to(jnp.transpose(block, axes).reshape(kept_shape), shape)

    return gather


@functools.lru_cache(maxsize=4096)
def _gather_fn(shape, strides, offset):
    numel = math.prod(shape)
    if _is_contiguous(shape, strides):
        return jax.jit(lambda base: jax.lax.slice(base.reshape(-1), (offset,), (offset + numel,)).reshape(shape))
    permuted = _permuted_block(shape, strides, offset)
    if permuted is not None:
        return jax.jit(permuted)
    return jax.jit(lambda base: base.reshape(-1)[_view_indices(shape, strides, offset)])


@functools.lru_cache(maxsize=4096)
def _scatter_fn(shape, strides, offset):
    # The result keeps the base's shape, so the tensor owning the storage still reads free.
    if _is_contiguous(shape, strides):
        return jax.jit(
            lambda base, value: jax.lax.dynamic_update_slice(base.reshape(-1), value.reshape(-1), (offset,)).reshape(
                base.shape
            )
        )
    return jax.jit(
        lambda base, value: base.reshape(-1).at[_view_indices(shape, strides, offset)].set(value).reshape(base.shape)
    )


def _covers_storage(t: torch.Tensor, payload: StoragePayload) -> bool:
    return t.storage_offset() == 0 and t.numel() == payload.numel and t.is_contiguous()


def _to_bytes(array: jax.Array) -> jax.Array:
    if jnp.issubdtype(array.dtype, jnp.complexfloating):  # XLA cannot bitcast complex: (re, im) pairs
        array = jnp.stack([array.real, array.imag], axis=-1)
    if array.dtype == jnp.bool_:
        array = array.astype(jnp.uint8)
    if array.dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(array, jnp.uint8)
    return jax.lax.bitcast_convert_type(array, jnp.uint8).reshape(-1)


def _from_bytes(raw: jax.Array, dtype) -> jax.Array:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        pairs = _from_bytes(raw, jnp.finfo(dtype).dtype).reshape(-1, 2)
        return jax.lax.complex(pairs[:, 0], pairs[:, 1])
    if dtype == jnp.bool_:
        return raw != 0
    size = np.dtype(dtype).itemsize
    if size == 1:
        return jax.lax.bitcast_convert_type(raw, dtype)
    return jax.lax.bitcast_convert_type(raw.reshape(-1, size), dtype)


def _reinterpret(payload: StoragePayload, dtype: torch.dtype) -> None:
    """Re-type a storage's bytes as `dtype` (`Tensor.view(dtype)`, `view_as_real`/`view_as_complex`,
    storages from torch.load)."""
    nbytes = payload.numel * payload.dtype.itemsize
    payload.array = concrete(payload.array)
    if nbytes % dtype.itemsize:
        raise RuntimeError(f"a tpu storage of {nbytes} bytes cannot be viewed as {dtype}")
    if payload.array is not None:
        payload.array = _from_bytes(_to_bytes(payload.array.reshape(-1)), jax_dtype(dtype))
    payload.numel, payload.dtype = nbytes // dtype.itemsize, dtype


def storage_from_bytes(data: np.ndarray) -> torch.UntypedStorage:
    """A tpu storage holding these raw bytes (typed on first use by the tensors over it)."""
    holder = empty_tensor((data.size,), torch.uint8)
    payload_of(holder).array = jnp.array(data.view(np.uint8).reshape(-1), copy=True)
    return holder.untyped_storage()


def _storage_payload(storage: torch.UntypedStorage) -> StoragePayload:
    try:
        return _PAYLOADS[storage._cdata]
    except KeyError:
        raise RuntimeError("this tpu storage has no data: it was not created by tpu_backend") from None


def storage_to_bytes(storage: torch.UntypedStorage) -> np.ndarray:
    """The raw bytes of a tpu storage (its elements in order), on the host."""
    array = concrete(_storage_payload(storage).materialised())
    return to_numpy(_to_bytes(array.reshape(-1)))


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage with the same elements (JAX arrays are immutable: it shares the array;
    a write replaces an array, and a shared one is never donated)."""
    payload = _storage_payload(storage)
    holder = empty_tensor((payload.numel,), payload.dtype)
    payload_of(holder).array = None if payload.array is None else concrete(payload.array)
    return holder.untyped_storage()


def read(t: torch.Tensor, payload: StoragePayload | None = None) -> jax.Array:
    """The value of tpu tensor `t` as a JAX array of `t`'s shape and dtype."""
    if payload is None:
        payload = payload_of(t)
    base = payload.array
    if (  # the hot path, every op input: the tensor is its whole storage, no math bits
        base is not None
        and t.storage_offset() == 0
        and payload.dtype is t.dtype
        and t.is_contiguous()
        and t.shape == base.shape
        and not t.is_conj()
        and not t.is_neg()
    ):
        return base
    if payload.dtype != t.dtype:
        _reinterpret(payload, t.dtype)
    base = payload.array
    if base is None:
        base = payload.materialised()
    shape = t.shape
    offset = t.storage_offset()
    if offset == 0 and t.is_contiguous() and shape == base.shape:
        value = base  # fast path: the tensor is its whole storage
    else:
        geometry = (tuple(shape), tuple(t.stride()), offset)
        value = apply(("gather", *geometry), _gather_fn(*geometry), base)
    if t.is_conj() or t.is_neg():
        return _apply_math_bits(t, value)
    return value


def read_deferred(t: torch.Tensor, payload: StoragePayload):
    """`read` for an op's input: (array, None), or (storage array, view geometry) when `t`
    is a plain view of its storage, so that the op gathers the view *inside its own
    program* (`gather_fn(*geometry)`) instead of launching one program for the gather:
    reshapes, transposes and slices are most inputs of a training step."""
    base = payload.array
    if base is not None and payload.dtype is t.dtype and not t.is_conj() and not t.is_neg():
        offset = t.storage_offset()
        if offset == 0 and t.is_contiguous() and t.shape == base.shape:
            return base, None
        return base, (tuple(t.shape), tuple(t.stride()), offset)
    return read(t, payload), None


def gather_fn(shape, strides, offset) -> Callable:
    """The function reading view (shape, strides, offset) from a storage array (jitted, cached)."""
    return _gather_fn(shape, strides, offset)


def _apply_math_bits(t: torch.Tensor, value):
    """The lazy conjugate / negative bits of a view (`x.conj()`, `x.conj().imag`), applied.

    ATen sets only a bit on such views and lets each backend's copy and the math-bit fallbacks
    resolve it; the device resolves it wherever it reads (and, inverted, where it writes)."""
    if t.is_conj():
        value = apply(("conj",), jnp.conj, value)
    if t.is_neg():
        value = apply(("neg",), jnp.negative, value)
    return value


def write(t: torch.Tensor, value: jax.Array) -> None:
    """Store `value` (broadcast and cast to `t`'s shape and dtype) into `t`, through views."""
    payload = payload_of(t)
    base = payload.array
    if (  # the hot path (in-place ops, optimizer updates): a value just like the tensor's whole storage
        base is not None
        and value.dtype == base.dtype
        and value.shape == base.shape
        and payload.dtype is t.dtype
        and t.shape == base.shape
        and t.storage_offset() == 0
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    ):
        payload.array = value
        return
    if payload.dtype != t.dtype:
        _reinterpret(payload, t.dtype)
    shape = tuple(t.shape)
    target = _ARRAY_DTYPE_OF.get(t.dtype)
    if target is None:
        target = _ARRAY_DTYPE_OF[t.dtype] = np.dtype(jax_dtype(t.dtype))
    if value.dtype != target:
        value = value.astype(target)
    if value.shape != shape:
        try:
            value = apply(("broadcast_to", shape), functools.partial(jnp.broadcast_to, shape=shape), value)
        except ValueError:  # ATen's words for an in-place op or a copy whose value does not broadcast
            raise RuntimeError(
                f"output with shape {list(shape)} doesn't match the broadcast shape {list(value.shape)}"
            ) from None
    if t.is_conj() or t.is_neg():  # writing through x.conj(): store the conjugate
        value = _apply_math_bits(t, value)
    if _covers_storage(t, payload):
        payload.array = value
        return
    geometry = (shape, tuple(t.stride()), t.storage_offset())
    payload.array = apply(("scatter", *geometry), _scatter_fn(*geometry), payload.materialised(), value)


python_write = write  # the definition; the compiled path runs its hot case in C++, the rest here
_native = native.load()
if _native is not None:
    _native.configure_write(python_write)
    write = _native.write  # noqa: F811


def resize_payload(t: torch.Tensor, numel: int) -> None:
    """Grow `t`'s storage payload to hold at least `numel` elements (new ones are zero)."""
    payload = payload_of(t)
    if numel <= payload.numel:
        return
    if payload.array is not None:
        payload.array = concrete(payload.array)
        payload.array = jnp.concatenate(
            [payload.array.reshape(-1), jnp.zeros((numel - payload.numel,), payload.array.dtype)]
        )
    payload.numel = numel


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def over_storage(storage, offset: int, shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A new tpu tensor over `storage` (so over its payload) at `offset`: not a view of
    another tensor, so it has its own version counter (`CompiledGraph`'s stacked rows)."""
    t = create_device_tensor((0,), dtype)  # its own empty storage, no payload, swapped below
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(_META, t, storage, offset, shape, stride)


def resize_(t: torch.Tensor, size, memory_format=None):
    """Resize in place: grow the payload if needed, then restride through the Meta kernel.
    (The `aten.resize_` kernel, and `out=` results of another shape: `eager/variants.py`.)"""
    size = tuple(size)
    strides = torch._prims_common.make_contiguous_strides_for(size) if size else ()
    resize_payload(t, t.storage_offset() + math.prod(size))
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _META, t, t.untyped_storage(), t.storage_offset(), size, strides
    )
    return t


# --------------------------------------------------------------------- host transfers


def to_numpy(array: jax.Array) -> np.ndarray:
    array = for_host(array)
    if isinstance(array, np.ndarray):
        return array
    if not array.is_fully_addressable:  # sharded over several processes (tpu_backend.distributed)
        if array.is_fully_replicated:
            return np.asarray(array.addressable_data(0))
        from jax.experimental import multihost_utils  # a collective: every process must read it

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    try:
        return np.asarray(jax.device_get(array))
    except jax.errors.JaxRuntimeError as error:  # an op's failed allocation surfaces where its result is read
        reraise_as_torch(error)


def numpy_to_torch(value: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor from a numpy array (bfloat16 goes through its bits: numpy has no bf16)."""
    value = np.array(value, copy=True, order="C")  # writable and owned by the tensor
    if dtype == torch.bfloat16:
        return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(value)


def _host_array(t: torch.Tensor) -> np.ndarray:
    """The bytes of contiguous CPU tensor `t` as numpy, bfloat16 as ml_dtypes' (JAX's own bfloat16)."""
    host = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
    chip_limits.check_float64_fits(host)
    return host


def cpu_to_jax(t: torch.Tensor) -> jax.Array:
    """Host -> device for `.to("tpu")`: one `jax.device_put` of a copy the array owns (the
    source may change as soon as this returns; a transfer only, no program on the device)."""
    return cpu_to_jax_many([t])[0]


def cpu_to_jax_many(tensors: list[torch.Tensor]) -> list[jax.Array]:
    """`cpu_to_jax` of several tensors in one `jax.device_put` (a transfer costs ~0.2 ms of
    host time on a TPU host however small it is; one call for all of them costs about one)."""
    hosts = [np.array(_host_array(t.detach().contiguous()), copy=True) for t in tensors]
    try:
        return jax.device_put(hosts)
    except jax.errors.JaxRuntimeError as error:  # a full chip: PyTorch's OutOfMemoryError
        reraise_as_torch(error)


def cpu_tensors_to_device(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """tpu copies of CPU `tensors`, moved in one transfer (`cpu_to_jax_many`)."""
    return [wrap(array) for array in cpu_to_jax_many(tensors)]


def tree_to_device(value, move_other: Callable):
    """`value` (tensors nested in dicts, lists and tuples) with its CPU tensors moved to the
    device in one transfer (`cpu_tensors_to_device`) and its other tensors passed to
    `move_other`."""
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(value)
    on_host = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu"]
    for i, moved in zip(on_host, cpu_tensors_to_device([leaves[i] for i in on_host])):
        leaves[i] = moved
    on_host = set(on_host)
    leaves = [
        move_other(leaf) if isinstance(leaf, torch.Tensor) and i not in on_host else leaf
        for i, leaf in enumerate(leaves)
    ]
    return pytree.tree_unflatten(leaves, spec)


def cpu_to_jax_nonblocking(t: torch.Tensor) -> jax.Array:
    """Host -> device for `.to("tpu", non_blocking=True)`: one explicit `jax.device_put` of
    the tensor's own memory, which returns without waiting (on an accelerator the DMA
    overlaps what the host does next). As with CUDA, the source must not be modified until
    the copy has landed (`torch.tpu.synchronize()`, an event). JAX's CPU runtime may alias
    host memory instead of copying, so there the bytes are copied first."""
    host = _host_array(t.detach().contiguous())
    if jax.default_backend() == "cpu":
        host = host.copy()
    try:
        return jax.device_put(host)
    except jax.errors.JaxRuntimeError as error:
        reraise_as_torch(error)


def start_copy_to_host(t: torch.Tensor) -> None:
    """Start copying tpu tensor `t`'s storage to the host without waiting, so that a later
    `.cpu()` finds the bytes there (on a TPU host a read that waits costs ~0.45 ms)."""
    array = payload_of(t).array
    if isinstance(array, jax.Array):
        array.copy_to_host_async()


# A view of a storage at most this large (or at most twice the view's own size) is read by
# copying the whole storage to the host and taking the view there: gathering it on the
# device first is one more program, and waiting for it costs a TPU host ~0.5 ms.
HOST_VIEW_BYTES = 1 << 20


def to_cpu_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of tpu tensor `t` (same shape and dtype, contiguous). The host waits for the
    device here: the indices of the indexing ops since the last read are checked first (an
    out-of-range one raises its IndexError instead of the value, `eager/bounds.py`)."""
    before_host_read()
    payload = payload_of(t)
    base = payload.array
    if (
        isinstance(base, jax.Array)
        and base.size == payload.numel
        and payload.dtype is t.dtype
        and not t.is_conj()
        and not t.is_neg()
        and base.nbytes <= max(HOST_VIEW_BYTES, 2 * t.numel() * t.element_size())
    ):
        host = to_numpy(base).reshape(-1)[t.storage_offset() :]
        strides = tuple(stride * host.itemsize for stride in t.stride())
        return numpy_to_torch(np.lib.stride_tricks.as_strided(host, tuple(t.shape), strides), t.dtype)
    return numpy_to_torch(to_numpy(read(t)), t.dtype)
