"""Tensor parallelism by sharding annotations, after `torch.distributed.tensor.parallel`.

`parallelize_module(model, mesh, plan)` gives parameters DTensor-like placements over
one mesh axis; XLA's partitioner then splits each matmul and inserts the collectives
(the all-reduce after a row-parallel layer, the gathers around a column-parallel one).
The plan maps module names (`fnmatch` patterns over `named_modules()`, e.g.
`"blocks.*.mlp.0"`) to a style:

- `ColwiseParallel()`: a Linear's output features split (weight `Shard(0)`, bias
  `Shard(0)`); an Embedding's feature dim split (`Shard(1)`).
- `RowwiseParallel()`: a Linear's input features split (weight `Shard(1)`, bias
  replicated); an Embedding's rows (vocabulary) split (`Shard(0)`).
- `AttentionParallel()`: `nn.MultiheadAttention`: the fused q/k/v projection
  column-wise, the output projection row-wise (Megatron's attention split).
- `Placements(...)`: explicit placements for a parameter name (`"head.weight"`), one
  per mesh axis, for anything else.

Any plan is numerically the model's: sharding only decides where values live and which
collectives XLA adds. Gradients and optimizer state are kept with their parameter's
sharding (`fsdp.keep_training_state_sharded`). Combining with `fully_shard` on a 2-D mesh
is not supported yet: `parallelize_module` replicates what its plan does not name.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Mapping, Sequence

from jax.sharding import Mesh
from torch import nn

from tpu_backend.distributed.fsdp import keep_training_state_sharded
from tpu_backend.distributed.mesh import (
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
    get_mesh,
    sharding_of,
    split_kernels_over,
)


def _on_axis(mesh: Mesh, axis: str, placement: Placement) -> list[Placement]:
    """`placement` on mesh axis `axis`, Replicate() on the others."""
    return [placement if name == axis else Replicate() for name in mesh.axis_names]


class ParallelStyle:
    """How one module's parameters are placed over the tensor-parallel axis."""

    def placements(self, module: nn.Module, name: str) -> dict[str, Placement]:
        """Parameter name (relative to `module`) -> its placement on the tensor-parallel
        axis. Shapes only: `tpu_backend.aot` plans with modules on the meta device."""
        raise NotImplementedError

    def apply(self, module: nn.Module, mesh: Mesh, axis: str, name: str) -> None:
        for param_name, placement in self.placements(module, name).items():
            distribute_tensor(module.get_parameter(param_name), mesh, _on_axis(mesh, axis, placement))


def _linear_or_embedding(module: nn.Module, name: str, style: str) -> None:
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise TypeError(
            f"{style} applies to nn.Linear and nn.Embedding, but {name!r} is a {type(module).__name__}; "
            "use AttentionParallel() for nn.MultiheadAttention or Placements(...) on its parameters"
        )


class ColwiseParallel(ParallelStyle):
    def placements(self, module, name):
        _linear_or_embedding(module, name, "ColwiseParallel")
        out = {"weight": Shard(1 if isinstance(module, nn.Embedding) else 0)}
        if getattr(module, "bias", None) is not None:
            out["bias"] = Shard(0)
        return out


class RowwiseParallel(ParallelStyle):
    def placements(self, module, name):
        _linear_or_embedding(module, name, "RowwiseParallel")
        out = {"weight": Shard(0 if isinstance(module, nn.Embedding) else 1)}
        if getattr(module, "bias", None) is not None:
            out["bias"] = Replicate()
        return out


class AttentionParallel(ParallelStyle):
    def placements(self, module, name):
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"AttentionParallel applies to nn.MultiheadAttention, but {name!r} is a {type(module).__name__}"
            )
        if module.in_proj_weight is None:
            raise ValueError(f"{name!r}: AttentionParallel needs the fused in_proj_weight (kdim == vdim == embed_dim)")
        out = {"in_proj_weight": Shard(0)}
        if module.in_proj_bias is not None:
            out["in_proj_bias"] = Shard(0)
        rowwise = RowwiseParallel().placements(module.out_proj, f"{name}.out_proj")
        return {**out, **{f"out_proj.{k}": v for k, v in rowwise.items()}}


@dataclass(frozen=True)
class Placements:
    """Explicit placements (one per mesh axis) for the parameter a plan key names."""

    placements: tuple

    def __init__(self, *placements: Placement):
        object.__setattr__(self, "placements", tuple(placements))


def plan_placements(
    module: nn.Module, mesh: Mesh, plan: Mapping[str, ParallelStyle | Placements] | None, axis: str
) -> dict[str, list[Placement]]:
    """Parameter name -> its placements (one per mesh axis) under `plan`, for the
    parameters the plan names; reads only names and shapes (works on the meta device).
    Raises if a plan key matches nothing."""
    if axis not in mesh.axis_names:
        raise ValueError(f"parallelize_module: axis {axis!r} is not an axis of the mesh {dict(mesh.shape)}")
    modules = dict(module.named_modules())
    parameters = dict(module.named_parameters())
    placed: dict[str, list[Placement]] = {}
    for pattern, style in (plan or {}).items():
        if isinstance(style, Placements):
            names = fnmatch.filter(parameters, pattern)
            for name in names:
                placed[name] = list(style.placements)
        elif isinstance(style, ParallelStyle):
            names = fnmatch.filter(modules, pattern)
            for name in names:
                for param_name, placement in style.placements(modules[name], name).items():
                    placed[f"{name}.{param_name}" if name else param_name] = _on_axis(mesh, axis, placement)
        else:
            raise TypeError(
                f"plan[{pattern!r}] = {style!r}: use ColwiseParallel(), RowwiseParallel(), AttentionParallel() or Placements(...)"
            )
        if not names:
            kind = "parameter" if isinstance(style, Placements) else "module"
            raise ValueError(f"plan key {pattern!r} matches no {kind} of {type(module).__name__}")
    return placed


def parallelize_module(
    module: nn.Module,
    mesh: Mesh | None = None,
    plan: Mapping[str, ParallelStyle | Placements] | None = None,
    axis: str | None = None,
) -> nn.Module:
    """Place `module`'s parameters (already on tpu) by `plan` over mesh axis `axis`
    (default: the mesh's last axis); everything the plan does not name is replicated.
    Raises if a plan key matches nothing. Returns `module`."""
    mesh = get_mesh(mesh)
    axis = mesh.axis_names[-1] if axis is None else axis
    placed = plan_placements(module, mesh, plan, axis)
    split_kernels_over(mesh, axis)  # attention heads and the vocabulary follow the plan's axis
    for t in [*module.parameters(), *module.buffers()]:
        distribute_tensor(t, mesh)  # replicated unless the plan says otherwise
    for name, placements in placed.items():
        distribute_tensor(module.get_parameter(name), mesh, placements)
    for param in module.parameters():  # gradients and optimizer state follow the parameters
        keep_training_state_sharded(param, sharding_of(param))
    return module


def placements_of(module: nn.Module) -> dict[str, Sequence]:
    """Parameter name -> its PartitionSpec (what the plan did), for inspection."""
    return {name: sharding_of(p).spec for name, p in module.named_parameters()}
