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
from kernels.sharded import KernelMesh, split_over  # noqa: E402
from tests.tpu_backend.models import LlamaConfig, LlamaLM, sequence_loss  # noqa: E402
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
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
    gradient_error = {}
    for name, want, got in zip(names, single[1:], split[1:]):
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        gradient_error[name] = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    report = {
        "loss_single": float(single[0]),
        "loss_sharded": float(split[0]),
        "gradient_error": gradient_error,
        "routed": routed,
        "manual_computations": program.count("sdy.manual_computation") + program.count("SPMDFullToShardShape"),
        "devices": jax.device_count(),
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
