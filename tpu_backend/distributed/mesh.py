"""The device mesh, placements, and where a tpu tensor's data lives across chips.

A tpu tensor's payload is a JAX array (`tpu_backend/tensor.py`); a JAX array carries a
`NamedSharding` over a `jax.sharding.Mesh`. Everything distributed in this package comes
down to giving payloads the right sharding and letting the ordinary op path run: each
op is a `jax.jit`, and XLA's SPMD partitioner (GSPMD) splits it over the mesh and inserts
the collectives (all-reduce of data-parallel gradients, all-gather of FSDP parameters).

Placements are DTensor's vocabulary: one per mesh axis, `Shard(dim)` (the tensor's dim
`dim` is split over that axis) or `Replicate()`. `partition_spec` maps them to a JAX
`PartitionSpec`.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Sequence

import jax
import numpy as np
import torch
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from tpu_backend import tensor as tpu_tensor

_MESH: Mesh | None = None


# --------------------------------------------------------------------- processes


def is_initialized() -> bool:
    """True once this process has joined a multi-process run (`jax.distributed`)."""
    return jax.distributed.is_initialized()


def initialize_from_env() -> bool:
    """Join the multi-process run `python -m tpu_backend.launch` described in the
    environment (TPU_COORDINATOR, TPU_NUM_PROCESSES, TPU_PROCESS_ID); with
    TPU_AUTO_INITIALIZE=1 (a TPU pod slice) JAX finds its peers itself. Returns True if
    this process is part of a multi-process run.

    Must run before the first JAX computation of the process (JAX's rule); `init_mesh`
    calls it.
    """
    if jax.distributed.is_initialized():
        return True
    coordinator = os.environ.get("TPU_COORDINATOR")
    if coordinator is None:
        if os.environ.get("TPU_AUTO_INITIALIZE") == "1":
            jax.distributed.initialize()  # cluster auto-detection (Cloud TPU, SLURM...)
            _settle_cpu_collectives()
            return True
        return False
    join_jax(
        coordinator,
        int(os.environ["TPU_NUM_PROCESSES"]),
        int(os.environ["TPU_PROCESS_ID"]),
        bind_address=coordinator,  # loopback: never listen on other interfaces
        init_timeout=int(os.environ.get("TPU_INIT_TIMEOUT", "300")),
    )
    return True


def join_jax(
    coordinator: str,
    num_processes: int,
    process_id: int,
    *,
    bind_address: str | None = None,
    init_timeout: int = 300,
    local_device_ids: list[int] | None = None,
) -> None:
    """`jax.distributed.initialize` for this package's launcher and for the "tpu"
    torch.distributed backend (`process_group.py`), with a clear error when JAX already ran."""
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            coordinator_bind_address=bind_address,
            local_device_ids=local_device_ids,
            heartbeat_timeout_seconds=int(os.environ.get("TPU_HEARTBEAT_TIMEOUT", "100")),
            initialization_timeout=init_timeout,
        )
        _settle_cpu_collectives()
    except RuntimeError as error:
        if "before any JAX" in str(error):
            raise RuntimeError(
                "this process joins a multi-process run but JAX already ran computations: call "
                'dist.init_process_group("tpu") (or import tpu_backend.distributed / init_mesh under '
                "tpu_backend.launch) before creating tpu tensors"
            ) from error
        raise


def _settle_cpu_collectives(mesh: Mesh | None = None) -> None:
    """Run eager computations one at a time on JAX's CPU backend (`tensor.SYNC_EACH_COMPUTATION`)
    when collectives could deadlock there: several processes, or one process whose `mesh`
    spans several devices. TPU/GPU runtimes order collectives themselves."""
    if tpu_tensor.SYNC_EACH_COMPUTATION or jax.default_backend() != "cpu":  # `get_mesh` asks every step
        return
    if jax.process_count() > 1 or (mesh is not None and mesh.devices.size > 1):
        tpu_tensor.SYNC_EACH_COMPUTATION = True


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


# --------------------------------------------------------------------- the mesh


def init_mesh(shape: Sequence[int] | int, axis_names: Sequence[str] | str) -> Mesh:
    """A mesh over every JAX device of every process, `shape` laid over `axis_names`
    (e.g. `init_mesh((4, 2), ("data", "model"))`); it becomes the default mesh of this
    package. A -1 in `shape` takes the remaining devices. Joins the launcher's
    multi-process run first if the environment describes one."""
    initialize_from_env()
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if len(shape) != len(axis_names):
        raise ValueError(
            f"init_mesh: shape {shape} has {len(shape)} axes but axis_names {axis_names} names {len(axis_names)}"
        )
    count = jax.device_count()
    if shape.count(-1) == 1:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(count // known if s == -1 else s for s in shape)
    if math.prod(shape) != count:
        raise ValueError(
            f"init_mesh: a {'x'.join(map(str, shape))} mesh needs {math.prod(shape)} devices, but JAX sees {count} "
            f"({jax.process_count()} process(es), {jax.local_device_count()} local device(s) each). On CPU set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts, or launch more processes."
        )
    # Auto axes: shardings propagate through every op (GSPMD), as the op path needs.
    mesh = jax.make_mesh(shape, axis_names, axis_types=(AxisType.Auto,) * len(shape))
    set_mesh(mesh)
    return mesh


def set_mesh(mesh: Mesh | None) -> None:
    global _MESH
    _MESH = mesh
    _settle_cpu_collectives(mesh)
    split_kernels_over(mesh)


def split_kernels_over(mesh: Mesh | None, model_axis: str | None = None) -> None:
    """The Pallas kernels' calls run per shard of `mesh` (`kernels.sharded`; XLA cannot
    partition a Mosaic kernel): heads and vocabulary over `model_axis` (the
    tensor-parallel axis, set by `parallelize_module`), batch and rows over the others."""
    from kernels.sharded import KernelMesh, set_default

    batch = () if mesh is None else tuple(a for a in mesh.axis_names if a != model_axis)
    set_default(None if mesh is None else KernelMesh(mesh, batch, model_axis))


def get_mesh(mesh: Mesh | None = None) -> Mesh:
    """`mesh` if given, else the one `init_mesh` made; a clear error when there is none."""
    if mesh is not None:
        _settle_cpu_collectives(mesh)
        return mesh
    if _MESH is None:
        raise RuntimeError("no device mesh: call tpu_backend.distributed.init_mesh(shape, axis_names) first")
    return _MESH


# --------------------------------------------------------------------- placements


@dataclass(frozen=True)
class Shard:
    """Split tensor dimension `dim` over a mesh axis (DTensor's `Shard`)."""

    dim: int


@dataclass(frozen=True)
class Replicate:
    """A full copy on every device along a mesh axis (DTensor's `Replicate`)."""


Placement = Shard | Replicate


def partition_spec(placements: Sequence[Placement], mesh: Mesh, ndim: int) -> PartitionSpec:
    """DTensor placements (one per mesh axis) -> a JAX PartitionSpec over `ndim` dims."""
    if len(placements) != len(mesh.axis_names):
        raise ValueError(
            f"{len(placements)} placement(s) {list(placements)} for a mesh with axes {mesh.axis_names}: give one per axis"
        )
    per_dim: list[list[str]] = [[] for _ in range(ndim)]
    for axis, placement in zip(mesh.axis_names, placements):
        if isinstance(placement, Shard):
            dim = placement.dim + ndim if placement.dim < 0 else placement.dim
            if not 0 <= dim < ndim:
                raise ValueError(f"Shard({placement.dim}) on mesh axis {axis!r}: the tensor has {ndim} dim(s)")
            per_dim[dim].append(axis)
        elif not isinstance(placement, Replicate):
            raise TypeError(f"placement {placement!r}: use Shard(dim) or Replicate()")
    entries = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in per_dim]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


@functools.lru_cache(maxsize=None)
def _resharder(sharding: NamedSharding):
    # A jit whose only job is its output sharding: outside a trace it moves the data,
    # inside fused mode's step graph it is a sharding constraint.
    return jax.jit(lambda array: array, out_shardings=sharding)


def place(t: torch.Tensor, sharding: NamedSharding) -> torch.Tensor:
    """Give tpu tensor `t`'s data this sharding, in place (the tensor object, its views
    and autograd identity are unchanged). `t` must own its whole storage (parameters,
    buffers, gradients and optimizer state do)."""
    if not tpu_tensor.is_tpu(t):
        raise ValueError(
            f"place: expected a tpu tensor, got a {t.device} tensor of shape {tuple(t.shape)}; move it with .to('tpu')"
        )
    payload = tpu_tensor.payload_of(t)
    if not (t.storage_offset() == 0 and t.is_contiguous() and t.numel() == payload.numel):
        raise ValueError(f"place: a view of shape {tuple(t.shape)} cannot be re-sharded alone; place its base tensor")
    current = tpu_tensor.read(t, payload)
    if getattr(current, "sharding", None) == sharding:
        return t
    tpu_tensor.write(t, tpu_tensor.apply(("reshard", sharding), _resharder(sharding), current))
    return t


def distribute_tensor(
    t: torch.Tensor, mesh: Mesh | None = None, placements: Sequence[Placement] | None = None
) -> torch.Tensor:
    """Place tpu tensor `t` over `mesh` by DTensor placements (default: replicated), in place."""
    mesh = get_mesh(mesh)
    placements = placements or [Replicate()] * len(mesh.axis_names)
    spec = partition_spec(placements, mesh, t.dim())
    for dim, axes in enumerate(spec):
        if axes is None:
            continue
        parts = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
        if t.shape[dim] % parts:
            raise ValueError(
                f"cannot split dim {dim} (size {t.shape[dim]}) of a tensor of shape {tuple(t.shape)} over mesh "
                f"axes {axes} ({parts} devices): the size must be a multiple of {parts}; replicate it or pick another dim"
            )
    return place(t, NamedSharding(mesh, spec))


def sharding_of(t: torch.Tensor):
    """The JAX sharding of tpu tensor `t`'s data (runs fused mode's pending graph)."""
    return tpu_tensor.concrete(tpu_tensor.read(t)).sharding


def shard_from_process_data(local: torch.Tensor, sharding: NamedSharding) -> torch.Tensor:
    """A tpu tensor over the mesh whose global value is the concatenation (along the
    sharded dims) of every process's `local` part. With one process `local` is the whole
    value. CPU or tpu input."""
    value = tpu_tensor.to_numpy(tpu_tensor.read(local)) if tpu_tensor.is_tpu(local) else _cpu_numpy(local)
    if jax.process_count() == 1:
        array = jax.device_put(value, sharding)
    else:
        array = jax.make_array_from_process_local_data(sharding, value)
    return tpu_tensor.wrap(array)


def _cpu_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jax.numpy.bfloat16)
    return t.numpy()


def bytes_per_device(tensors) -> dict[int, int]:
    """Bytes each device holds for these tpu tensors, read from their arrays' shardings
    (device id -> bytes; addressable devices of this process)."""
    per_device: dict[int, int] = {}
    for t in tensors:
        array = tpu_tensor.concrete(tpu_tensor.read(t))
        for shard in array.addressable_shards:
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
    return per_device


# --------------------------------------------------------------------- batches


def batch_sharding(mesh: Mesh, axes: Sequence[str], ndim: int) -> NamedSharding:
    """Dim 0 split over `axes` (together), the other dims whole."""
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ValueError(f"batch axes {missing} are not axes of the mesh {dict(mesh.shape)}")
    lead = axes[0] if len(axes) == 1 else tuple(axes)
    return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))) if ndim else PartitionSpec())


def shard_batch(t, mesh: Mesh | None = None, axes: Sequence[str] | str | None = None):
    """A batch tensor (inputs, targets) as a tpu tensor split along dim 0 over the mesh
    axes `axes` (default: the mesh's first axis). Each process passes its own part of
    the global batch (like DistributedSampler with DDP); with one process, the whole
    batch. Anything that is not a tensor, or requires grad, is returned as is."""
    if not isinstance(t, torch.Tensor) or t.requires_grad:
        return t  # (a tensor in an autograd graph is an activation, not a batch)
    mesh = get_mesh(mesh)
    axes = (mesh.axis_names[0],) if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    if t.dim() == 0:
        return t.to("tpu")
    sharding = batch_sharding(mesh, axes, t.dim())
    if tpu_tensor.is_tpu(t):
        value = tpu_tensor.read(t)
        if getattr(value, "sharding", None) == sharding:
            return t
        if jax.process_count() == 1 or not getattr(value, "is_fully_addressable", False):
            _check_divisible(t, mesh, axes)  # already a global value: move it to the batch sharding
            return tpu_tensor.wrap(tpu_tensor.apply(("reshard", sharding), _resharder(sharding), value))
    elif jax.process_count() == 1:
        _check_divisible(t, mesh, axes)
    return shard_from_process_data(t, sharding)  # this process's part of the batch


def _check_divisible(t: torch.Tensor, mesh: Mesh, axes: Sequence[str]) -> None:
    devices = math.prod(mesh.shape[a] for a in axes)
    if t.shape[0] % devices:
        raise ValueError(
            f"a batch of {t.shape[0]} (dim 0 of a tensor of shape {tuple(t.shape)}) cannot be split evenly "
            f"over mesh axes {axes} ({devices} devices): use a multiple of {devices}"
        )
