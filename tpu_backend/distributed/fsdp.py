"""FSDP-style sharding (`fully_shard`): parameters, gradients and optimizer state split
over one mesh axis, so each device stores 1/N of the training state.

Each parameter is split along one dimension (the first one the axis size divides;
parameters with no such dimension stay replicated and are reported by
`unsharded_parameters`). Compute needs no code of its own: every op is a `jax.jit`
over sharded inputs and XLA gathers what the op needs for that op only (the per-layer
all-gather of FSDP) and frees it after.

What XLA does not decide for us is where *stored* results live: a weight gradient or a
fresh optimizer state (`zeros_like`) may come out replicated. Two hooks put them back:
a post-accumulate-grad hook on each parameter re-shards its `.grad`, and an
optimizer step post-hook (installed once, for every optimizer) re-shards state tensors
shaped like their parameter. In-place updates keep those shardings afterwards (XLA
propagates the operands' sharding to the result).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._pytree import tree_map

from tpu_backend.distributed.mesh import get_mesh, place, shard_batch

# The attribute that holds, on a parameter, the sharding its gradient and optimizer state must have.
_SHARDING_ATTR = "_tpu_training_sharding"
_STEP_HOOK = None  # the optimizer step post-hook, installed once for every optimizer


def _shard_dim(shape: Sequence[int], size: int) -> int | None:
    for dim, extent in enumerate(shape):
        if extent % size == 0 and extent >= size:
            return dim
    return None


def parameter_sharding(
    shape: Sequence[int], mesh: Mesh, axis: str, tensor_parallel: PartitionSpec | None = None
) -> NamedSharding:
    """Split the first dimension of `shape` that the axis size divides; else replicate.

    `tensor_parallel`: the parameter's spec on the other mesh axes (a tensor-parallel
    plan), kept; FSDP then takes the first dimension that plan leaves whole, or splits a
    planned dimension further (FSDP2 + TP's layout: 1/(fsdp x tp) of each parameter)."""
    if not tensor_parallel or all(entry is None for entry in tensor_parallel):
        dim = _shard_dim(shape, mesh.shape[axis])
        spec = PartitionSpec() if dim is None else PartitionSpec(*([None] * dim), axis)
        return NamedSharding(mesh, spec)
    entries = list(tensor_parallel) + [None] * (len(shape) - len(tensor_parallel))
    split = [math.prod(mesh.shape[a] for a in _axes(entry)) for entry in entries]
    free = [d for d, entry in enumerate(entries) if entry is None]
    dims = free + [d for d in range(len(shape)) if d not in free]
    for dim in dims:
        left = shape[dim] // split[dim]
        if left % mesh.shape[axis] == 0 and left >= mesh.shape[axis]:
            axes = _axes(entries[dim]) + (axis,)
            entries[dim] = axes[0] if len(axes) == 1 else axes
            break
    while entries and entries[-1] is None:
        entries.pop()
    return NamedSharding(mesh, PartitionSpec(*entries))


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def keep_training_state_sharded(param: torch.Tensor, sharding: NamedSharding) -> None:
    """From now on, `param.grad` and `param`'s optimizer state (tensors of its shape)
    are stored with `sharding`, like `param` itself. Used by fully_shard and
    parallelize_module."""
    global _STEP_HOOK
    if not hasattr(param, _SHARDING_ATTR) and param.requires_grad:
        param.register_post_accumulate_grad_hook(_reshard_grad)
    setattr(param, _SHARDING_ATTR, sharding)
    if _STEP_HOOK is None:
        _STEP_HOOK = register_optimizer_step_post_hook(_reshard_optimizer_state)


def _reshard_grad(param: torch.Tensor) -> None:
    sharding = getattr(param, _SHARDING_ATTR, None)
    if sharding is not None and param.grad is not None:
        place(param.grad, sharding)


def _reshard_optimizer_state(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    for param, state in optimizer.state.items():
        sharding = getattr(param, _SHARDING_ATTR, None)
        if sharding is None:
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.device.type == "tpu" and value.shape == param.shape:
                place(value, sharding)


def fully_shard(
    module: nn.Module,
    mesh: Mesh | None = None,
    axis: str | None = None,
    batch_axes: Sequence[str] | str | None = None,
) -> nn.Module:
    """Shard `module`'s parameters (already on tpu) over mesh axis `axis` (default: the
    mesh's first axis), in place, like `torch.distributed.fsdp.fully_shard`. Tensor
    arguments of `forward` are split along dim 0 over `batch_axes` (default: `axis`);
    split targets with `shard_batch`. Buffers are replicated. Returns `module`."""
    mesh = get_mesh(mesh)
    axis = mesh.axis_names[0] if axis is None else axis
    if axis not in mesh.axis_names:
        raise ValueError(f"fully_shard: axis {axis!r} is not an axis of the mesh {dict(mesh.shape)}")
    for name, param in module.named_parameters():
        if param.device.type != "tpu":
            raise ValueError(f"{name} is on {param.device}: move the module to the device first (module.to('tpu'))")
        sharding = parameter_sharding(param.shape, mesh, axis)
        place(param, sharding)
        keep_training_state_sharded(param, sharding)
    replicated = NamedSharding(mesh, PartitionSpec())
    for buffer in module.buffers():
        place(buffer, replicated)
    axes = (axis,) if batch_axes is None else (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    module.register_forward_pre_hook(
        lambda _module, args, kwargs: tree_map(lambda t: shard_batch(t, mesh, axes), (args, kwargs)), with_kwargs=True
    )
    return module


def unsharded_parameters(module: nn.Module) -> list[str]:
    """Names of `module`'s parameters `fully_shard` had to leave replicated."""
    return [
        name
        for name, p in module.named_parameters()
        if getattr(p, _SHARDING_ATTR, None) is not None and getattr(p, _SHARDING_ATTR).spec == PartitionSpec()
    ]
