"""Compile every kernel for a TPU chip over a grid of production shapes, on any machine.

    python -m kernels.check_lowering --platform tpu --chip v5e [--json PATH] [--fast] [--lower-only]

Each grid point is one kernel, one pass (forward, or forward + backward) at one shape and
dtype. It is compiled by `kernels.tpu.compile_for`'s path: `jax.jit(f).lower(...)` on a
compile-only device of the chip from libtpu, then `.compile()`, which runs the chip's
whole compiler (XLA's TPU passes and Mosaic's layout inference and legalization), with
the settings `import tpu_backend` makes process-wide: `jax_enable_x64` on and
`jax_default_matmul_precision` "highest". Lowering alone misses what the chip refuses
(#32): both errors seen on a v5e lowered fine, and so did bf16 dots that inherited
"highest" (Mosaic's compiler refuses them: "Bad lhs type"). Where
libtpu cannot load, each point is only lowered (`jax.export` for platforms=["tpu"] inside
`kernels.tpu.lowering_for(chip)`), and the report says so plainly. Per point: compiled,
lowered or the error, the seconds it took, and the per-program VMEM footprint of the
largest `pallas_call` (blocks double-buffered plus scratch, `kernels.tpu.vmem_bytes`)
against the chip's scoped VMEM limit. Exit status 0 only if every point compiles (or,
in the fallback, lowers) and fits.

The same rule functions decide at run time: `tpu_backend.kernels` asks
`attention_rejection` & co. whether a call can take the kernel before sending it there.
Points whose pallas_calls have identical blocks, dtypes and flags compile to the same
Mosaic kernel up to the grid size; those are compiled once (`--no-dedupe` compiles all).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp

from kernels import tpu, tuning

DTYPES = ("bfloat16", "float32")
SUPPORTED_DTYPES = frozenset(DTYPES)  # Mosaic: no float16 vector unit on v5e/v6e
KERNELS = ("flash_attention", "norm", "cross_entropy", "decode_attention")


# --------------------------------------------------------------------------- the rules


def _dtype_rejection(dtype) -> str | None:
    name = jnp.dtype(dtype).name
    return None if name in SUPPORTED_DTYPES else f"dtype {name} (TPU kernels take {', '.join(DTYPES)})"


def _first_rejection(calls, chip) -> str | None:
    for blocks in calls:
        reason = tpu.rejection(blocks, chip)
        if reason:
            return reason
    return None


def attention_calls(q_shape, kv_shape, dtype, *, causal=False, mask_shape=None, backward=True) -> list:
    """Block lists of the flash-attention pallas_calls (forward, and dq, dkv) for a TPU."""
    from kernels import flash_attention as fa

    blocks = tuning.blocks("attention", "tpu", q_shape[2], kv_shape[2], q_shape[3], jnp.dtype(dtype).itemsize)
    config = fa.AttentionConfig(bool(causal), 1.0, "pallas", blocks)
    mask4 = None if mask_shape is None else (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
    mask4 = None if mask4 is None else mask4[:2]
    calls = [fa.attention_blocks(q_shape, kv_shape, dtype, config, mask4)]
    if backward:
        calls += fa.attention_blocks(q_shape, kv_shape, dtype, config, mask4, backward=True)
    return calls


def norm_calls(rows, dim, dtype, *, residual=False, weight=True, bias=False, backward=True) -> list:
    from kernels import norms

    config = norms.NormConfig(bias, 1e-6, "pallas", tuning.blocks("norm", "tpu", rows, dim))
    shape = dict(residual=residual, weight=weight, bias=bias)
    calls = [norms.norm_blocks(rows, dim, dtype, config, **shape)]
    return calls + ([norms.norm_blocks(rows, dim, dtype, config, **shape, backward=True)] if backward else [])


def cross_entropy_calls(rows, vocab, dtype, *, backward=True) -> list:
    from kernels import cross_entropy as ce

    config = ce.CrossEntropyConfig(-100, "pallas", tuning.blocks("cross_entropy", "tpu", rows, vocab))
    calls = [ce.cross_entropy_blocks(rows, vocab, dtype, config)]
    return calls + ([ce.cross_entropy_blocks(rows, vocab, dtype, config, backward=True)] if backward else [])


def decode_calls(q_shape, cache_shape, dtype) -> list:
    from kernels import decode_attention as da

    config = da.DecodeConfig(1.0, "pallas", tuning.blocks("decode_attention", "tpu", cache_shape[2], q_shape[-1]))
    return [da.decode_blocks(q_shape, cache_shape, dtype, config)]


def _remembered(rule):
    """`rule` answered once per arguments and block-size overrides in force (`tuning.override`):
    the routers of `tpu_backend.kernels` ask on every eager call of a kernel op, and working
    the blocks out costs 50-110 us a call on the CPU host (3 per minGPT layer per step)."""

    @functools.lru_cache(maxsize=4096)
    def answer(args, kwargs, overrides):
        return rule(*args, **dict(kwargs))

    @functools.wraps(rule)
    def remembered(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())), tuning.overrides())
        try:
            hash(key)
        except TypeError:  # an unhashable argument (a list for a shape): not remembered
            return rule(*args, **kwargs)
        return answer(*key)

    remembered.forget = answer.cache_clear
    return remembered


@_remembered
def attention_rejection(q_shape, kv_shape, dtype, *, causal=False, mask_shape=None, chip=None) -> str | None:
    """Why a TPU flash-attention call (forward and backward) cannot take these shapes."""
    return _dtype_rejection(dtype) or _first_rejection(
        attention_calls(q_shape, kv_shape, dtype, causal=causal, mask_shape=mask_shape), chip
    )


@_remembered
def norm_rejection(rows, dim, dtype, *, residual=False, weight=True, bias=False, chip=None) -> str | None:
    return _dtype_rejection(dtype) or _first_rejection(
        norm_calls(rows, dim, dtype, residual=residual, weight=weight, bias=bias), chip
    )


@_remembered
def cross_entropy_rejection(rows, vocab, dtype, *, chip=None) -> str | None:
    return _dtype_rejection(dtype) or _first_rejection(cross_entropy_calls(rows, vocab, dtype), chip)


@_remembered
def decode_rejection(q_shape, cache_shape, dtype, *, chip=None) -> str | None:
    return _dtype_rejection(dtype) or _first_rejection(decode_calls(q_shape, cache_shape, dtype), chip)


# --------------------------------------------------------------------------- the grid


@dataclasses.dataclass(frozen=True)
class Point:
    """One kernel, one pass, one shape and dtype. `shape` holds the kernel's sizes and flags."""

    kernel: str
    backward: bool
    dtype: str
    shape: tuple  # ((name, value), ...)

    @property
    def params(self) -> dict:
        return dict(self.shape)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.shape if v not in (False, None))


def _point(kernel, backward, dtype, **shape) -> Point:
    return Point(kernel, backward, dtype, tuple(shape.items()))


def grid(fast: bool = False) -> list[Point]:
    """The production grid (issue #15), or a handful of representative points."""
    if fast:
        return [
            _point(
                "flash_attention",
                True,
                "bfloat16",
                batch=1,
                heads=8,
                kv_heads=1,
                seq=4096,
                kv_seq=4096,
                head_dim=128,
                causal=True,
                mask=False,
            ),
            _point(
                "flash_attention",
                True,
                "float32",
                batch=1,
                heads=4,
                kv_heads=4,
                seq=1000,
                kv_seq=1000,
                head_dim=64,
                causal=False,
                mask=True,
            ),
            _point("norm", True, "bfloat16", rows=1000, hidden=4096, residual=True, layer=False),
            _point("norm", True, "float32", rows=7, hidden=768, residual=False, layer=True),
            _point("cross_entropy", True, "bfloat16", rows=1024, vocab=32000),
            _point("decode_attention", False, "bfloat16", batch=4, heads=32, kv_heads=4, cache=131072, head_dim=128),
        ]
    points = []
    for dtype in DTYPES:
        for seq in (128, 1000, 4096, 32768):
            for head_dim in (64, 128, 256):
                for heads, kv_heads in ((8, 8), (8, 1)):
                    for causal, mask in ((True, False), (False, True), (False, False)):
                        if mask and seq > 4096:
                            continue  # a dense (L, L) mask at 32k is 4 GiB; masks are a short-sequence feature
                        for backward in (False, True):
                            points.append(
                                _point(
                                    "flash_attention",
                                    backward,
                                    dtype,
                                    batch=1,
                                    heads=heads,
                                    kv_heads=kv_heads,
                                    seq=seq,
                                    kv_seq=seq,
                                    head_dim=head_dim,
                                    causal=causal,
                                    mask=mask,
                                )
                            )
        for seq, kv_seq in ((1000, 4096), (4096, 1000)):  # cross attention, ragged, causal with Lq != Lk
            for backward in (False, True):
                points.append(
                    _point(
                        "flash_attention",
                        backward,
                        dtype,
                        batch=2,
                        heads=8,
                        kv_heads=1,
                        seq=seq,
                        kv_seq=kv_seq,
                        head_dim=128,
                        causal=True,
                        mask=False,
                    )
                )
        for hidden in (768, 2048, 4096, 8192):
            for rows in (1, 1000, 16384):
                for residual in (False, True):
                    for layer in (False, True):
                        for backward in (False, True):
                            points.append(
                                _point(
                                    "norm", backward, dtype, rows=rows, hidden=hidden, residual=residual, layer=layer
                                )
                            )
        for vocab in (32000, 128256, 151936):
            for rows in (8, 1000, 16384):
                for backward in (False, True):
                    points.append(_point("cross_entropy", backward, dtype, rows=rows, vocab=vocab))
        for cache in (1024, 8192, 32768, 131072):
            for head_dim in (64, 128, 256):
                for heads, kv_heads in ((8, 8), (32, 4)):
                    points.append(
                        _point(
                            "decode_attention",
                            False,
                            dtype,
                            batch=4,
                            heads=heads,
                            kv_heads=kv_heads,
                            cache=cache,
                            head_dim=head_dim,
                        )
                    )
    return points


# --------------------------------------------------------------------------- one point


def _abstract(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _with_backward(fn, n_diff, backward):
    """fn, or a function of (*inputs, cotangent) that returns fn's VJP in the first n_diff inputs."""
    if not backward:
        return fn

    def forward_backward(*args):
        *inputs, cotangent = args
        out, vjp = jax.vjp(lambda *d: fn(*d, *inputs[n_diff:]), *inputs[:n_diff])
        return vjp(cotangent)

    return forward_backward


def program(point: Point):
    """(function, abstract args, pallas_call block lists) of a grid point, forcing the TPU path."""
    p, dtype = point.params, point.dtype
    if point.kernel == "flash_attention":
        from kernels.flash_attention import flash_attention

        q = (p["batch"], p["heads"], p["seq"], p["head_dim"])
        kv = (p["batch"], p["kv_heads"], p["kv_seq"], p["head_dim"])
        mask = (p["batch"], 1, p["seq"], p["kv_seq"]) if p["mask"] else None
        args = [_abstract(q, dtype), _abstract(kv, dtype), _abstract(kv, dtype)]
        if mask:
            args.append(_abstract(mask, jnp.bool_))

        def fn(q, k, v, mask=None):
            return flash_attention(q, k, v, mask, causal=p["causal"], impl="pallas")

        calls = attention_calls(q, kv, dtype, causal=p["causal"], mask_shape=mask, backward=point.backward)
        out, n_diff = _abstract(q, dtype), 3
    elif point.kernel == "norm":
        from kernels import norms

        rows = (p["rows"], p["hidden"])
        args = [_abstract(rows, dtype)] + ([_abstract(rows, dtype)] if p["residual"] else [])
        args += [_abstract(rows[1:], dtype)] * (2 if p["layer"] else 1)

        def fn(x, *rest):
            residual = rest[0] if p["residual"] else None
            vectors = rest[1:] if p["residual"] else rest
            if p["layer"]:
                result = norms.layer_norm(x, *vectors, residual=residual, impl="pallas")
            else:
                result = norms.rms_norm(x, *vectors, residual=residual, impl="pallas")
            return result[0] if p["residual"] else result

        calls = norm_calls(*rows, dtype, residual=p["residual"], bias=p["layer"], backward=point.backward)
        out, n_diff = _abstract(rows, dtype), len(args)
    elif point.kernel == "cross_entropy":
        from kernels.cross_entropy import cross_entropy

        args = [_abstract((p["rows"], p["vocab"]), dtype), _abstract((p["rows"],), jnp.int32)]

        def fn(logits, targets):
            return cross_entropy(logits, targets, impl="pallas")

        calls = cross_entropy_calls(p["rows"], p["vocab"], dtype, backward=point.backward)
        out, n_diff = _abstract((), dtype), 1
    elif point.kernel == "decode_attention":
        from kernels.decode_attention import decode_attention

        q = (p["batch"], p["heads"], p["head_dim"])
        cache = (p["batch"], p["kv_heads"], p["cache"], p["head_dim"])
        args = [_abstract(q, dtype), _abstract(cache, dtype), _abstract(cache, dtype), _abstract(q[:1], jnp.int32)]

        def fn(q, k, v, lengths):
            return decode_attention(q, k, v, lengths, impl="pallas")

        calls = decode_calls(q, cache, dtype)
        out, n_diff = None, 0
    else:
        raise ValueError(f"unknown kernel {point.kernel!r}; known: {', '.join(KERNELS)}")
    if point.backward:
        args.append(out)
    return _with_backward(fn, n_diff, point.backward), args, calls


@dataclasses.dataclass
class Result:
    point: Point
    chip: str
    lowered: bool
    error: str | None
    vmem_bytes: int
    vmem_limit: int
    blocks: str
    custom_calls: int = 0
    seconds: float = 0.0
    same_as: int | None = None  # index of the point whose compilation this one shares
    compiled: bool | None = None  # None: not attempted (lowered only: libtpu unavailable or --lower-only)

    @property
    def ok(self) -> bool:
        return self.lowered and self.compiled is not False and self.vmem_bytes <= self.vmem_limit

    @property
    def status(self) -> str:
        if self.error:
            return self.error
        return "compiled" if self.compiled else "lowered"

    def as_json(self) -> dict:
        return {
            "kernel": self.point.kernel,
            "pass": "forward+backward" if self.point.backward else "forward",
            "dtype": self.point.dtype,
            "shape": self.point.params,
            "chip": self.chip,
            "lowered": self.lowered,
            "compiled": self.compiled,
            "error": self.error,
            "vmem_bytes": self.vmem_bytes,
            "vmem_limit_bytes": self.vmem_limit,
            "blocks": self.blocks,
            "tpu_custom_calls": self.custom_calls,
            "seconds": round(self.seconds, 3),
            "same_lowering_as": self.same_as,
        }


def _blocks_text(calls) -> str:
    def one(b):
        return "x".join("_" if d is None else str(d) for d in b.block)

    return "; ".join(", ".join(f"{b.name} {one(b)}" for b in blocks if b.role in ("in", "out")) for blocks in calls)


def _dedupe_key(point: Point, calls, chip: tpu.Chip):
    """Points compiling to the same Mosaic kernels: same blocks (and whether each equals its
    array, which the layout rule reads, or leaves a partial edge block, which the kernels
    mask), dtypes, flags and rule verdict."""
    flags = tuple((k, v) for k, v in point.shape if isinstance(v, bool))
    blocks = tuple(
        (b.name, b.block, jnp.dtype(b.dtype).name, b.role, tuple(x == y for x, y in zip(b.dims[-2:], b.array[-2:])))
        for call in calls
        for b in call
    )
    grouped = point.params.get("heads", 0) != point.params.get("kv_heads", 0)
    ragged = tuple(
        (k, v % 128 != 0) for k, v in point.shape if k in ("seq", "kv_seq", "rows", "vocab", "hidden", "cache")
    )
    edges = tuple(tuple(a % d != 0 for a, d in zip(b.array, b.dims)) for call in calls for b in call)
    if "kv_seq" in point.params:  # flash attention masks padded keys when the keys are not whole blocks
        edges += (point.params["kv_seq"] % calls[0][1].dims[-2] != 0,)
    verdict = tuple(tuple(tpu.violations(c, chip)) for c in calls)
    return (point.kernel, point.backward, point.dtype, flags, blocks, grouped, ragged, edges, verdict)


def _error_text(exc: Exception) -> str:
    """The exception's type and first lines (Mosaic names the failing operation on the
    lines after the first), at most 400 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    kept = [lines[0]] if lines else [""]
    if len(lines) > 2 and lines[1].startswith("The MLIR operation involved"):
        kept.append(lines[2])
    return f"{type(exc).__name__}: {' | '.join(kept)}"[:400]


def compile_unavailable(chip: str | tpu.Chip | None = None) -> str | None:
    """Why points cannot be compiled for `chip` here (None: they can; see `kernels.tpu`)."""
    return tpu.compile_unavailable(chip)


# What `import tpu_backend` sets process-wide, so each point is traced as the device
# traces it: 64-bit mode on, and float32 matmul precision "highest" (PyTorch's default
# `torch.get_float32_matmul_precision()`, which the device follows; a kernel dot without
# an explicit precision would inherit it).
DEVICE_MATMUL_PRECISION = "highest"


def check_point(point: Point, chip: str | tpu.Chip | None = None, *, compile: bool = True) -> Result:
    """Compile one point for `chip` (or only lower it, `compile=False`) with the device's
    settings (64-bit mode on, matmul precision "highest"); never raises (the error is the
    result)."""
    c = tpu.chip(chip)
    fn, args, calls = program(point)
    vmem = max(tpu.vmem_bytes(blocks, c) for blocks in calls)
    start = time.perf_counter()
    lowered, compiled, error, custom = False, None, None, 0
    try:
        with jax.enable_x64(True), jax.default_matmul_precision(DEVICE_MATMUL_PRECISION):
            if compile:
                program_lowered = tpu.lower_for_device(c, fn, *args)
                lowered, custom = True, program_lowered.as_text().count("tpu_custom_call")
                program_lowered.compile()
                compiled = True
            else:
                with tpu.lowering_for(c):
                    exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
                lowered, custom = True, exported.mlir_module().count("tpu_custom_call")
    except Exception as exc:  # the report names any lowering or compilation failure
        error = ("compile: " if lowered else "lowering: ") + _error_text(exc)
        compiled = False if compile and lowered else None
    return Result(
        point,
        c.name,
        lowered,
        error,
        vmem,
        c.scoped_vmem_bytes,
        _blocks_text(calls),
        custom,
        time.perf_counter() - start,
        compiled=compiled,
    )


def check(
    points=None, chip: str | tpu.Chip | None = None, *, dedupe: bool = True, progress=None, compile: bool = True
) -> list[Result]:
    """Compile (or, `compile=False`, lower) every point (default: the whole grid) for `chip`."""
    c = tpu.chip(chip)
    points = grid() if points is None else points
    results, seen = [], {}
    for index, point in enumerate(points):
        key = None
        if dedupe:
            _, _, calls = program(point)
            key = _dedupe_key(point, calls, c)
        if key is not None and key in seen:
            first = results[seen[key]]
            _, _, calls = program(point)
            vmem = max(tpu.vmem_bytes(blocks, c) for blocks in calls)
            results.append(
                dataclasses.replace(
                    first, point=point, vmem_bytes=vmem, blocks=_blocks_text(calls), seconds=0.0, same_as=seen[key]
                )
            )
        else:
            if key is not None:
                seen[key] = index
            results.append(check_point(point, c, compile=compile))
        if progress:
            progress(index + 1, len(points))
    return results


# --------------------------------------------------------------------------- report


def largest_footprints(results) -> dict:
    """kernel -> (largest VMEM bytes, the point's label)."""
    largest = {}
    for r in results:
        if r.vmem_bytes > largest.get(r.point.kernel, (-1, ""))[0]:
            largest[r.point.kernel] = (r.vmem_bytes, f"{r.point.dtype} {r.point.label}")
    return largest


def _mib(n: int) -> str:
    return f"{n / tpu.MiB:.2f}"


def summary(results, chip: tpu.Chip, seconds: float, fallback: str | None = None) -> str:
    """One line: how many points compiled (or only lowered) of how many, and in how long."""
    done = sum(r.ok for r in results)
    own = sum(r.same_as is None for r in results)
    verb = "lowered (NOT compiled)" if fallback else "compiled"
    failed = len(results) - done
    line = (
        f"TPU {chip.name}: {done} of {len(results)} points {verb} and fit VMEM"
        f" ({own} {'lowerings' if fallback else 'compilations'}, the rest share one), "
        f"{failed} failed, {seconds:.0f} s"
    )
    return line + (f" [fallback: {fallback}]" if fallback else "")


def print_report(results, chip: tpu.Chip, *, show_all: bool = True, fallback: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    verb = "lowered (not compiled)" if fallback else "compiled"
    table = Table(title=f"Pallas kernels {verb} for TPU {chip.name} (scoped VMEM {_mib(chip.scoped_vmem_bytes)} MiB)")
    for column in ("#", "kernel", "pass", "dtype", "shape", "VMEM MiB", "s", "status"):
        table.add_column(column, justify="right" if column in ("#", "VMEM MiB", "s") else "left")
    for i, r in enumerate(results):
        if not show_all and r.ok:
            continue
        status = r.status if r.error is None else f"[red]{r.error}[/red]"
        if r.error is None and not r.ok:
            status = f"[red]{r.status}, over VMEM[/red]"
        if r.same_as is not None:
            status += f" (as #{r.same_as})"
        table.add_row(
            str(i),
            r.point.kernel,
            "fwd+bwd" if r.point.backward else "fwd",
            r.point.dtype,
            r.point.label,
            _mib(r.vmem_bytes),
            f"{r.seconds:.1f}" if r.same_as is None else "",
            status,
        )
    console.print(table)
    footprints = Table(title="Largest per-program VMEM footprint per kernel")
    for column in ("kernel", "VMEM MiB", "% of scoped", "at"):
        footprints.add_column(column)
    for kernel, (size, where) in largest_footprints(results).items():
        footprints.add_row(kernel, _mib(size), f"{100 * size / chip.scoped_vmem_bytes:.0f}%", where)
    console.print(footprints)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.check_lowering", description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default="tpu", choices=["tpu"], help="the platform to compile for")
    parser.add_argument("--chip", default=tpu.DEFAULT_CHIP, choices=sorted(tpu.CHIPS))
    parser.add_argument("--json", metavar="PATH", help="write every point's result as JSON")
    parser.add_argument("--fast", action="store_true", help="a handful of representative points")
    parser.add_argument("--kernel", choices=KERNELS, action="append", help="only these kernels")
    parser.add_argument("--no-dedupe", action="store_true", help="compile every point, even with identical blocks")
    parser.add_argument("--failures-only", action="store_true", help="print only the points that fail")
    parser.add_argument("--lower-only", action="store_true", help="only lower (Mosaic's compiler passes do not run)")
    args = parser.parse_args(argv)
    chip = tpu.chip(args.chip)
    points = [p for p in grid(fast=args.fast) if not args.kernel or p.kernel in args.kernel]
    fallback = "--lower-only" if args.lower_only else compile_unavailable(chip)
    if fallback:
        print(
            f"NOT COMPILING for TPU {chip.name}: {fallback}. Only lowering each point: Mosaic's compiler "
            "passes do not run, so a point that lowers here can still fail on the chip."
        )
    start = time.perf_counter()
    results = check(points, chip, dedupe=not args.no_dedupe, compile=fallback is None)
    seconds = time.perf_counter() - start
    print_report(results, chip, show_all=not args.failures_only, fallback=fallback)
    print(summary(results, chip, seconds, fallback))
    if args.json:
        with open(args.json, "w") as f:
            report = {
                "chip": dataclasses.asdict(chip),
                "compiled": fallback is None,
                "fallback": fallback,
                "seconds": round(seconds, 1),
                "results": [r.as_json() for r in results],
            }
            json.dump(report, f, indent=1)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
