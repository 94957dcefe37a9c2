"""The Pallas kernels of `kernels/` against XLA, on the chip: time and memory, one table.

    python -m benchmarks.kernels.kernels_bench                  # a TPU: the table (~2 min on a v5e)
    python -m benchmarks.kernels.kernels_bench --sweep-blocks   # + block-size sweeps, stopped at
                                                                     # --budget (220 s from the start)
    python -m benchmarks.kernels.kernels_bench --compile-only v5e   # any machine with libtpu: compile
                                                                     # every program for the chip, memory only
    python -m benchmarks.kernels.kernels_bench --json k.json    # also write the figures ('-': stdout)

Rows (bf16, `jax_enable_x64` on as the "tpu" device runs; `--no-x64` turns it off):
- flash attention, causal, 16 heads of 128, sequence 1024/2048/4096/8192 at a constant
  8192 tokens per call (batch 8/4/2/1), against `jax.nn.dot_product_attention`
  (implementation="xla", which materialises the scores);
- RMSNorm, RMSNorm with the residual add, LayerNorm: 16384 rows of 4096, against
  `kernels.norms.norm_reference`;
- cross-entropy over vocabularies of 32000 and 128256, 8192 rows, against
  `kernels.cross_entropy.cross_entropy_reference` (decode attention: `--kernels decode`).
Each row: forward and forward + backward milliseconds, kernel / XLA (the forward + backward
program returns the output and the gradients, as a training step uses both; after a
compiled warm-up, the mean over a loop of calls long enough to take ~0.2 s, best of 2),
the speedups, the compiled forward + backward program's memory (XLA's `memory_analysis()`:
arguments + outputs + temporaries; an O(seq^2) score matrix shows there) and the largest
relative difference between the kernel's and XLA's outputs and gradients.
Targets checked on an accelerator: flash forward + backward >= 1.5x XLA at sequence 4096,
and the kernel's program bytes per token growing < 1.5x per doubling of the sequence
(linear memory; XLA's grow ~2x: quadratic).

`--sweep-blocks` then times the kernels alone over TPU block sizes: attention block_q x
block_k in 128..1024 at `--sweep-seq` (default 4096), cross-entropy rows x vocabulary
chunk at vocabulary 128256, norm rows at hidden 4096; combinations the chip's rules
reject (`kernels.check_lowering`) are skipped. The fastest per kernel is marked: put it
in `kernels/tuning.py`.

Off a TPU the kernels run in Pallas's interpreter on small shapes: the figures check that
everything runs and agrees, they are NOT performance figures.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp

from benchmarks.harness import write_json
from kernels import (
    check_lowering,
    norms,
    tpu,
)
from kernels import cross_entropy as ce
from kernels import decode_attention as da
from kernels import flash_attention as fa
from kernels._common import accelerator

SPEEDUP_TARGET = 1.5
TARGET_SEQ = 4096
SWEEP_BLOCKS = (128, 256, 512, 1024)
MISMATCH = 5e-2  # bf16 outputs agree to ~1e-2; beyond this the row is flagged


@dataclass
class Row:
    kernel: str
    seq: int
    shape: str
    impl: str
    fwd_ms: dict = field(default_factory=dict)  # impl -> ms
    fwd_bwd_ms: dict = field(default_factory=dict)
    temp_bytes: dict = field(default_factory=dict)  # impl -> compiled fwd+bwd program's bytes (args + outputs + temp)
    peak_bytes: dict = field(default_factory=dict)
    max_rel_diff: float = 0.0
    blocks: str = ""  # the kernel's block config (kernels.tuning dataclass) for this shape
    tokens: int = 0
    error: str = ""


# --------------------------------------------------------------------------- measuring


def _time(fn, args, warmup: int, iters: int) -> float:
    """Median ms of `iters` calls, each waited for (after `warmup` calls)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _loop_time(fn, args, seconds: float = 0.2, trials: int = 2) -> float:
    """ms per call of a compiled `fn`: calls queued back to back (dispatch overlaps the
    device), enough of them to take ~`seconds`, best of `trials`."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = time.perf_counter() - start
    calls = max(1, min(200, int(seconds / max(once, 1e-6))))
    best = math.inf
    for _ in range(trials):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


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
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    worst = 0.0
    for x, y in zip(leaves_a, leaves_b):
        x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
        worst = max(worst, float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1e-6)))
    return worst


@dataclass
class Settings:
    impl: str  # "pallas" on a TPU, "interpret" elsewhere
    compile_only: str | None = None  # a chip: compile for it, run nothing
    warmup: int = 1
    iters: int = 3
    with_reference: bool = True  # False: the kernel alone (block sweeps)
    seconds: float = 0.2  # per timing trial


def _programs(forward, cotangent):
    """(forward, forward + backward) jitted; the second returns the output and the VJP in
    every input, as a training step uses both (returning only the VJP would let XLA drop
    the reference's forward but not a kernel's)."""
    fwd = jax.jit(forward)
    if cotangent is None:
        return fwd, None

    def forward_backward(*args):
        out, vjp = jax.vjp(forward, *args)
        return out, vjp(cotangent)

    return fwd, jax.jit(forward_backward)


def _compiled(fn, args, chip=None):
    """`fn` compiled once for `args` (for `chip` without running: `kernels.tpu.compile_for`)."""
    if chip:
        return tpu.compile_for(chip, fn, *args)
    return fn.lower(*args).compile()


def _footprint(compiled) -> int | None:
    """Bytes the compiled program holds at most: arguments + outputs + temporaries (XLA's
    `memory_analysis()`; inputs and outputs grow with the tokens, an O(seq^2) score matrix
    shows in the temporaries)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes)


def _measure(row: Row, make, args: dict, cotangent: dict, settings: Settings):
    """make(impl) -> the forward function for that implementation ("reference": XLA); args
    and cotangent per implementation (each may take its own layout)."""
    outputs = {}
    for impl in (row.impl, "reference") if settings.with_reference else (row.impl,):
        fwd, fwd_bwd = _programs(make(impl), cotangent[impl])
        fwd = _compiled(fwd, args[impl], settings.compile_only)
        fwd_bwd = fwd_bwd and _compiled(fwd_bwd, args[impl], settings.compile_only)
        row.temp_bytes[impl] = _footprint(fwd_bwd or fwd)
        if settings.compile_only:
            continue
        outputs[impl] = (fwd(*args[impl]), fwd_bwd(*args[impl]) if fwd_bwd else None)
        row.fwd_ms[impl] = _loop_time(fwd, args[impl], settings.seconds)
        if fwd_bwd is not None:
            row.fwd_bwd_ms[impl] = _loop_time(fwd_bwd, args[impl], settings.seconds)
        row.peak_bytes[impl] = _peak_bytes()
    if len(outputs) == 2:
        kernel, reference = outputs[row.impl], outputs["reference"]
        if row.kernel.startswith("flash"):  # the XLA attention runs in (B, S, H, D): compare in (B, H, S, D)
            reference = jax.tree.map(lambda t: jnp.swapaxes(t, 1, 2), reference)
        row.max_rel_diff = _rel_diff(kernel, reference)


def _key(i):
    return jax.random.PRNGKey(i)


def _blocks(config) -> str:
    """A tuning dataclass as "block_q=128 block_k=512"."""
    return " ".join(f"{k}={v}" for k, v in asdict(config).items())


def _normal(i, shape, dtype, abstract):
    if abstract:
        return jax.ShapeDtypeStruct(shape, dtype)
    return jax.random.normal(_key(i), shape, jnp.float32).astype(dtype)


# --------------------------------------------------------------------------- the rows


def _xla_attention(q, k, v):
    """JAX's XLA attention, (B, S, H, D): scores materialised, softmax in float32."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def bench_attention(seq, sizes, impl, dtype, warmup=1, iters=3, settings: Settings | None = None, blocks=None) -> Row:
    """Causal flash attention against XLA; sizes["attention"] = (batch, heads, kv heads, head dim)."""
    settings = settings or Settings(impl, warmup=warmup, iters=iters)
    batch, heads, kv_heads, head_dim = sizes["attention"]
    abstract = settings.compile_only is not None
    q = _normal(1, (batch, heads, seq, head_dim), dtype, abstract)
    k = _normal(2, (batch, kv_heads, seq, head_dim), dtype, abstract)
    v = _normal(3, (batch, kv_heads, seq, head_dim), dtype, abstract)
    dout = _normal(4, q.shape, dtype, abstract)
    blocks = blocks or {}
    row = Row("flash_attention causal", seq, f"B{batch} H{heads}/{kv_heads} D{head_dim}", impl, tokens=batch * seq)
    with tpu.lowering_for(settings.compile_only) if abstract else _nothing():
        row.blocks = _blocks(fa.resolve_config(q, k, True, impl=impl, **blocks).blocks)

    def to_bshd(t):
        return t if abstract else jnp.swapaxes(t, 1, 2)

    def bshd_struct(t):
        return jax.ShapeDtypeStruct((t.shape[0], t.shape[2], t.shape[1], t.shape[3]), t.dtype)

    xla_args = tuple(bshd_struct(t) if abstract else to_bshd(t) for t in (q, k, v))
    xla_dout = jnp.zeros(bshd_struct(dout).shape, dtype) if abstract else to_bshd(dout)

    def make(which):
        if which == "reference":  # takes grouped K/V heads directly
            return _xla_attention
        return lambda q, k, v: fa.flash_attention(q, k, v, causal=True, impl=which, **blocks)

    kernel_dout = jnp.zeros(dout.shape, dtype) if abstract else dout
    _measure(row, make, {impl: (q, k, v), "reference": xla_args}, {impl: kernel_dout, "reference": xla_dout}, settings)
    return row


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def bench_norm(seq, sizes, impl, dtype, warmup=1, iters=3, settings: Settings | None = None, variant="rms") -> Row:
    """variant "rms", "rms+residual" or "layer"; sizes["norm"] = (rows, hidden); `seq` unused."""
    settings = settings or Settings(impl, warmup=warmup, iters=iters)
    rows, dim = sizes["norm"]
    abstract = settings.compile_only is not None
    x = _normal(1, (rows, dim), dtype, abstract)
    residual = _normal(2, (rows, dim), dtype, abstract)
    weight = _normal(5, (dim,), dtype, abstract)
    bias = _normal(6, (dim,), dtype, abstract)
    dy = jnp.zeros((rows, dim), dtype) if abstract else jax.random.normal(_key(3), (rows, dim), dtype)
    names = {"rms": "rms_norm", "rms+residual": "rms_norm + residual", "layer": "layer_norm"}
    row = Row(names[variant], rows, f"rows {rows} D{dim}", impl, tokens=rows)
    with tpu.lowering_for(settings.compile_only) if abstract else _nothing():
        row.blocks = _blocks(norms.resolve_config(x, variant == "layer", 1e-6, impl).blocks)

    def make(which):
        if which == "reference":
            if variant == "layer":
                return lambda x, w, b: norms.norm_reference(x, None, w, b, True, 1e-5)[0]
            if variant == "rms+residual":
                return lambda x, r, w: norms.norm_reference(x, r, w, None, False, 1e-6)[0]
            return lambda x, w: norms.norm_reference(x, None, w, None, False, 1e-6)[0]
        if variant == "layer":
            return lambda x, w, b: norms.layer_norm(x, w, b, impl=which)
        if variant == "rms+residual":
            return lambda x, r, w: norms.rms_norm(x, w, residual=r, impl=which)[0]
        return lambda x, w: norms.rms_norm(x, w, impl=which)

    args = {"layer": (x, weight, bias), "rms+residual": (x, residual, weight), "rms": (x, weight)}[variant]
    _measure(row, make, {impl: args, "reference": args}, {impl: dy, "reference": dy}, settings)
    return row


def bench_cross_entropy(seq, sizes, impl, dtype, warmup=1, iters=3, settings: Settings | None = None, blocks=None):
    """sizes["cross_entropy"] = (rows, vocabulary); `seq` unused."""
    settings = settings or Settings(impl, warmup=warmup, iters=iters)
    rows, vocab = sizes["cross_entropy"]
    abstract = settings.compile_only is not None
    logits = _normal(1, (rows, vocab), dtype, abstract)
    targets = jax.random.randint(_key(2), (rows,), 0, vocab)
    blocks = blocks or {}
    row = Row("cross_entropy", rows, f"rows {rows} V{vocab}", impl, tokens=rows)
    with tpu.lowering_for(settings.compile_only) if abstract else _nothing():
        row.blocks = _blocks(ce.resolve_config(logits, impl=impl, **blocks).blocks)

    def make(which):
        if which == "reference":
            return lambda x: jnp.mean(ce.cross_entropy_reference(x, targets)[0]).astype(x.dtype)
        return lambda x: ce.cross_entropy(x, targets, impl=which, **blocks)

    one = jnp.ones((), dtype)
    _measure(row, make, {impl: (logits,), "reference": (logits,)}, {impl: one, "reference": one}, settings)
    return row


def bench_decode(seq, sizes, impl, dtype, warmup=1, iters=3, settings: Settings | None = None) -> Row:
    """One token over a KV cache of `seq`; sizes["decode"] = (batch, heads, kv heads, head dim)."""
    settings = settings or Settings(impl, warmup=warmup, iters=iters)
    batch, heads, kv_heads, head_dim = sizes["decode"]
    abstract = settings.compile_only is not None
    q = _normal(1, (batch, heads, head_dim), dtype, abstract)
    k = _normal(2, (batch, kv_heads, seq, head_dim), dtype, abstract)
    v = _normal(3, (batch, kv_heads, seq, head_dim), dtype, abstract)
    lengths = jax.random.randint(_key(4), (batch,), seq // 2, seq + 1)
    row = Row("decode_attention", seq, f"B{batch} H{heads}/{kv_heads} D{head_dim} cache {seq}", impl, tokens=batch)
    with tpu.lowering_for(settings.compile_only) if abstract else _nothing():
        row.blocks = _blocks(da.resolve_config(q, k, impl=impl).blocks)

    def make(which):
        return lambda q, k, v: da.decode_attention(q, k, v, lengths, impl=which)

    _measure(row, make, {impl: (q, k, v), "reference": (q, k, v)}, {impl: None, "reference": None}, settings)
    return row


# --------------------------------------------------------------------------- the plan

TOKENS = 8192  # attention: batch = TOKENS // seq, so every row does the same work per key
ACCELERATOR = {
    "attention": dict(seqs=(1024, 2048, 4096, 8192), heads=16, kv_heads=16, head_dim=128),
    "norm": dict(rows=16384, hidden=4096),
    "cross_entropy": dict(rows=8192, vocabs=(32000, 128256)),
    "decode": dict(caches=(8192, 32768), shape=(16, 32, 8, 128)),
}
SMALL = {  # the interpreter on CPU: runs and agrees, nothing more
    "attention": dict(seqs=(128, 256), heads=2, kv_heads=1, head_dim=64),
    "norm": dict(rows=256, hidden=256),
    "cross_entropy": dict(rows=64, vocabs=(2048,)),
    "decode": dict(caches=(256,), shape=(2, 4, 2, 64)),
}
KERNELS = ("attention", "norm", "cross_entropy", "decode")
DEFAULT_KERNELS = ("attention", "norm", "cross_entropy")


def plan(kernel: str, plan_sizes: dict, tokens: int):
    """(label, bench function, seq, sizes, extra keywords) for every row of `kernel`."""
    p = plan_sizes[kernel]
    if kernel == "attention":
        for seq in p["seqs"]:
            shape = (max(1, tokens // seq), p["heads"], p["kv_heads"], p["head_dim"])
            yield f"attention {seq}", bench_attention, seq, {"attention": shape}, {}
    elif kernel == "norm":
        for variant in ("rms", "rms+residual", "layer"):
            yield f"norm {variant}", bench_norm, p["rows"], {"norm": (p["rows"], p["hidden"])}, {"variant": variant}
    elif kernel == "cross_entropy":
        for vocab in p["vocabs"]:
            sizes = {"cross_entropy": (p["rows"], vocab)}
            yield f"cross_entropy {vocab}", bench_cross_entropy, p["rows"], sizes, {}
    elif kernel == "decode":
        for cache in p["caches"]:
            yield f"decode {cache}", bench_decode, cache, {"decode": p["shape"]}, {}


# --------------------------------------------------------------------------- block sweeps


def sweep(settings: Settings, dtype, plan_sizes: dict, sweep_seq: int, tokens: int, deadline: float) -> list[dict]:
    """The kernels alone over TPU block sizes; rejected combinations (layout, VMEM) skipped,
    and every combination once `time.monotonic()` passes `deadline`."""
    found = []
    a = plan_sizes["attention"]
    batch = max(1, tokens // sweep_seq)
    q_shape = (batch, a["heads"], sweep_seq, a["head_dim"])
    kv_shape = (batch, a["kv_heads"], sweep_seq, a["head_dim"])
    chip = settings.compile_only or _chip_name()
    for bq in SWEEP_BLOCKS:
        for bk in SWEEP_BLOCKS:
            if bq > sweep_seq or bk > sweep_seq:
                continue
            with tuning_override("attention", block_q=bq, block_k=bk):
                reason = check_lowering.attention_rejection(
                    q_shape, kv_shape, jnp.dtype(dtype).name, causal=True, chip=chip
                )
            found.append(
                _sweep_point(
                    deadline,
                    "attention",
                    f"seq {sweep_seq} B{batch} block_q={bq} block_k={bk}",
                    reason,
                    lambda bq=bq, bk=bk: bench_attention(
                        sweep_seq,
                        {"attention": q_shape[:2] + kv_shape[1:2] + q_shape[3:]},
                        settings.impl,
                        dtype,
                        settings=_kernel_only(settings),
                        blocks={"block_q": bq, "block_k": bk},
                    ),
                )
            )
    c = plan_sizes["cross_entropy"]
    rows, vocab = c["rows"], max(c["vocabs"])
    for br in (128, 256, 512):
        for bv in (1024, 2048, 4096):
            with tuning_override("cross_entropy", block_rows=br, block_vocab=bv):
                reason = check_lowering.cross_entropy_rejection(rows, vocab, jnp.dtype(dtype).name, chip=chip)
            found.append(
                _sweep_point(
                    deadline,
                    "cross_entropy",
                    f"rows {rows} V{vocab} block_rows={br} block_vocab={bv}",
                    reason,
                    lambda br=br, bv=bv: bench_cross_entropy(
                        rows,
                        {"cross_entropy": (rows, vocab)},
                        settings.impl,
                        dtype,
                        settings=_kernel_only(settings),
                        blocks={"block_rows": br, "block_vocab": bv},
                    ),
                )
            )
    n = plan_sizes["norm"]
    for br in (32, 64, 128, 256):
        with tuning_override("norm", block_rows=br):
            reason = check_lowering.norm_rejection(
                n["rows"], n["hidden"], jnp.dtype(dtype).name, residual=True, chip=chip
            )

        def run(br=br):
            with tuning_override("norm", block_rows=br):
                return bench_norm(
                    n["rows"],
                    {"norm": (n["rows"], n["hidden"])},
                    settings.impl,
                    dtype,
                    settings=_kernel_only(settings),
                    variant="rms+residual",
                )

        found.append(
            _sweep_point(deadline, "norm", f"rows {n['rows']} D{n['hidden']} residual block_rows={br}", reason, run)
        )
    return found


def tuning_override(kernel, **blocks):
    from kernels import tuning

    return tuning.override(kernel, **blocks)


def _chip_name() -> str:
    """The chip JAX runs on (`kernels.tpu.CHIPS`), or the table's default off a TPU."""
    kind = jax.devices()[0].device_kind
    return next((c.name for c in tpu.CHIPS.values() if c.device_kind == kind), tpu.DEFAULT_CHIP)


def _kernel_only(settings: Settings) -> Settings:
    return Settings(settings.impl, settings.compile_only, with_reference=False, seconds=0.1)


def _sweep_point(deadline, kernel, label, reason, run) -> dict:
    point = {"kernel": kernel, "config": label, "fwd_ms": None, "fwd_bwd_ms": None, "temp_bytes": None}
    if reason or time.monotonic() > deadline:
        point["skipped"] = reason or "not run: --budget spent"
        return point
    try:
        row = run()
        point.update(fwd_ms=row.fwd_ms.get(row.impl), fwd_bwd_ms=row.fwd_bwd_ms.get(row.impl))
        point["temp_bytes"] = row.temp_bytes.get(row.impl)
    except Exception as error:  # a combination the compiler refuses or that runs out of memory
        point["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return point


# --------------------------------------------------------------------------- report


def check_targets(rows: list[Row]) -> list[dict]:
    """Flash forward + backward speedup at TARGET_SEQ; linear memory (the fwd+bwd program's
    bytes per token growing < 1.5x per doubling of the sequence)."""
    checks = []
    attention = sorted((r for r in rows if r.kernel.startswith("flash") and not r.error), key=lambda r: r.seq)
    for r in attention:
        if r.seq == TARGET_SEQ and r.fwd_bwd_ms.get(r.impl) and r.fwd_bwd_ms.get("reference"):
            speedup = r.fwd_bwd_ms["reference"] / r.fwd_bwd_ms[r.impl]
            checks.append(
                {
                    "target": f"flash fwd+bwd >= {SPEEDUP_TARGET}x XLA at seq {TARGET_SEQ}",
                    "value": round(speedup, 2),
                    "met": speedup >= SPEEDUP_TARGET,
                }
            )
    with_bytes = [r for r in attention if r.temp_bytes.get(r.impl)]
    if len(with_bytes) >= 2:
        a, b = with_bytes[0], with_bytes[-1]
        doublings = math.log2(b.seq / a.seq)
        per_token = (b.temp_bytes[b.impl] / b.tokens) / (a.temp_bytes[a.impl] / a.tokens)
        growth = per_token ** (1 / doublings) if doublings else 1.0
        checks.append(
            {
                "target": f"flash memory O(seq): program bytes per token x{growth:.2f} per doubling (seq {a.seq}..{b.seq})",
                "value": round(growth, 2),
                "met": growth < 1.5,
            }
        )
    return checks


def _ms(value) -> str:
    return "-" if value is None else (f"{value:.3f}" if value < 10 else f"{value:.1f}")


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}" if value >= 2**20 else f"{value / 2**20:.2f}"


def _ratio(row_dict, impl) -> str:
    kernel, xla = row_dict.get(impl), row_dict.get("reference")
    return f"{xla / kernel:.2f}x" if kernel and xla else "-"


def _print_table(header: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))


def print_report(rows: list[Row], checks: list[dict], note: str) -> None:
    print(f"\nPallas kernels vs XLA on {jax.devices()[0].device_kind} ({note})")
    header = ["kernel", "shape", "blocks", "fwd ms k/xla", "fwd x", "fwd+bwd ms k/xla", "fwd+bwd x"]
    header += ["memory MiB k/xla", "diff"]
    lines = []
    for r in rows:
        if r.error:
            lines.append([r.kernel, r.shape, r.blocks, r.error[:90], "", "", "", "", ""])
            continue
        flag = " MISMATCH" if r.max_rel_diff > MISMATCH else ""
        lines.append(
            [
                r.kernel,
                r.shape + (f" L{r.seq}" if r.kernel.startswith("flash") else ""),
                r.blocks,
                f"{_ms(r.fwd_ms.get(r.impl))}/{_ms(r.fwd_ms.get('reference'))}",
                _ratio(r.fwd_ms, r.impl),
                f"{_ms(r.fwd_bwd_ms.get(r.impl))}/{_ms(r.fwd_bwd_ms.get('reference'))}",
                _ratio(r.fwd_bwd_ms, r.impl),
                f"{_mib(r.temp_bytes.get(r.impl))}/{_mib(r.temp_bytes.get('reference'))}",
                f"{r.max_rel_diff:.1e}{flag}",
            ]
        )
    _print_table(header, lines)
    for check in checks:
        print(f"{'MET' if check['met'] else 'NOT MET'}: {check['target']} (measured {check['value']})")


def print_sweep(points: list[dict]) -> None:
    print("\nBlock sweep (kernel alone; * = fastest fwd+bwd per kernel: put it in kernels/tuning.py)")
    best = {}
    for p in points:
        if p.get("fwd_bwd_ms") and (p["kernel"] not in best or p["fwd_bwd_ms"] < best[p["kernel"]]["fwd_bwd_ms"]):
            best[p["kernel"]] = p
    lines = []
    for p in points:
        status = p.get("skipped") or p.get("error") or ""
        mark = "*" if best.get(p["kernel"]) is p else ""
        lines.append(
            [mark, p["kernel"], p["config"], _ms(p["fwd_ms"]), _ms(p["fwd_bwd_ms"]), _mib(p["temp_bytes"]), status[:80]]
        )
    _print_table(["", "kernel", "blocks", "fwd ms", "fwd+bwd ms", "memory MiB", "note"], lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default=",".join(DEFAULT_KERNELS), help=f"comma list of {', '.join(KERNELS)}")
    parser.add_argument("--seq", default=None, help="attention: comma list of sequence lengths (default 1024..8192)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="attention: batch x sequence per call")
    parser.add_argument("--sweep-blocks", action="store_true", help="also time the kernels over TPU block sizes")
    parser.add_argument("--sweep-seq", type=int, default=TARGET_SEQ, help="attention sequence of the block sweep")
    parser.add_argument(
        "--budget", type=float, default=220.0, help="seconds from the start after which the sweep stops (default 220)"
    )
    parser.add_argument(
        "--compile-only",
        metavar="CHIP",
        choices=sorted(tpu.CHIPS),
        default=None,
        help="compile every program for this TPU chip (libtpu, no chip needed); memory only",
    )
    parser.add_argument("--no-x64", action="store_true", help="leave jax_enable_x64 off (the device turns it on)")
    parser.add_argument("--json", default=None, help="write the figures as JSON to this file ('-': stdout)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    tpu.quiet_libtpu_without_chip()  # before JAX starts its backends (a CPU host with libtpu)
    start, deadline = time.perf_counter(), time.monotonic() + args.budget
    jax.config.update("jax_enable_x64", not args.no_x64)
    compiled = args.compile_only is not None or accelerator() is not None
    impl = "pallas" if compiled else "interpret"
    dtype = jnp.bfloat16 if compiled else jnp.float32
    plan_sizes = {k: dict(v) for k, v in (ACCELERATOR if compiled else SMALL).items()}
    if args.seq:
        plan_sizes["attention"]["seqs"] = tuple(int(s) for s in args.seq.split(","))
    tokens = args.tokens if compiled else 256
    settings = Settings(impl, args.compile_only)
    if args.compile_only:
        note = f"COMPILED for {args.compile_only} on {jax.default_backend()}, not run: memory only"
    elif compiled:
        note = f"compiled Pallas, x64 {'off' if args.no_x64 else 'on'}"
    else:
        note = "Pallas INTERPRET mode on CPU: correctness only, not performance"
    rows = []
    for name in args.kernels.split(","):
        if name not in KERNELS:
            raise SystemExit(f"unknown kernel {name!r}; choose from {', '.join(KERNELS)}")
        for label, bench, seq, sizes, extra in plan(name, plan_sizes, tokens):
            try:
                rows.append(bench(seq, sizes, impl, dtype, settings=settings, **extra))
            except Exception as error:  # out of memory at long sequences: report and go on
                message = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                rows.append(Row(label, seq, str(sizes), impl, error=message))
            row = rows[-1]  # its figures at once: a run cut short by a time limit still shows them
            figures = row.error or (
                f"fwd+bwd {_ms(row.fwd_bwd_ms.get(impl))} ms vs XLA {_ms(row.fwd_bwd_ms.get('reference'))} ms "
                f"({_ratio(row.fwd_bwd_ms, impl)}), fwd {_ratio(row.fwd_ms, impl)}"
            )
            print(f"  {label}: {figures}; done at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    checks = check_targets(rows) if compiled and not args.compile_only else []
    print_report(rows, checks, note)
    points = []
    if args.sweep_blocks:
        points = sweep(settings, dtype, plan_sizes, args.sweep_seq if compiled else 256, tokens, deadline)
        print_sweep(points)
    print(f"\n{time.perf_counter() - start:.0f} s in all")
    if args.json:
        report = {
            "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind,
            "note": note,
            "dtype": jnp.dtype(dtype).name,
            "rows": [asdict(r) for r in rows],
            "targets": checks,
            "sweep": points,
        }
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
