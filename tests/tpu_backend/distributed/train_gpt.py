"""Train the test GPT (or MLP) a few steps under one parallel strategy; write a JSON report.

Run in a fresh process (JAX reads the virtual device count once, at start-up), by the
tests next to it or by hand, alone or under the launcher:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python tests/tpu_backend/distributed/train_gpt.py --strategy fsdp --mesh 8 --out r.json
    python -m tpu_backend.launch --nproc 2 --cpu-devices 4 \
        tests/tpu_backend/distributed/train_gpt.py --strategy dp --mesh 8 --out r.json

Several strategies (`--strategy single,dp,fsdp,tp`) run one after the other in the
process; the report maps each to its results. Strategies: `single` (no mesh: the reference), `dp` (DataParallel), `fsdp` (fully_shard),
`tp` (parallelize_module with a Megatron-style plan over the mesh's last axis; the batch
over the others). Every process trains on the same global batches;
with several processes each feeds its own slice of every batch. The report (written by
process 0) holds the loss of every step and, for sharded runs, the per-device parameter
bytes read from the arrays' shardings. `--save-at K --checkpoint DIR` saves a sharded
checkpoint after step K; `--resume DIR` restores one before training and starts
counting at the step it was saved after. A strategy written `dp:sgd` uses that optimizer
instead of `--optimizer` (the report key is the strategy as written); `--tensors PATH` also
saves, with `torch.save`, each run's gradients after its first step and parameters after
its last (on CPU, keyed like the report).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch  # noqa: E402

import tpu_backend  # noqa: E402
import tpu_backend.distributed as dist  # noqa: E402  (joins the launcher's run, if any)
import tpu_backend.tensor as tpu_tensor  # noqa: E402
from benchmarks.models import (  # noqa: E402
    MODEL_CASES,
    GPTConfig,
    _class_batch,
    _token_batch,
    make_optimizer,
    training_batches,
)

BATCH = 16  # divisible by every mesh used in the tests

CASES = {
    "transformer": replace(MODEL_CASES["transformer"], batch=_token_batch(GPTConfig(), BATCH)),
    "mlp": replace(MODEL_CASES["mlp"], batch=_class_batch((BATCH, 32))),
}

TP_PLANS = {
    "transformer": {
        "blocks.*.attention": dist.AttentionParallel(),
        "blocks.*.mlp.0": dist.ColwiseParallel(),
        "blocks.*.mlp.2": dist.RowwiseParallel(),
        "head": dist.ColwiseParallel(),
    },
    "mlp": {"layers.0": dist.ColwiseParallel(), "layers.2": dist.RowwiseParallel()},  # (10 classes: replicated)
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CASES), default="transformer")
    parser.add_argument(
        "--strategy",
        default="dp",
        help="single, dp, fsdp or tp, each optionally :sgd or :adamw; several comma-separated run in turn",
    )
    parser.add_argument("--mesh", default="8", help="mesh shape, e.g. 8 or 4x2")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    parser.add_argument("--tensors", default=None, help="save first-step gradients and final parameters here")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--eager-mode", choices=["strict", "fused"], default="strict")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This process's slice of a global batch (the whole batch with one process)."""
    count, index = dist.process_count(), dist.process_index()
    size = t.shape[0] // count
    return t[index * size : (index + 1) * size]


def build(args, strategy: str):
    case = CASES[args.model]
    torch.manual_seed(0)
    model = case.build().to("tpu")
    if strategy == "single":
        return case, model, model, (lambda t: t.to("tpu"))
    shape = tuple(int(s) for s in args.mesh.split("x"))
    names = ("data", "model")[: len(shape)] if strategy != "fsdp" or len(shape) > 1 else ("fsdp",)
    mesh = dist.init_mesh(shape, names)
    if strategy == "dp":
        wrapped = dist.DataParallel(model, mesh)
        return case, model, wrapped, wrapped.shard_batch
    if strategy == "fsdp":
        batch_axes = mesh.axis_names  # the batch over every axis, parameters over the first
        dist.fully_shard(model, mesh, axis=mesh.axis_names[0], batch_axes=batch_axes)
        return case, model, model, lambda t: dist.shard_batch(t, mesh, batch_axes)
    dist.parallelize_module(model, mesh, TP_PLANS[args.model], axis=mesh.axis_names[-1])  # tp
    if len(shape) == 1:
        return case, model, model, lambda t: t.to("tpu")  # every device sees the whole batch
    return case, model, model, lambda t: dist.shard_batch(t, mesh, mesh.axis_names[:-1])


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A (possibly sharded) device tensor's whole value on CPU."""
    return t.detach().cpu().clone()


def train(args, strategy: str, optimizer_name: str, tensors: dict | None) -> dict:
    """Train `args.steps` steps (from a checkpoint if asked) under `strategy`; the report.
    Fills `tensors` (if given) with the gradients after the first step and the final
    parameters (read whole: one process only)."""
    case, model, wrapped, shard = build(args, strategy)
    optimizer = make_optimizer(optimizer_name, model.parameters())
    batches = training_batches(case, args.steps)
    first = 0
    if args.resume:
        first = dist.load_checkpoint(args.resume, model, optimizer)["step"]
    losses, times = [], []
    for step in range(first, args.steps):
        inputs, target = batches[step]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = case.loss(wrapped(shard(local_part(inputs))), shard(local_part(target)))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
        if step == first and tensors is not None:
            tensors["first_gradients"] = {
                n: full_tensor(p.grad) for n, p in model.named_parameters() if p.grad is not None
            }
        print(f"{strategy} step {step}: loss {losses[-1]:.6f} ({times[-1]:.2f} s)", flush=True)
        if args.save_at is not None and step + 1 == args.save_at:
            dist.save_checkpoint(args.checkpoint, model, optimizer, extra={"step": step + 1})
    if tensors is not None:
        tensors["final_parameters"] = {n: full_tensor(p) for n, p in model.named_parameters()}
    report = {
        "losses": losses,
        "first_step": first,
        "step_seconds": times,
        "processes": dist.process_count(),
        "sync_each_computation": tpu_tensor.SYNC_EACH_COMPUTATION,
    }
    if strategy != "single":
        params = list(model.parameters())
        states = [
            v
            for s in optimizer.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.device.type == "tpu"
        ]
        report.update(
            param_bytes_total=sum(p.numel() * p.element_size() for p in params),
            param_bytes_per_device=dist.bytes_per_device(params),
            grad_bytes_per_device=dist.bytes_per_device([p.grad for p in params if p.grad is not None]),
            state_bytes_total=sum(v.numel() * v.element_size() for v in states),
            state_bytes_per_device=dist.bytes_per_device(states),
            specs={name: str(spec) for name, spec in dist.placements_of(model).items()},
        )
    return report


def main(argv=None) -> None:
    args = parse_args(argv)
    if hasattr(faulthandler, "register"):  # `kill -USR1 <pid>` prints every thread's stack (hang diagnosis)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    tpu_backend.set_eager_mode(args.eager_mode)
    report, tensors = {}, {}
    for key in args.strategy.split(","):
        strategy, _, optimizer_name = key.partition(":")
        tensors[key] = {} if args.tensors else None
        report[key] = train(args, strategy, optimizer_name or args.optimizer, tensors[key])
    if dist.process_index() == 0:
        if args.tensors:
            torch.save(tensors, args.tensors)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
