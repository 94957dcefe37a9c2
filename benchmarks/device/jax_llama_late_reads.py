"""JAX's Llama training step (`jax_llama_reference.py`'s own step function) timed two ways on
one chip: waited for at every step, and with each loss read `--lag` steps late, the loop
`backend_bench.py --pipeline K` runs for ours.

    python3 -m benchmarks.device.jax_llama_late_reads            # 374M, lag 2 (on a TPU VM)
    python3 -m benchmarks.device.jax_llama_late_reads --model 950m --lag 2
    python3 -m benchmarks.device.jax_llama_late_reads --remat dots   # keep the matrix products

The reference lives outside the repo: `../shared/tpu-vm/jax_llama_reference.py`, which
`prepare.sh` copies into `.tpu-wheels/s/` for the chip (it needs only JAX).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import time

from benchmarks.harness import write_json
from benchmarks.models import LLAMA_374M, LLAMA_950M

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE_PLACES = (
    os.path.join(ROOT, ".tpu-wheels", "s", "jax_llama_reference.py"),
    os.path.join(ROOT, "..", "shared", "tpu-vm", "jax_llama_reference.py"),
)
# the shapes `backend_bench --model llama-374m / llama-950m` trains (batch 4)
SHAPES = {"374m": LLAMA_374M, "950m": LLAMA_950M}
BATCH = 4
REMAT_POLICIES = ("full", "dots", "none")  # the reference's names


def _reference():
    path = next((p for p in REFERENCE_PLACES if os.path.exists(p)), None)
    if path is None:
        raise SystemExit(f"jax_llama_reference.py not found in {REFERENCE_PLACES} (run ../shared/tpu-vm/prepare.sh)")
    spec = importlib.util.spec_from_file_location("jax_llama_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="374m")
    parser.add_argument("--lag", type=int, default=2, help="read each step's loss this many steps late")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--remat",
        choices=REMAT_POLICIES,
        default="full",
        help="the reference's checkpoint policy per layer: recompute all of it (full), keep the matrix "
        "products (dots, `backend_bench --remat matmuls`'s peer), or keep every activation (none)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE ('-': stdout)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    ref = _reference()
    c = SHAPES[args.model]
    dims = (c.vocab, c.width, c.layers, c.heads, c.ffn)  # the order the reference takes them in
    params = ref.init(jax.random.PRNGKey(0), *dims, jnp.bfloat16)
    m, v = jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params)
    t = jnp.zeros((), jnp.float32)
    idx = jax.random.randint(jax.random.PRNGKey(1), (BATCH, c.context), 0, c.vocab)
    tgt = jax.random.randint(jax.random.PRNGKey(2), (BATCH, c.context), 0, c.vocab)
    started = time.perf_counter()
    ref.prebuild("splash", c.heads, c.context)
    step = ref.make_step(*dims, "splash", args.remat).lower(params, m, v, t, idx, tgt).compile()
    compile_s = time.perf_counter() - started
    # what the step's program needs on the chip, as the reference counts it (the runtime's
    # `peak_bytes_in_use` leaves the program's temporaries out: 2.12 GiB under every policy)
    memory = step.memory_analysis()
    program_gib = (
        memory.argument_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
    ) / 2**30
    for _ in range(3):
        params, m, v, t, loss = step(params, m, v, t, idx, tgt)
    loss.block_until_ready()

    waited = []
    for _ in range(args.steps):
        start = time.perf_counter()
        params, m, v, t, loss = step(params, m, v, t, idx, tgt)
        loss.block_until_ready()
        waited.append(time.perf_counter() - start)
    waited.sort()
    waited_ms = waited[len(waited) // 2] * 1e3
    print(f"JAX {args.model}, remat {args.remat}, compile {compile_s:.1f} s, the step's program {program_gib:.2f} GiB")
    print(f"JAX {args.model}, each step waited for: {waited_ms:.2f} ms (median of {args.steps})")

    in_flight, reads = collections.deque(), []
    for _ in range(args.steps + args.lag):
        params, m, v, t, loss = step(params, m, v, t, idx, tgt)
        in_flight.append(loss)
        if len(in_flight) > args.lag:
            float(in_flight.popleft())
            reads.append(time.perf_counter())
    late = (reads[-1] - reads[0]) / (len(reads) - 1)
    print(f"JAX {args.model}, each loss read {args.lag} steps late: {late * 1e3:.2f} ms (between reads)")
    if args.json:
        figures = dict(compile_s=compile_s, waited_ms=waited_ms, late_ms=late * 1e3, program_gib=program_gib)
        write_json(args.json, dict(model=args.model, remat=args.remat, lag=args.lag, **figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
