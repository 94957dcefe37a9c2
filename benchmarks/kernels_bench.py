"""Each Pallas kernel of `kernels/` against its XLA reference on the JAX backend present.

    python benchmarks/kernels_bench.py                      # every kernel, sizes for this backend
    python benchmarks/kernels_bench.py --kernels attention --seq 1024,4096
    python benchmarks/kernels_bench.py --json results.json  # also write the figures ('-': stdout)

For every kernel and sequence length: time of the forward and of forward + backward
(median of `--iters` timed calls after `--warmup` untimed ones, each ending with
`block_until_ready`), and memory: the compiled program's temporary bytes (XLA's
`memory_analysis()`: what the program needs beyond its inputs and outputs, where an
O(seq^2) score matrix would show) and, where the device reports it, the process's peak
bytes in use (`device.memory_stats()`, cumulative over the run).

On a TPU the kernels are compiled ("pallas"); shapes are transformer-sized
(bfloat16, head dim 128, sequence 512..8192) and the targets are checked:
- flash attention forward + backward at least 1.5x faster than XLA at sequence 4096;
- no O(seq^2) memory: the kernel's temporary bytes grow at most ~linearly with the
  sequence (ratio between the two longest sequences below 3x for a 2x longer sequence).
On CPU the kernels run in Pallas's interpreter on small shapes: the figures check that
everything runs and agrees with the reference; they are NOT performance figures.

Each row also reports the largest relative difference between kernel and reference
outputs (a sanity check; the tests in tests/kernels/ are the real correctness checks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kernels import cross_entropy as ce  # noqa: E402
from kernels import decode_attention as da  # noqa: E402
from kernels import flash_attention as fa  # noqa: E402
from kernels import norms  # noqa: E402
from kernels._common import accelerator  # noqa: E402

SPEEDUP_TARGET = 1.5
TARGET_SEQ = 4096


@dataclass
class Row:
    kernel: str
    seq: int
    shape: str
    impl: str
    fwd_ms: dict = field(default_factory=dict)  # impl -> ms
    fwd_bwd_ms: dict = field(default_factory=dict)
    temp_bytes: dict = field(default_factory=dict)  # impl -> compiled temporary bytes (fwd+bwd)
    peak_bytes: dict = field(default_factory=dict)
    max_rel_diff: float = 0.0
    blocks: str = ""  # the kernel's block config (kernels.tuning dataclass) for this shape


def _time(fn, args, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _temp_bytes(fn, args) -> int | None:
    try:
        analysis = fn.lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes) if analysis is not None else None
    except Exception:  # some backends have no memory analysis
        return None


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _rel_diff(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-6))


def _measure(row: Row, make_fns, args, cotangent, warmup, iters):
    """make_fns(impl) -> forward function of `args`; times fwd and fwd+bwd for the kernel and XLA."""
    outputs = {}
    for impl in (row.impl, "reference"):
        forward = make_fns(impl)
        fwd = jax.jit(forward)
        fwd_bwd = jax.jit(lambda *a, f=forward: jax.vjp(f, *a)[1](cotangent)) if cotangent is not None else None
        outputs[impl] = fwd(*args)
        row.fwd_ms[impl] = _time(fwd, args, warmup, iters)
        if fwd_bwd is not None:
            row.fwd_bwd_ms[impl] = _time(fwd_bwd, args, warmup, iters)
        row.temp_bytes[impl] = _temp_bytes(fwd_bwd or fwd, args)
        row.peak_bytes[impl] = _peak_bytes()
    row.max_rel_diff = _rel_diff(outputs[row.impl], outputs["reference"])


def _key(i):
    return jax.random.PRNGKey(i)


def _blocks(config) -> str:
    """A tuning dataclass as "block_q=128 block_k=512"."""
    return " ".join(f"{k}={v}" for k, v in asdict(config).items())


def bench_attention(seq, sizes, impl, dtype, warmup, iters) -> Row:
    batch, heads, kv_heads, head_dim = sizes["attention"]
    q = jax.random.normal(_key(1), (batch, heads, seq, head_dim), dtype)
    k = jax.random.normal(_key(2), (batch, kv_heads, seq, head_dim), dtype)
    v = jax.random.normal(_key(3), (batch, kv_heads, seq, head_dim), dtype)
    row = Row("flash_attention (causal)", seq, f"B{batch} H{heads}/{kv_heads} D{head_dim}", impl)
    row.blocks = _blocks(fa.resolve_config(q, k, True, impl=impl).blocks)

    def make(which):
        if which == "reference":
            return lambda q, k, v: fa.attention_reference(q, k, v, None, True)[0]
        return lambda q, k, v: fa.flash_attention(q, k, v, causal=True, impl=which)

    _measure(row, make, (q, k, v), jax.random.normal(_key(4), q.shape, dtype), warmup, iters)
    return row


def bench_norm(seq, sizes, impl, dtype, warmup, iters) -> Row:
    batch, dim = sizes["norm"]
    x = jax.random.normal(_key(1), (batch * seq, dim), dtype)
    residual = jax.random.normal(_key(2), x.shape, dtype)
    weight = jnp.ones((dim,), dtype)
    row = Row("rms_norm + residual", seq, f"rows {batch}x{seq} D{dim}", impl)
    row.blocks = _blocks(norms.resolve_config(x, False, 1e-6, impl).blocks)

    def make(which):
        return lambda x, r, w: norms.rms_norm(x, w, residual=r, impl=which)[0]

    _measure(row, make, (x, residual, weight), jax.random.normal(_key(3), x.shape, dtype), warmup, iters)
    return row


def bench_cross_entropy(seq, sizes, impl, dtype, warmup, iters) -> Row:
    batch, vocab = sizes["cross_entropy"]
    logits = jax.random.normal(_key(1), (batch * seq, vocab), dtype)
    targets = jax.random.randint(_key(2), (batch * seq,), 0, vocab)
    row = Row("cross_entropy", seq, f"rows {batch}x{seq} V{vocab}", impl)
    row.blocks = _blocks(ce.resolve_config(logits, impl=impl).blocks)

    def make(which):
        return lambda x: ce.cross_entropy(x, targets, impl=which)

    _measure(row, make, (logits,), jnp.ones((), dtype), warmup, iters)
    return row


def bench_decode(seq, sizes, impl, dtype, warmup, iters) -> Row:
    batch, heads, kv_heads, head_dim = sizes["decode"]
    q = jax.random.normal(_key(1), (batch, heads, head_dim), dtype)
    k = jax.random.normal(_key(2), (batch, kv_heads, seq, head_dim), dtype)
    v = jax.random.normal(_key(3), (batch, kv_heads, seq, head_dim), dtype)
    lengths = jax.random.randint(_key(4), (batch,), seq // 2, seq + 1)
    row = Row("decode_attention", seq, f"B{batch} H{heads}/{kv_heads} D{head_dim} cache {seq}", impl)
    row.blocks = _blocks(da.resolve_config(q, k, impl=impl).blocks)

    def make(which):
        return lambda q, k, v: da.decode_attention(q, k, v, lengths, impl=which)

    _measure(row, make, (q, k, v), None, warmup, iters)
    return row


BENCHES = {
    "attention": bench_attention,
    "norm": bench_norm,
    "cross_entropy": bench_cross_entropy,
    "decode": bench_decode,
}

ACCELERATOR_SIZES = {
    "attention": (2, 16, 8, 128),  # batch, heads, kv heads, head dim
    "norm": (4, 4096),  # batch (rows = batch * seq), hidden
    "cross_entropy": (2, 32768),  # batch, vocabulary
    "decode": (16, 32, 8, 128),
}
CPU_SIZES = {"attention": (1, 2, 1, 64), "norm": (2, 256), "cross_entropy": (1, 2048), "decode": (2, 4, 2, 64)}


def check_targets(rows: list[Row]) -> list[dict]:
    """The accelerator targets: flash fwd+bwd speedup at TARGET_SEQ; linear memory."""
    checks = []
    attention = sorted((r for r in rows if r.kernel.startswith("flash")), key=lambda r: r.seq)
    at_target = [r for r in attention if r.seq == TARGET_SEQ]
    if at_target:
        r = at_target[0]
        speedup = r.fwd_bwd_ms["reference"] / r.fwd_bwd_ms[r.impl]
        checks.append(
            {
                "target": f"flash fwd+bwd >= {SPEEDUP_TARGET}x XLA at seq {TARGET_SEQ}",
                "value": round(speedup, 2),
                "met": speedup >= SPEEDUP_TARGET,
            }
        )
    if len(attention) >= 2 and all(attention[i].temp_bytes.get(attention[i].impl) for i in (-1, -2)):
        a, b = attention[-2], attention[-1]
        growth = b.temp_bytes[b.impl] / a.temp_bytes[a.impl]
        seq_growth = b.seq / a.seq
        checks.append(
            {
                "target": f"flash memory O(seq): temp bytes x{seq_growth:g} seq -> < x{1.5 * seq_growth:g}",
                "value": round(growth, 2),
                "met": growth < 1.5 * seq_growth,
            }
        )
    return checks


def _fmt_ms(row_dict, impl):
    value = row_dict.get(impl)
    return "-" if value is None else f"{value:.3f}"


def _fmt_bytes(value):
    return "-" if value is None else f"{value / 2**20:.1f}"


def print_table(rows: list[Row], checks: list[dict], note: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Pallas kernels vs XLA on {jax.default_backend()} ({note})")
    for column in (
        "kernel",
        "seq",
        "shape",
        "blocks",
        "fwd ms (kernel / xla)",
        "fwd+bwd ms (kernel / xla)",
        "speedup fwd+bwd",
        "temp MiB (kernel / xla)",
        "max rel diff",
    ):
        table.add_column(column)
    for r in rows:
        speedup = (
            f"{r.fwd_bwd_ms['reference'] / r.fwd_bwd_ms[r.impl]:.2f}x"
            if r.fwd_bwd_ms
            else f"{r.fwd_ms['reference'] / r.fwd_ms[r.impl]:.2f}x (fwd)"
        )
        table.add_row(
            r.kernel,
            str(r.seq),
            r.shape,
            r.blocks,
            f"{_fmt_ms(r.fwd_ms, r.impl)} / {_fmt_ms(r.fwd_ms, 'reference')}",
            f"{_fmt_ms(r.fwd_bwd_ms, r.impl)} / {_fmt_ms(r.fwd_bwd_ms, 'reference')}",
            speedup,
            f"{_fmt_bytes(r.temp_bytes.get(r.impl))} / {_fmt_bytes(r.temp_bytes.get('reference'))}",
            f"{r.max_rel_diff:.2e}",
        )
    console = Console()
    console.print(table)
    for check in checks:
        console.print(f"{'MET' if check['met'] else 'NOT MET'}: {check['target']} (measured {check['value']})")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default=",".join(BENCHES), help=f"comma list of {', '.join(BENCHES)}")
    parser.add_argument(
        "--seq",
        default=None,
        help="comma list of sequence lengths (default: 512..8192 on an accelerator, 128,256 on CPU)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--iters", type=int, default=None, help="timed calls per figure (default 10 on an accelerator, 2 on CPU)"
    )
    parser.add_argument("--json", default=None, help="write the figures as JSON to this file ('-': stdout)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_accelerator = accelerator() is not None
    impl = "pallas" if on_accelerator else "interpret"
    dtype = jnp.bfloat16 if on_accelerator else jnp.float32
    sizes = ACCELERATOR_SIZES if on_accelerator else CPU_SIZES
    seqs = (
        [int(s) for s in args.seq.split(",")]
        if args.seq
        else ([512, 1024, 2048, 4096, 8192] if on_accelerator else [128, 256])
    )
    iters = args.iters or (10 if on_accelerator else 2)
    note = "compiled Pallas" if on_accelerator else "Pallas INTERPRET mode on CPU: correctness only, not performance"
    rows, errors = [], []
    for name in args.kernels.split(","):
        if name not in BENCHES:
            raise SystemExit(f"unknown kernel {name!r}; choose from {', '.join(BENCHES)}")
        for seq in seqs:
            try:
                rows.append(BENCHES[name](seq, sizes, impl, dtype, args.warmup, iters))
            except Exception as error:  # out of memory at long sequences: report and go on
                errors.append({"kernel": name, "seq": seq, "error": f"{type(error).__name__}: {str(error)[:200]}"})
                print(f"{name} seq {seq}: {errors[-1]['error']}", file=sys.stderr)
    checks = check_targets(rows) if on_accelerator else []
    print_table(rows, checks, note)
    if args.json:
        report = {
            "backend": jax.default_backend(),
            "device": str(jax.devices()[0]),
            "note": note,
            "dtype": jnp.dtype(dtype).name,
            "rows": [asdict(r) for r in rows],
            "errors": errors,
            "targets": checks,
        }
        text = json.dumps(report, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
