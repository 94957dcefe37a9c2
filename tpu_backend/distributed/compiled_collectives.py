"""Functional collectives inside `torch.compile(backend="tpu")` graphs.

Dynamo keeps `torch.distributed._functional_collectives` (what DTensor, tensor parallel
and FSDP2's compiled paths call) in the graph as `_c10d_functional.*` ops. Outside a
graph they reach the "tpu" process group through torch's C++ kernels; inside one, the
graph is a single-device `jax.jit` program, so each collective is a host callback
(`jax.pure_callback`) that runs the group's own collective program over the processes
(`process_group._run`) and hands the result back to the graph. The graph stays one
compiled program per process; the collectives run in graph order, which is the same in
every process (the graphs are the same).

These are "graph" lowerings: eager calls keep going through the process group directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from tpu_backend.distributed.process_group import ProcessGroupTPU
from tpu_backend.ops.registry import Lowering, register

funcol = torch.ops._c10d_functional


def _group(group_name: str):
    group = _resolve_process_group(group_name)
    if not isinstance(group, ProcessGroupTPU):
        raise TypeError(
            f"a compiled tpu graph runs a collective on group {group_name!r} of backend {group.getBackendName()!r}: "
            'tpu graphs need "tpu" groups (init_process_group("tpu"), init_device_mesh("tpu", ...))'
        )
    return group


def _callback(host_fn, shape, dtype, x):
    """`host_fn(numpy x) -> numpy` as a node of the traced graph."""
    return jax.pure_callback(
        lambda value: np.asarray(host_fn(jnp.asarray(value))), jax.ShapeDtypeStruct(shape, dtype), x
    )


def all_reduce(x, reduce_op: str, group_name: str):
    group = _group(group_name)
    op = reduce_op.lower()
    return _callback(lambda v: group._collective("all_reduce", v, op=op, size=group.size()), x.shape, x.dtype, x)


def all_gather_into_tensor(x, group_size: int, group_name: str):
    group = _group(group_name)
    shape = (group_size * x.shape[0], *x.shape[1:])
    return _callback(lambda v: group._collective("all_gather", v).reshape(shape), shape, x.dtype, x)


def reduce_scatter_tensor(x, reduce_op: str, group_size: int, group_name: str):
    group = _group(group_name)
    op = reduce_op.lower()
    shape = (x.shape[0] // group_size, *x.shape[1:])

    def host(v):
        return group._collective("reduce_scatter", v.reshape(group_size, *shape), op=op, size=group_size)

    return _callback(host, shape, x.dtype, x)


def all_to_all_single(x, output_split_sizes, input_split_sizes, group_name: str):
    group = _group(group_name)
    size = group.size()
    if output_split_sizes or input_split_sizes:
        if len(set(output_split_sizes)) > 1 or len(set(input_split_sizes)) > 1:
            raise NotImplementedError(
                "all_to_all_single with uneven splits inside a compiled tpu graph: run it eagerly (outside torch.compile)"
            )
    shape = (sum(output_split_sizes), *x.shape[1:]) if output_split_sizes else x.shape

    def host(v):
        chunks = v.reshape(size, v.shape[0] // size, *v.shape[1:])
        return group._collective("all_to_all", chunks).reshape(shape)

    return _callback(host, shape, x.dtype, x)


def broadcast(x, src: int, group_name: str):
    group = _group(group_name)
    root = group._processes.index(src) if src in group._processes else src
    return _callback(lambda v: group._collective("broadcast", v, root=root), x.shape, x.dtype, x)


def wait_tensor(x):
    return x  # the callback has already finished


def register_all() -> None:
    for target, fn in (
        (funcol.all_reduce.default, all_reduce),
        (funcol.all_gather_into_tensor.default, all_gather_into_tensor),
        (funcol.reduce_scatter_tensor.default, reduce_scatter_tensor),
        (funcol.all_to_all_single.default, all_to_all_single),
        (funcol.broadcast.default, broadcast),
        (funcol.wait_tensor.default, wait_tensor),
    ):
        register(target, Lowering(fn, kind="graph"))
