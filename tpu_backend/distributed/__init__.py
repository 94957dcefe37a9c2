"""Training on many chips: a JAX device mesh under the "tpu" device.

    import tpu_backend.distributed as dist

    mesh = dist.init_mesh((8,), ("data",))          # every device of every process
    model = dist.DataParallel(model.to("tpu"))      # or fully_shard / parallelize_module
    loss = loss_fn(model(inputs), model.shard_batch(target))
    loss.backward(); optimizer.step()               # gradients all-reduced by XLA

A tpu tensor's data is a JAX array, and a JAX array carries a sharding over a mesh.
This package only decides those shardings (`mesh.py`); every op still runs through the
device's ordinary path as a `jax.jit`, which XLA partitions over the mesh, inserting the
collectives. The same script runs on one process with N devices, on N processes
started by `python -m tpu_backend.launch`, and on a TPU pod slice. Importing this package
joins the multi-process run the launcher describes in the environment, so import it
before creating tpu tensors.

| module | owns |
| --- | --- |
| `mesh.py` | `init_mesh`, joining a multi-process run, placements (`Shard`, `Replicate`), `distribute_tensor`, `shard_batch`, per-device bytes |
| `data_parallel.py` | `DataParallel` (the DDP role; see its docstring for why not a process group) |
| `fsdp.py` | `fully_shard`: parameters, gradients and optimizer state split over an axis |
| `tensor_parallel.py` | `parallelize_module` with `ColwiseParallel`, `RowwiseParallel`, `AttentionParallel`, `Placements` |
| `process_group.py` | the "tpu" `torch.distributed` backend (one process per chip: torchrun, DDP, FSDP2, DTensor) |
| `checkpoint.py` | `save_checkpoint` / `load_checkpoint`: one file per device shard, any mesh on restore |
"""

from tpu_backend.distributed.checkpoint import load_checkpoint, save_checkpoint
from tpu_backend.distributed.data_parallel import DataParallel
from tpu_backend.distributed.fsdp import fully_shard, unsharded_parameters
from tpu_backend.distributed.mesh import (
    Replicate,
    Shard,
    bytes_per_device,
    distribute_tensor,
    get_mesh,
    init_mesh,
    initialize_from_env,
    is_initialized,
    partition_spec,
    process_count,
    process_index,
    set_mesh,
    shard_batch,
    sharding_of,
)
from tpu_backend.distributed.tensor_parallel import (
    AttentionParallel,
    ColwiseParallel,
    Placements,
    RowwiseParallel,
    parallelize_module,
    placements_of,
)

# Under `python -m tpu_backend.launch` (or on a pod slice with TPU_AUTO_INITIALIZE=1) join the
# run now: JAX requires it before the first computation, i.e. before any tpu tensor exists.
initialize_from_env()

__all__ = [
    "AttentionParallel",
    "ColwiseParallel",
    "DataParallel",
    "Placements",
    "Replicate",
    "RowwiseParallel",
    "Shard",
    "bytes_per_device",
    "distribute_tensor",
    "fully_shard",
    "get_mesh",
    "init_mesh",
    "initialize_from_env",
    "is_initialized",
    "load_checkpoint",
    "parallelize_module",
    "partition_spec",
    "placements_of",
    "process_count",
    "process_index",
    "save_checkpoint",
    "set_mesh",
    "shard_batch",
    "sharding_of",
    "unsharded_parameters",
]
