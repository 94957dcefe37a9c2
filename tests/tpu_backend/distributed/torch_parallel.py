"""Train the example's Llama with PyTorch's own parallelism on the "tpu" backend; write
every rank's losses and the single-process reference's.

    python -m torch.distributed.run --nproc_per_node 4 tests/tpu_backend/distributed/torch_parallel.py \\
        --strategy fsdp_tp --out DIR [--save CKPT --save-after 5] [--load CKPT]

Strategies (all plain torch.distributed): `ddp` (DistributedDataParallel), `fsdp`
(`fully_shard` per block and the root), `tp` (TorchTitan's tensor + sequence parallel
plan over every rank), `fsdp_tp` (a (world / 2, 2) ("dp", "tp") mesh: FSDP2 over "dp",
TP over "tp"); several, comma-separated, run one after the other from the same initial
model. The global batch is the same in every strategy; each data-parallel rank
trains on its slice, so the mean of the ranks' losses is the full batch's loss. Every
rank also trains an unsharded copy alone (the reference) on the full batches.

`--save DIR --save-after K` writes a DCP checkpoint (model and optimizer state,
`torch.distributed.checkpoint.state_dict`) after step K; `--load DIR` restores one
before training and trains the steps after K, so its losses continue the reference's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import tpu_backend  # noqa: E402,F401  (registers the "tpu" backend)
from examples.llama_fsdp_tp import Llama, LlamaConfig, batches, loss_fn, parallelize  # noqa: E402

BATCH = 8  # divisible by every data-parallel degree used
LR = 1e-2


def train(model, optimizer, data, *, dp_group=None) -> list[float]:
    losses = []
    for inputs, targets in data:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs.to("tpu")), targets.to("tpu"))
        loss.backward()
        optimizer.step()
        value = loss.detach().clone()
        if dp_group is not None:
            dist.all_reduce(value, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(value.item())
    return losses


def local_numel(p: torch.Tensor) -> int:
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def local_slice(data, dp_rank: int, dp_size: int):
    rows = BATCH // dp_size
    return [(x[dp_rank * rows : (dp_rank + 1) * rows], y[dp_rank * rows : (dp_rank + 1) * rows]) for x, y in data]


def build(strategy: str, model: Llama, world: int):
    """The parallel model and its data-parallel group (None when every rank sees the full batch).
    `+compile` (torch.compile(backend="tpu") per block) and `+ac` (activation checkpointing
    per block) may follow an FSDP/TP strategy's name."""
    strategy, *extras = strategy.split("+")
    options = {"compile": "compile" in extras, "checkpointing": "ac" in extras}
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("dp",))
        return DistributedDataParallel(model), mesh["dp"]
    if strategy == "fsdp":
        mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("dp",))
        return parallelize(model, mesh, tp=False, fsdp=True, **options), mesh["dp"]
    if strategy == "tp":
        mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
        return parallelize(model, mesh, tp=True, fsdp=False, **options), None
    if strategy == "fsdp_tp":
        mesh = init_device_mesh("tpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        return parallelize(model, mesh, tp=True, fsdp=True, **options), mesh["dp"]
    raise ValueError(f"unknown strategy {strategy!r}: ddp, fsdp, tp or fsdp_tp")


def run(strategy: str, initial: Llama, data, world: int, args) -> dict:
    model, dp_group = build(strategy, copy.deepcopy(initial).to("tpu"), world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    start = 0
    if args.load:
        # Optimizer state exists only after a step: build it the way DCP expects, then load into it.
        state = dict(zip(("model", "optim"), get_state_dict(model, optimizer)))
        dcp.load(state, checkpoint_id=args.load)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = args.load_after
    dp_rank = dp_group.get_local_rank() if dp_group is not None else 0
    dp_size = dp_group.size() if dp_group is not None else 1
    local = local_slice(data, dp_rank, dp_size)
    group = dp_group.get_group() if dp_group is not None else None
    end = args.save_after if args.save else args.steps
    losses = train(model, optimizer, local[start:end], dp_group=group)
    if args.save:
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.save)
        losses += train(model, optimizer, local[end:], dp_group=group)
    return {
        "start": start,
        "losses": losses,
        "local_elements": sum(local_numel(p) for p in model.parameters()),  # less than the model when sharded
        "model_elements": sum(p.numel() for p in initial.parameters()),
        "placements": sorted({str(getattr(p, "placements", "plain")) for p in model.parameters()}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True, help="one or several, comma-separated")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save")
    parser.add_argument("--save-after", type=int, default=5)
    parser.add_argument("--load")
    parser.add_argument("--load-after", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = LlamaConfig()
    torch.manual_seed(0)
    initial = Llama(config)
    data = batches(config, args.steps, BATCH)

    reference = copy.deepcopy(initial).to("tpu")
    reference_losses = train(reference, torch.optim.AdamW(reference.parameters(), lr=LR), data)

    runs = {strategy: run(strategy, initial, data, world, args) for strategy in args.strategy.split(",")}
    report = {"rank": rank, "world": world, "reference": reference_losses, "runs": runs}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
