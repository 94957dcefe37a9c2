"""What the host pays per device interaction, in JAX alone: transfers each way and program calls.

    python -m benchmarks.device.host_costs                 # this machine's backend (the chip on a TPU host)
    python -m benchmarks.device.host_costs --json costs.json

A decode step of generate() is a few milliseconds of chip time, so each extra transfer,
read back or program the host makes per token shows in the step (docs/tpu.md, "generate()
on the device"). Microseconds per call, median of `--rounds` rounds (64-bit mode on, as the
device runs):
- host -> device: a (1, 1) int64 by `jnp.array(copy=True)` (a transfer and a copy program)
  and by `jax.device_put` (a transfer), without and with waiting for it; three small arrays
  in three `device_put` calls and in one;
- device -> host: a scalar the device has just computed, read cold and after
  `copy_to_host_async` (the transfer started before the read);
- a jitted `x + 1`, and a compiled program taking 1, 64 or 245 arguments (a 1B Llama's decode
  step takes ~245: weights, cache, inputs), dispatched and waited for;
- the host itself, no device: a Python loop iteration, `os.stat`, a bare system call
  (`os.getppid`), an mmap + munmap of 256 KiB, and a matmul + relu_ on fake tensors (what
  Dynamo and AOTAutograd run per op while tracing). A sandboxed host pays its system calls
  many times over, and torch's tracing with them (docs/tpu.md, "generate() on the device").
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import console, machine, median_ms, table, write_json


def per_call_us(fn, rounds: int, calls: int = 50) -> float:
    """Microseconds per call of `calls` back-to-back calls and one wait for the last result,
    the median over `rounds` (`harness.median_ms`)."""

    def burst():
        for _ in range(calls):
            result = fn()
        jax.block_until_ready(result)

    return median_ms([burst], rounds, warmup=1)[0] * 1e3 / calls


def read_back_us(rounds: int, prefetch: bool) -> float:
    """Microseconds to read a just-computed scalar to the host (its program already done)."""
    one = jnp.ones((), jnp.int64)
    times = []
    for i in range(rounds * 10):
        value = one + i
        value.block_until_ready()
        if prefetch:
            value.copy_to_host_async()
            time.sleep(0.002)  # (the transfer lands meanwhile, as it would while the host works)
        start = time.perf_counter()
        np.asarray(value)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def program_call_rows(count: int, rounds: int) -> list[tuple[str, float]]:
    """A compiled program of `count` arguments: its call, and its call waited for."""
    args = [jnp.full((16, 16), i, jnp.bfloat16) for i in range(count)]
    program = jax.jit(lambda *a: sum(v[0, 0] for v in a)).lower(*args).compile()
    return [
        (f"compiled program, {count} arguments", per_call_us(lambda: program(*args), rounds)),
        (
            f"compiled program, {count} arguments, each waited",
            per_call_us(lambda: program(*args).block_until_ready(), rounds),
        ),
    ]


def host_us(fn, rounds: int, calls: int) -> float:
    """Microseconds per call of `fn` (no device), the median over `rounds` bursts."""

    def burst():
        for _ in range(calls):
            fn()

    return median_ms([burst], rounds, warmup=1)[0] * 1e3 / calls


def host_rows(rounds: int) -> list[tuple[str, float]]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode()
    with fake_mode:
        fake = torch.empty(64, 64)

    def fake_op():
        with fake_mode:
            (fake @ fake).relu_()

    return [
        ("host: a Python loop iteration", host_us(lambda: None, rounds, 20000)),
        ("host: os.stat", host_us(lambda: os.stat("/"), rounds, 2000)),
        ("host: os.getppid (a system call)", host_us(os.getppid, rounds, 2000)),
        ("host: mmap + munmap 256 KiB", host_us(lambda: mmap.mmap(-1, 1 << 18).close(), rounds, 500)),
        ("host: fake-tensor matmul + relu_", host_us(fake_op, rounds, 200)),
    ]


def measure(rounds: int) -> list[tuple[str, float]]:
    token, mask = np.ones((1, 1), np.int64), np.ones((1, 1, 1, 256), bool)
    inputs = [token, token.copy(), mask]
    x = jnp.ones((8,), jnp.float32)
    add_one = jax.jit(lambda a: a + 1)
    rows = [
        ("h2d (1, 1) int64, jnp.array(copy=True)", per_call_us(lambda: jnp.array(token, copy=True), rounds)),
        ("h2d (1, 1) int64, jax.device_put", per_call_us(lambda: jax.device_put(token), rounds)),
        (
            "h2d (1, 1) int64, jnp.array(copy=True), each waited",
            per_call_us(lambda: jnp.array(token, copy=True).block_until_ready(), rounds),
        ),
        (
            "h2d (1, 1) int64, jax.device_put, each waited",
            per_call_us(lambda: jax.device_put(token).block_until_ready(), rounds),
        ),
        ("h2d 3 small arrays, 3 device_put calls", per_call_us(lambda: [jax.device_put(a) for a in inputs], rounds)),
        ("h2d 3 small arrays, 1 device_put call", per_call_us(lambda: jax.device_put(inputs), rounds)),
        ("d2h a computed scalar, cold", read_back_us(rounds, prefetch=False)),
        ("d2h a computed scalar, after copy_to_host_async", read_back_us(rounds, prefetch=True)),
        ("jitted x + 1", per_call_us(lambda: add_one(x), rounds)),
        ("jitted x + 1, each waited", per_call_us(lambda: add_one(x).block_until_ready(), rounds)),
    ]
    for count in (1, 64, 245):
        rows += program_call_rows(count, rounds)
    return rows + host_rows(rounds)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per figure (the median is reported)")
    parser.add_argument("--json", help="also write the figures as JSON to this file ('-': stdout)")
    opts = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    rows = measure(opts.rounds)
    device = jax.devices()[0]
    console().print(
        table(f"host costs on {device.device_kind}, us per call", ("what", "us"), [(n, f"{v:.2f}") for n, v in rows])
    )
    result = {"device": device.device_kind, "machine": machine(), "us_per_call": dict(rows)}
    if opts.json:
        write_json(opts.json, result)
    return result


if __name__ == "__main__":
    main()
