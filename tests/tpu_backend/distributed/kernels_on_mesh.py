"""The training step with the Pallas kernels on (interpreted), split over a CPU mesh of 4
devices (fsdp=2 x tp=2), against the same step on one device; writes a JSON report.

Run in a fresh process (JAX reads the virtual device count once, at start-up), by
`test_kernels_on_mesh.py` or by hand:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
        python tests/tpu_backend/distributed/kernels_on_mesh.py --out r.json

The step is `tpu_backend.aot`'s (the AOTAutograd joint graph of a Llama with RMSNorm,
causal SDPA and cross-entropy, through the device's FX -> JAX interpreter), run for real:
sharded with the shardings `tpu_backend.aot` plans (FSDP x the tensor-parallel plan below,
which leaves the logits split over the vocabulary) under `kernels.sharded.split_over`,
and unsharded on one device. The report holds both losses, the largest gradient
difference relative to the gradient's largest value per parameter, the kernels the
trace routed, and whether the sharded program holds shard_maps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402

import tpu_backend  # noqa: E402, F401
import tpu_backend.distributed as dist  # noqa: E402
from benchmarks.models import LlamaConfig, LlamaLM, sequence_loss  # noqa: E402
from kernels import sharded  # noqa: E402
from kernels.sharded import KernelMesh, split_over  # noqa: E402
from tpu_backend import kernels as device_kernels  # noqa: E402
from tpu_backend.aot.capture import BATCH, BUFFER, PARAM, trace_step  # noqa: E402
from tpu_backend.aot.plan import input_shardings  # noqa: E402
from tpu_backend.compile.interpreter import GraphFunction  # noqa: E402
from tpu_backend.ops.registry import jax_dtype  # noqa: E402

# head dim 64 (a flash-attention size), 2 heads and 256 classes: both split over tp=2
CONFIG = LlamaConfig(vocab=256, context=16, width=128, heads=2, layers=1, ffn=256)
BATCH_SIZE = 4
PLAN = {
    "blocks.*.[qkv]": dist.ColwiseParallel(),
    "blocks.*.o": dist.RowwiseParallel(),
    "blocks.*.gate": dist.ColwiseParallel(),
    "blocks.*.up": dist.ColwiseParallel(),
    "blocks.*.down": dist.RowwiseParallel(),
    "head": dist.ColwiseParallel(),
}


def _relative_errors(names, want, got) -> dict[str, float]:
    """Per name: max |got - want| over max |want|."""
    out = {}
    for name, w, g in zip(names, want, got):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        out[name] = float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))
    return out


def eager(model, inputs, targets) -> dict:
    """The device's eager path: one forward and backward on one device, then with the
    mesh `tpu_backend.distributed` makes (`init_mesh`, `parallelize_module` over "model",
    the batch over "data"), the kernels split over it by default."""
    import copy

    def loss_and_grads(module, x, y):
        with device_kernels.use("interpret"):
            loss = sequence_loss(module(x), y)
            loss.backward()
        return float(loss.detach()), [p.grad.cpu() for p in module.parameters()]

    single = copy.deepcopy(model).to("tpu")
    want_loss, want = loss_and_grads(single, inputs.to("tpu"), targets.to("tpu"))
    mesh = dist.init_mesh((2, 2), ("data", "model"))
    split_calls = set()  # the kernel functions traced inside a shard_map (`kernels.sharded`)
    original = sharded._shard_map

    def counted(km, body, *specs):
        split_calls.add(body.__qualname__.split(".")[0])
        return original(km, body, *specs)

    sharded._shard_map = counted
    try:
        split = dist.parallelize_module(copy.deepcopy(model).to("tpu"), mesh, PLAN, axis="model")
        device_kernels.reset_stats()
        got_loss, got = loss_and_grads(
            split, dist.shard_batch(inputs, mesh, "data"), dist.shard_batch(targets, mesh, "data")
        )
        routed = device_kernels.stats()
    finally:
        sharded._shard_map = original
        dist.set_mesh(None)
    names = [name for name, _ in model.named_parameters()]
    return {
        "eager_loss_single": want_loss,
        "eager_loss_sharded": got_loss,
        "eager_gradient_error": _relative_errors(names, want, got),
        "eager_routed": routed,
        "eager_split": sorted(split_calls),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--eager", action="store_true", help="also the eager path under tpu_backend.distributed's mesh")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = LlamaLM(CONFIG)
    tokens = torch.randint(0, CONFIG.vocab, (BATCH_SIZE, CONFIG.context + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    device_kernels.reset_stats()
    with device_kernels.use("interpret"):
        step = trace_step(model, [inputs], [targets], sequence_loss)
    routed = device_kernels.stats()
    joint = GraphFunction(step.joint, "kernels_on_mesh")
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    batch = iter([inputs, targets])
    values = [
        (state[s.name] if s.role in (PARAM, BUFFER) else next(batch)).detach().numpy().astype(jax_dtype(s.dtype))
        for s in step.inputs
        if s.role in (PARAM, BUFFER, BATCH)
    ]

    # one device, kernels unsplit
    single = jax.jit(joint)(*values)

    mesh = jax.make_mesh((2, 2), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
    shardings = [
        sharding
        for s, sharding in zip(step.inputs, input_shardings(step, model, mesh, PLAN))
        if s.role in (PARAM, BUFFER, BATCH)
    ]
    placed = [jax.device_put(v, sharding) for v, sharding in zip(values, shardings)]
    replicated = NamedSharding(mesh, PartitionSpec())
    with split_over(KernelMesh(mesh, ("fsdp",), "tp")):
        sharded_joint = jax.jit(joint, out_shardings=replicated)
        program = sharded_joint.lower(*placed).as_text()
        split = sharded_joint(*placed)

    names = [s.name for s in step.inputs if s.role == PARAM]
    report = {
        "loss_single": float(single[0]),
        "loss_sharded": float(split[0]),
        "gradient_error": _relative_errors(names, single[1:], split[1:]),
        "routed": routed,
        "manual_computations": program.count("sdy.manual_computation") + program.count("SPMDFullToShardShape"),
        "devices": jax.device_count(),
    }
    if args.eager:
        report.update(eager(model, inputs, targets))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
