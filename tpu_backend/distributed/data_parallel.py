"""Data parallelism on a mesh: `DataParallel`, DistributedDataParallel's role for SPMD.

Parameters and buffers are replicated over the mesh; each batch is split along dim 0
over the batch axes. The ordinary op path then computes every op on every device's
slice, and the weight gradients (a contraction over the sharded batch dimension) come
out of XLA already all-reduced, so `loss.backward(); optimizer.step()` is unchanged.

Why a wrapper and not a `torch.distributed` process group named "tpu": a process group
serves code that owns one device per process and calls collectives itself (DDP's
bucketed all-reduce, `dist.all_reduce`). Under JAX one process drives many chips and
XLA places the collectives, so a process group would have to fake one rank per chip
and copy gradients into explicit collectives, losing the compiler's placement. The
wrapper keeps the DDP user's habits (`model = DataParallel(model)`, `model.module`,
per-process batches, same `state_dict` keys as DDP) and the same script runs with one
process or many (`python -m tpu_backend.launch`).
"""

from __future__ import annotations

from typing import Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torch import nn
from torch.utils._pytree import tree_map

from tpu_backend.distributed.mesh import get_mesh, place, shard_batch


def replicate_module(module: nn.Module, mesh: Mesh) -> None:
    """Every parameter and buffer of `module` (already on tpu) replicated over `mesh`."""
    replicated = NamedSharding(mesh, PartitionSpec())
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.device.type != "tpu":
            raise ValueError(f"{name} is on {t.device}: move the module to the device first (module.to('tpu'))")
        place(t, replicated)


class DataParallel(nn.Module):
    """Wrap a tpu module for data-parallel training over `mesh` (default: the mesh
    `init_mesh` made). Tensor arguments of `forward` are split along dim 0 over
    `batch_axes` (default: the mesh's first axis); split targets the same way with
    `shard_batch(target)`. Each process passes its own part of the global batch."""

    def __init__(self, module: nn.Module, mesh: Mesh | None = None, batch_axes: Sequence[str] | str | None = None):
        super().__init__()
        self.module = module
        self.mesh = get_mesh(mesh)
        names = self.mesh.axis_names
        self.batch_axes = (
            (names[0],) if batch_axes is None else (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
        )
        replicate_module(module, self.mesh)

    def shard_batch(self, t):
        """A batch tensor split over this wrapper's batch axes (use it for targets)."""
        return shard_batch(t, self.mesh, self.batch_axes)

    def forward(self, *args, **kwargs):
        args, kwargs = tree_map(self.shard_batch, (args, kwargs))
        return self.module(*args, **kwargs)
