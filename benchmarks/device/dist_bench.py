"""Step time and scaling efficiency of distributed training on the "tpu" device, 1 to N devices.

    python -m benchmarks.device.dist_bench                                  # small GPT, dp and fsdp, 1/2/4/8 devices
    python -m benchmarks.device.dist_bench --model mingpt --strategies dp,fsdp,tp --devices 1,2,4,8
    python -m benchmarks.device.dist_bench --json dist.json                 # also write the figures ('-': stdout)

Weak scaling: every device gets `--batch-per-device` sequences, so n devices train an
n-times larger global batch; with perfect scaling the step time stays flat. Scaling
efficiency = t(1 device) / t(n devices) under the same strategy (1.0 is perfect), and
throughput is tokens (or samples) per second.

On CPU (`--cpu-devices`, default 8 virtual devices through XLA_FLAGS) all virtual
devices share this machine's cores, so n devices do n times the work on the same
hardware: the figures measure the overhead of partitioning (collectives, per-shard
dispatch), NOT a speed-up; efficiency near 1/n is the expected CPU result. On a TPU
slice the same command measures real scaling (the XLA flag only affects the CPU
platform; sub-meshes use the first n devices).

Every configuration runs in this process: it is built and warmed up (`--warmup`
untimed steps, which include compilation; the first step is reported separately), then
timed for `--steps` steps (median). Each step ends with `loss.item()` (a sync).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer", choices=["mlp", "transformer", "mingpt"])
    parser.add_argument("--strategies", default="dp,fsdp", help="comma-separated: dp, fsdp, tp")
    parser.add_argument("--devices", default="1,2,4,8", help="device counts (each <= the devices JAX sees)")
    parser.add_argument("--batch-per-device", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--cpu-devices", type=int, default=8, help="virtual CPU devices (ignored by TPU/GPU platforms)")
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    return parser.parse_args(argv)


args = parse_args() if __name__ == "__main__" else None
if args is not None and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Before JAX starts: the virtual device count is read once.
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.cpu_devices}"
    )

import jax  # noqa: E402
import torch  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import tpu_backend  # noqa: E402,F401
import tpu_backend.distributed as dist  # noqa: E402
from benchmarks.harness import console as wide_console  # noqa: E402
from benchmarks.harness import write_json  # noqa: E402
from benchmarks.models import MINGPT, MLP, GPTConfig, TinyGPT, sequence_loss  # noqa: E402

TP_PLANS = {
    "gpt": {
        "blocks.*.attention": dist.AttentionParallel(),
        "blocks.*.mlp.0": dist.ColwiseParallel(),
        "blocks.*.mlp.2": dist.RowwiseParallel(),
    },
    "mlp": {"layers.0": dist.ColwiseParallel(), "layers.2": dist.RowwiseParallel()},
}


def make_model(name: str):
    """(model on CPU, batch(global_size) -> (inputs, target), loss fn, items per sample, plan)."""
    torch.manual_seed(0)
    if name == "mlp":

        def batch(size):
            g = torch.Generator().manual_seed(1)
            return torch.randn(size, 32, generator=g), torch.randint(0, 10, (size,), generator=g)

        return MLP(), batch, torch.nn.functional.cross_entropy, 1, TP_PLANS["mlp"]
    config = MINGPT if name == "mingpt" else GPTConfig()

    def batch(size):
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, config.vocab, (size, config.context + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return TinyGPT(config), batch, sequence_loss, config.context, TP_PLANS["gpt"]


def sub_mesh(count: int):
    mesh = jax.make_mesh((count,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:count])
    dist.set_mesh(mesh)
    return mesh


def run_config(model_name: str, strategy: str, count: int, opts) -> dict:
    cpu_model, make_batch, loss_fn, items, plan = make_model(model_name)
    model = cpu_model.to("tpu")
    mesh = sub_mesh(count)
    shard = lambda t: dist.shard_batch(t, mesh)  # noqa: E731
    if strategy == "dp":
        model = dist.DataParallel(model, mesh)
    elif strategy == "fsdp":
        dist.fully_shard(model, mesh)
    elif strategy == "tp":
        dist.parallelize_module(model, mesh, plan)
        shard = lambda t: t.to("tpu")  # noqa: E731  (every device sees the whole batch)
    else:
        raise ValueError(f"unknown strategy {strategy!r}: use dp, fsdp or tp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    size = opts.batch_per_device * count
    inputs, target = make_batch(size)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(shard(inputs)), shard(target))
        loss.backward()
        optimizer.step()
        return loss.item()

    start = time.perf_counter()
    loss = step()
    first = time.perf_counter() - start
    for _ in range(opts.warmup - 1):
        step()
    times = []
    for _ in range(opts.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return dict(
        strategy=strategy,
        devices=count,
        global_batch=size,
        first_step_s=first,
        step_s=median,
        min_step_s=min(times),
        items_per_s=size * items / median,
        loss=loss,
    )


def main(opts) -> list[dict]:
    from rich.table import Table

    console = wide_console(140)
    counts = [int(c) for c in opts.devices.split(",")]
    available = jax.device_count()
    if max(counts) > available:
        raise SystemExit(f"--devices asks for {max(counts)} devices but JAX sees {available} ({jax.default_backend()})")
    load_before = os.getloadavg()[0]
    results = []
    for strategy in opts.strategies.split(","):
        for count in counts:
            result = run_config(opts.model, strategy, count, opts)
            results.append(result)
            console.print(f"{strategy} x{count}: {result['step_s'] * 1e3:.1f} ms/step", highlight=False)
    base = {r["strategy"]: r["step_s"] for r in results if r["devices"] == counts[0]}
    for r in results:
        r["scaling_efficiency"] = base[r["strategy"]] / r["step_s"]  # against the smallest count
    unit = "tokens/s" if opts.model != "mlp" else "samples/s"
    table = Table(
        title=f"{opts.model}, weak scaling ({opts.batch_per_device} per device), "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind})"
    )
    for column in (
        "strategy",
        "devices",
        "global batch",
        "first step s",
        "step ms (median)",
        "min ms",
        unit,
        "efficiency",
        "loss",
    ):
        table.add_column(column, justify="right" if column not in ("strategy",) else "left")
    for r in results:
        table.add_row(
            r["strategy"],
            str(r["devices"]),
            str(r["global_batch"]),
            f"{r['first_step_s']:.1f}",
            f"{r['step_s'] * 1e3:.1f}",
            f"{r['min_step_s'] * 1e3:.1f}",
            f"{r['items_per_s']:.0f}",
            f"{r['scaling_efficiency']:.2f}",
            f"{r['loss']:.4f}",
        )
    console.print(table)
    if jax.default_backend() == "cpu":
        console.print(
            "CPU: the virtual devices share the same cores, so this measures partitioning overhead, "
            "not speed-up (efficiency near 1/n is expected).",
            highlight=False,
        )
    load_after = os.getloadavg()[0]
    console.print(f"load average before/after: {load_before:.1f} / {load_after:.1f}", highlight=False)
    if opts.json:
        payload = dict(
            settings=vars(opts),
            backend=jax.default_backend(),
            device_kind=jax.devices()[0].device_kind,
            load_average=[load_before, load_after],
            results=results,
        )
        write_json(opts.json, payload)
    return results


if __name__ == "__main__":
    main(args)
