"""The "tpu" backend of `torch.distributed`: one process per chip, collectives as JAX programs.

    import tpu_backend, torch.distributed as dist
    dist.init_process_group("tpu")        # in every process of a torchrun launch
    dist.all_reduce(torch.ones(4, device="tpu"))

`init_process_group("tpu")` (or no backend: "tpu" is registered as the default for tpu
tensors) joins every process to one JAX runtime with `jax.distributed.initialize`: torch's
store carries the coordinator address that rank 0 picked, so any launcher that sets
torch's environment (`torchrun`, `python -m torch.distributed.run`, `tpu_backend.launch`,
SLURM scripts) works. Torch rank r is JAX process r, and the group's collectives are
`jax.shard_map` programs over a mesh of the group's devices (one per process, in group
rank order): `psum`/`pmax`/`pmin`, `all_gather`, `psum_scatter`, `all_to_all`,
`ppermute`. On a TPU pod they ride the chips' interconnect; on CPU they run through XLA's
gloo CPU collectives (JAX's default multi-process CPU collectives in jax 0.10.2).

The group is a Python `dist.ProcessGroup` (the only process-group type torch lets Python
extend); torch gives it its name, so `init_device_mesh("tpu", ...)`, DTensor,
`fully_shard`, DDP and the functional collectives (`torch.compile` graphs) find it like
any other group. It serves CPU tensors too (same JAX programs), so DeviceMesh's and DCP's
CPU-side exchanges need no second backend. Work is synchronous: each call returns a
completed `Work` (XLA orders a device's programs; on CPU every program is waited for,
`tensor.SYNC_EACH_COMPUTATION`, so two processes never interleave collectives).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import socket
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpu_backend import tensor as tpu_tensor
from tpu_backend._registration import DEVICE_NAME
from tpu_backend.distributed import _fsdp_support
from tpu_backend.distributed import mesh as tpu_mesh

BACKEND_NAME = "tpu"
_COORDINATOR_KEY = "tpu_backend/jax_coordinator"
_AXIS = "ranks"


# --------------------------------------------------------------------- joining the JAX runtime


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _join_jax(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """Start `jax.distributed` with torch's world: rank 0 hosts the coordinator on
    MASTER_ADDR at a free port (TPU_JAX_COORDINATOR_PORT to pin one) and publishes it
    through the store every rank already shares."""
    if jax.distributed.is_initialized():
        if (jax.process_index(), jax.process_count()) != (rank, world_size):
            raise RuntimeError(
                f'init_process_group("tpu"): this process is JAX process {jax.process_index()} of '
                f"{jax.process_count()}, but torch rank {rank} of {world_size}; start both from one launcher"
            )
        return
    if world_size == 1:
        return  # one process: nothing to join, JAX's local device is the group
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("TPU_JAX_COORDINATOR_PORT") or _free_port(host))
        store.set(_COORDINATOR_KEY, f"{host}:{port}")
    coordinator = store.get(_COORDINATOR_KEY).decode()
    local_device_ids = None
    if os.environ.get("TPU_ONE_CHIP_PER_PROCESS", "1") == "1" and _has_several_accelerators():
        local_device_ids = [int(os.environ.get("LOCAL_RANK", "0"))]  # a TPU host: this process's chip
    tpu_mesh.join_jax(
        coordinator,
        world_size,
        rank,
        bind_address=coordinator if rank == 0 else None,
        init_timeout=int(timeout.total_seconds()),
        local_device_ids=local_device_ids,
    )


def _has_several_accelerators() -> bool:
    platforms = os.environ.get("JAX_PLATFORMS", "")
    return bool(platforms) and "cpu" not in platforms.split(",") and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1


def _device_of(process: int) -> jax.Device:
    if process == jax.process_index():
        return jax.local_devices()[0]
    return min((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


# --------------------------------------------------------------------- torch <-> JAX


def _to_jax(t: torch.Tensor) -> jax.Array:
    if tpu_tensor.is_tpu(t):
        tpu_tensor.flush()
        return tpu_tensor.concrete(tpu_tensor.read(t))
    if t.device.type != "cpu":
        raise TypeError(f'the "tpu" process group takes tpu and cpu tensors, not {t.device} ones')
    return tpu_tensor.cpu_to_jax(t)


def _store(t: torch.Tensor, value: jax.Array) -> None:
    """Write a collective's result into `t` (in place, like every torch backend)."""
    if tpu_tensor.is_tpu(t):
        tpu_tensor.write(t, value)
    else:
        t.copy_(tpu_tensor.numpy_to_torch(np.asarray(value), t.dtype).reshape(t.shape))


# --------------------------------------------------------------------- the JAX programs


def _reduce_stack(stack: jax.Array, op: str) -> jax.Array:
    """Reduce a gathered (ranks, ...) stack over its first axis."""
    if op == "sum":
        return jnp.any(stack, 0) if stack.dtype == jnp.bool_ else jnp.sum(stack, 0, dtype=stack.dtype)
    if op == "avg":
        return (jnp.sum(stack, 0) / stack.shape[0]).astype(stack.dtype)
    if op == "product":
        return jnp.all(stack, 0) if stack.dtype == jnp.bool_ else jnp.prod(stack, 0, dtype=stack.dtype)
    if op == "max":
        return jnp.max(stack, 0)
    if op == "min":
        return jnp.min(stack, 0)
    reducer = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[op]
    return functools.reduce(reducer, list(stack))


def _all_reduce(block: jax.Array, op: str, size: int) -> jax.Array:
    x = block[0]
    if x.dtype != jnp.bool_:  # the interconnect's native reductions
        if op == "sum":
            return jax.lax.psum(x, _AXIS)[None]
        if op == "avg" and jnp.issubdtype(x.dtype, jnp.floating):
            return (jax.lax.psum(x, _AXIS) / size).astype(x.dtype)[None]
        if op == "max":
            return jax.lax.pmax(x, _AXIS)[None]
        if op == "min":
            return jax.lax.pmin(x, _AXIS)[None]
    return _reduce_stack(jax.lax.all_gather(x, _AXIS), op)[None]


def _all_gather(block: jax.Array) -> jax.Array:
    return jax.lax.all_gather(block[0], _AXIS)[None]


def _reduce_scatter(block: jax.Array, op: str, size: int) -> jax.Array:
    """block[0]: (ranks, *out) chunks, chunk j for rank j; returns this rank's reduced chunk."""
    x = block[0]
    if op == "sum" and x.dtype != jnp.bool_:
        return jax.lax.psum_scatter(x, _AXIS, scatter_dimension=0, tiled=False)[None]
    if op == "avg" and jnp.issubdtype(x.dtype, jnp.floating):
        return (jax.lax.psum_scatter(x, _AXIS, scatter_dimension=0, tiled=False) / size).astype(x.dtype)[None]
    reduced = _reduce_stack(jax.lax.all_gather(x, _AXIS), op)  # (ranks, *out)
    return jax.lax.dynamic_index_in_dim(reduced, jax.lax.axis_index(_AXIS), 0, keepdims=True)


def _broadcast(block: jax.Array, root: int) -> jax.Array:
    return jax.lax.all_gather(block[0], _AXIS)[root][None]


def _all_to_all(block: jax.Array) -> jax.Array:
    """block[0]: (ranks, *chunk), chunk j for rank j; returns the chunks received, by source."""
    return jax.lax.all_to_all(block[0], _AXIS, split_axis=0, concat_axis=0, tiled=False)[None]


def _send_recv(block: jax.Array, source: int, target: int) -> jax.Array:
    return jax.lax.ppermute(block, _AXIS, [(source, target)])


@functools.lru_cache(maxsize=1024)
def _program(processes: tuple[int, ...], name: str, static: tuple):
    """One jitted SPMD program over the mesh of `processes`' devices (cached: the key is
    every static fact, shapes and dtypes are left to jit's own cache)."""
    mesh = Mesh(np.array([_device_of(p) for p in processes]), (_AXIS,))
    body = {
        "all_reduce": _all_reduce,
        "all_gather": _all_gather,
        "reduce_scatter": _reduce_scatter,
        "broadcast": _broadcast,
        "all_to_all": _all_to_all,
        "send_recv": _send_recv,
    }[name]
    spec = PartitionSpec(_AXIS)
    fn = jax.shard_map(functools.partial(body, **dict(static)), mesh=mesh, in_specs=spec, out_specs=spec)
    return mesh, jax.jit(fn)


def _run(processes: tuple[int, ...], name: str, local: jax.Array, timeout: float | None = None, **static) -> jax.Array:
    """Run collective `name` over `processes`, this process contributing `local`; returns
    this process's part of the result. Past `timeout` seconds the watchdog ends the process."""
    mesh, fn = _program(processes, name, tuple(sorted(static.items())))
    me = jax.local_devices()[0]
    piece = jax.device_put(local[None], me)
    stacked = jax.make_array_from_single_device_arrays(
        (len(processes), *local.shape), NamedSharding(mesh, PartitionSpec(_AXIS)), [piece]
    )
    what = f"{name} over processes {list(processes)}"
    with _WATCHDOG.watch(what, timeout):
        try:
            out = fn(stacked)
            return jax.block_until_ready(out.addressable_shards[0].data[0])
        except Exception as error:  # XLA's collectives report a vanished peer as a runtime error
            _exit_without_jax_shutdown()
            raise dist.DistBackendError(
                f"ProcessGroupTPU: collective {what} failed, most likely because a peer process died: {error}"
            ) from error


def _exit_without_jax_shutdown() -> None:
    """After a failed collective, JAX's exit handler would wait for the dead peer at its
    shutdown barrier (the process then hangs until killed): leave before it runs."""

    def leave():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    atexit.register(leave)  # atexit runs last-registered first: before JAX's shutdown


# --------------------------------------------------------------------- the watchdog

COLLECTIVE_TIMEOUT_EXIT_CODE = 124


class _Watchdog:
    """Ends the process when a collective outlives its group's timeout.

    A collective whose peer died never returns: the XLA program waits in C++ for data
    that will not come (JAX notices a dead peer only at its heartbeat timeout, 100 s by
    default, and then aborts). Like NCCL's watchdog, this thread stops the process at the
    timeout given to `init_process_group`/`new_group`, naming the collective, so the
    launcher reports it and the job ends. One thread checks a deadline once a second;
    a collective costs one attribute write on each side."""

    def __init__(self):
        self._current: tuple[str, float, float] | None = None
        self._thread = None

    @contextlib.contextmanager
    def watch(self, what: str, timeout: float | None):
        if timeout is None:
            yield
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tpu-collective-watchdog", daemon=True)
            self._thread.start()
        self._current = (what, time.monotonic() + timeout, timeout)
        try:
            yield
        finally:
            self._current = None

    def _loop(self) -> None:
        while True:
            time.sleep(0.5)
            current = self._current
            if current is not None and time.monotonic() > current[1]:
                what, _, timeout = current
                sys.stderr.write(
                    f"ProcessGroupTPU: rank {os.environ.get('RANK', '?')}: collective {what} did not finish within "
                    f"the group's timeout ({timeout:g} s): a peer died or the ranks issued different collectives. "
                    f"Stopping this process (exit code {COLLECTIVE_TIMEOUT_EXIT_CODE}).\n"
                )
                sys.stderr.flush()
                os._exit(COLLECTIVE_TIMEOUT_EXIT_CODE)


_WATCHDOG = _Watchdog()


# --------------------------------------------------------------------- the process group

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _reduce_op(op) -> str:
    kind = op.op if isinstance(op, dist.ReduceOp) else op
    try:
        return _REDUCE_OPS[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f'the "tpu" process group does not support ReduceOp {op}: use SUM, AVG, PRODUCT, MAX, MIN, BAND, BOR '
            "or BXOR (PREMUL_SUM: multiply first, then SUM)"
        ) from None


class _DoneWork(dist._Work):
    """A finished collective (every call runs to completion before it returns)."""

    def __init__(self, result=None):
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._future


class ProcessGroupTPU(dist.ProcessGroup):
    """A torch.distributed group whose collectives are JAX programs over its processes' devices."""

    def __init__(self, rank: int, size: int, global_ranks: list[int], timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._processes = tuple(global_ranks)
        self._timeout_s = timeout.total_seconds() if timeout else None
        self._name = self._desc = ""

    # -- identity. torch keeps a group's name in its C++ backends, and a Python group has
    # none ("ProcessGroup name not set" from init_device_mesh): keep name and description here.

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroupTPU: the group has no name yet (torch names it in init_process_group)")
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"ProcessGroupTPU(rank={self.rank()}, size={self.size()}, processes={list(self._processes)})"

    def _collective(self, name: str, local: jax.Array, **static) -> jax.Array:
        return _run(self._processes, name, local, self._timeout_s, **static)

    # -- all-reduce

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            _store(t, self._collective("all_reduce", _to_jax(t), op=op, size=self.size()))
        return _DoneWork(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op, root = _reduce_op(opts.reduceOp), opts.rootRank
        for t in tensors:
            value = self._collective("all_reduce", _to_jax(t), op=op, size=self.size())
            if self.rank() == root:
                _store(t, value)
        return _DoneWork(tensors)

    # -- gathers

    def _gather_rows(self, t: torch.Tensor) -> jax.Array:
        return self._collective("all_gather", _to_jax(t))  # (size, *t.shape)

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, t in zip(output_lists, inputs, strict=True):
            self._check_count("all_gather", outputs)
            rows = self._gather_rows(t)
            for i, out in enumerate(outputs):
                _store(out, rows[i])
        return _DoneWork(output_lists)

    def all_gather_single(self, output, input, opts=None):
        rows = self._gather_rows(input)
        if output.numel() != rows.size:
            raise ValueError(
                f"all_gather_into_tensor: output has {output.numel()} elements, needs {rows.size} "
                f"({self.size()} x input {tuple(input.shape)})"
            )
        _store(output, rows.reshape(output.shape))
        return _DoneWork([output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs, strict=True):
            self.all_gather_single(out, t, opts)
        return _DoneWork(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def gather(self, output_lists, inputs, opts):
        for t in inputs:
            rows = self._gather_rows(t)
            if self.rank() == opts.rootRank:
                for i, out in enumerate(output_lists[0]):
                    _store(out, rows[i])
        return _DoneWork(output_lists)

    # -- reduce-scatter

    def _reduce_scatter_chunks(self, chunks: jax.Array, op: str) -> jax.Array:
        return self._collective("reduce_scatter", chunks, op=op, size=self.size())

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for out, chunks in zip(outputs, input_lists, strict=True):
            self._check_count("reduce_scatter", chunks)
            stacked = jnp.stack([_to_jax(c).reshape(out.shape) for c in chunks])
            _store(out, self._reduce_scatter_chunks(stacked, op))
        return _DoneWork(outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, needs {self.size()} x output "
                f"{tuple(output.shape)} = {output.numel() * self.size()}"
            )
        stacked = _to_jax(input).reshape(self.size(), *output.shape)
        _store(output, self._reduce_scatter_chunks(stacked, op))
        return _DoneWork([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, t, opts)
        return _DoneWork(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def scatter(self, outputs, input_lists, opts):
        root = opts.rootRank
        for i, out in enumerate(outputs):
            if self.rank() == root:
                self._check_count("scatter", input_lists[i])
                stacked = jnp.stack([_to_jax(c) for c in input_lists[i]])
            else:
                stacked = jnp.zeros((self.size(), *out.shape), _to_jax(out).dtype)
            rows = self._collective("broadcast", stacked, root=root)
            _store(out, rows[self.rank()])
        return _DoneWork(outputs)

    # -- broadcast

    def broadcast(self, tensors, opts):
        for t in tensors:
            _store(t, self._collective("broadcast", _to_jax(t), root=opts.rootRank))
        return _DoneWork(tensors)

    # -- all-to-all

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        size = self.size()
        local = _to_jax(input)
        if not input_split_sizes and not output_split_sizes:  # even split along dim 0
            chunks = local.reshape(size, local.shape[0] // size, *local.shape[1:])
            received = self._collective("all_to_all", chunks)
            _store(output, received.reshape(output.shape))
            return _DoneWork([output])
        sends = list(input_split_sizes) or [local.shape[0] // size] * size
        receives = list(output_split_sizes) or [output.shape[0] // size] * size
        # Uneven chunks: pad every chunk to the longest any rank sends, exchange, trim.
        longest = int(self._collective("all_reduce", jnp.asarray(max(sends), jnp.int64), op="max", size=size))
        starts = np.cumsum([0, *sends])
        padded = jnp.stack(
            [
                jnp.pad(local[starts[j] : starts[j + 1]], [(0, longest - sends[j])] + [(0, 0)] * (local.ndim - 1))
                for j in range(size)
            ]
        )
        received = self._collective("all_to_all", padded)
        _store(output, jnp.concatenate([received[j, : receives[j]] for j in range(size)]))
        return _DoneWork([output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        self._check_count("all_to_all", inputs)
        shapes = {tuple(t.shape) for t in inputs} | {tuple(t.shape) for t in outputs}
        if len(shapes) == 1:
            received = self._collective("all_to_all", jnp.stack([_to_jax(t) for t in inputs]))
            for j, out in enumerate(outputs):
                _store(out, received[j])
            return _DoneWork(outputs)
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype, device=outputs[0].device)
        self.all_to_all_single(flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs])
        for out, piece in zip(outputs, flat_out.split([t.numel() for t in outputs]), strict=True):
            out.copy_(piece.reshape(out.shape))
        return _DoneWork(outputs)

    # -- barrier and point to point

    def barrier(self, opts=None):
        self._collective("all_reduce", jnp.zeros((), jnp.int32), op="sum", size=self.size())
        return _DoneWork([])

    def _pair(self, tensors, peer: int, sending: bool):
        """send/recv as a two-device program (sender and receiver run the same one)."""
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{'send' if sending else 'recv'}: peer rank {peer} is not another rank of this group")
        me, other = self._processes[self.rank()], self._processes[peer]
        pair = tuple(sorted((me, other)))
        source, target = (pair.index(me), pair.index(other)) if sending else (pair.index(other), pair.index(me))
        for t in tensors:
            value = _run(pair, "send_recv", _to_jax(t)[None], self._timeout_s, source=source, target=target)[0]
            if not sending:
                _store(t, value)
        return _DoneWork(tensors)

    def send(self, tensors, dst, tag=0):
        return self._pair(tensors, dst, sending=True)

    def recv(self, tensors, src, tag=0):
        return self._pair(tensors, src, sending=False)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError(
            'recv from any source is not supported by the "tpu" process group: XLA programs name both ends; pass src'
        )

    def _check_count(self, what: str, tensors) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"{what}: {len(tensors)} tensors given, the group has {self.size()} ranks")


# --------------------------------------------------------------------- registration


def _create(backend_options: dist.distributed_c10d._DistributedBackendOptions, _options=None) -> ProcessGroupTPU:
    ranks = list(backend_options.global_ranks_in_group) or list(range(backend_options.group_size))
    _fsdp_support.patch_fsdp()  # FSDP2 resizes parameter storages
    if not jax.distributed.is_initialized():
        # The default group (the whole world) arrives first: join JAX's runtime with it.
        _join_jax(
            backend_options.store, backend_options.group_rank, backend_options.group_size, backend_options.timeout
        )
    return ProcessGroupTPU(backend_options.group_rank, backend_options.group_size, ranks, backend_options.timeout)


def register() -> None:
    """Make "tpu" a torch.distributed backend, and the default one for tpu tensors."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[DEVICE_NAME, "cpu"])


__all__ = ["BACKEND_NAME", "ProcessGroupTPU", "register"]
