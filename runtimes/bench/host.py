"""Host timings in the LiteRT interpreter (ai-edge-litert) and the browser, in the bench JSON schema.

Init (interpreter construction, XNNPACK setup and tensor allocation), first inference,
warm-up average, then the timed runs (average, p50, p90, min, max, std) in microseconds;
peak memory is the process's peak resident set (VmHWM), read before and after.
`compare` runs two models alternately in one process (run i of A, run i of B, ...) so
machine load hits both alike, and reports B/A ratios; one process has one peak, so each
model's peak is read in a child process that loads and runs only that model.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from runtimes.bench.model_file import read_model_file
from runtimes.bench.op_profile import op_profile

SCHEMA = "litert-torch-bench/1"


def random_inputs(signature, seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs matching a runtimes.litert Signature (normal floats, small ints)."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in signature.inputs:
        if np.issubdtype(spec.dtype, np.floating):
            out.append(rng.standard_normal(spec.shape).astype(spec.dtype))
        elif spec.dtype == np.bool_:
            out.append(rng.integers(0, 2, spec.shape).astype(bool))
        else:
            info = np.iinfo(spec.dtype)
            out.append(rng.integers(max(info.min, -8), min(info.max, 8) + 1, spec.shape).astype(spec.dtype))
    return out


def stats_us(times_us) -> dict:
    """count, avg, p50, p90, min, max, std of a list of microsecond timings."""
    t = np.asarray(times_us, dtype=np.float64)
    if not t.size:
        return {"count": 0}
    return {
        "count": int(t.size),
        "avg": float(t.mean()),
        "p50": float(np.percentile(t, 50)),
        "p90": float(np.percentile(t, 90)),
        "min": float(t.min()),
        "max": float(t.max()),
        "std": float(t.std()),
    }


def _peak_rss_mb() -> float:
    """This process's peak resident set in MiB: Linux's VmHWM, which starts afresh at exec
    (ru_maxrss carries the parent's peak across fork and exec: a child of a large process
    would report its parent's); ru_maxrss where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# A child process's peak resident set around loading and running one model (`_peak_alone`).
_PEAK_CHILD = """
import json, sys
from runtimes.bench.host import _HostRunner, _peak_rss_mb
path, threads, use_xnnpack, seed, runs = sys.argv[1:]
with open(path, "rb") as f:
    content = f.read()
before = _peak_rss_mb()
runner = _HostRunner(content, int(threads) or None, use_xnnpack == "1", int(seed))
for _ in range(int(runs)):
    runner.once()
print(json.dumps({"peak_rss_mb": _peak_rss_mb(), "peak_rss_before_mb": before}))
"""


def _peak_alone(content: bytes, threads: int | None, use_xnnpack: bool, seed: int, runs: int = 2) -> dict:
    """`memory` of bench_host's JSON for one model, measured in a child process that loads
    and runs only it (plus `process: "child"`)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory(prefix="litert_bench_") as folder:
        path = os.path.join(folder, "model.tflite")
        with open(path, "wb") as f:
            f.write(content)
        argv = [path, str(threads or 0), "1" if use_xnnpack else "0", str(seed), str(runs)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, "-c", _PEAK_CHILD, *argv], capture_output=True, text=True, env=env, timeout=600
        )
    if done.returncode:
        raise RuntimeError(f"measuring the model's peak memory in a child process failed:\n{done.stderr[-2000:]}")
    return {**json.loads(done.stdout.splitlines()[-1]), "process": "child"}


class _HostRunner:
    """One loaded model and its inputs; `once()` times one inference in microseconds."""

    def __init__(self, content: bytes, threads: int | None, use_xnnpack: bool, seed: int):
        from runtimes.litert import LiteRTModel

        start = time.perf_counter()
        self.model = LiteRTModel(content, num_threads=threads, use_xnnpack=use_xnnpack)
        self.sig = self.model.signature(self.model.signatures[0].key)  # its runner allocates tensors
        self.init_us = (time.perf_counter() - start) * 1e6
        self.inputs = random_inputs(self.sig, seed)

    def once(self) -> float:
        start = time.perf_counter()
        self.model.run(self.inputs, self.sig.key)
        return (time.perf_counter() - start) * 1e6


def bench_host(
    model,
    *,
    runs: int = 50,
    warmup: int = 5,
    threads: int | None = None,
    use_xnnpack: bool = True,
    seed: int = 0,
    per_op: bool = False,
) -> dict:
    """Benchmark a model (path or bytes) in the LiteRT interpreter on this machine; with
    `per_op`, add `op_profile` (see `op_profile`)."""
    content, name = read_model_file(model)
    rss_before = _peak_rss_mb()
    runner = _HostRunner(content, threads, use_xnnpack, seed)
    first = runner.once()
    warm = [runner.once() for _ in range(warmup)]
    times = [runner.once() for _ in range(runs)]
    report = _host_report(runner, name, content, threads, use_xnnpack, first, warm, times)
    report["memory"] = {"peak_rss_mb": _peak_rss_mb(), "peak_rss_before_mb": rss_before}
    report["op_profile"] = op_profile(content, threads=threads, use_xnnpack=use_xnnpack) if per_op else None
    return report


def _host_report(runner, name, content, threads, use_xnnpack, first, warm, times) -> dict:
    """The JSON of one model's timings on this machine (bench_host, and each side of compare)."""
    return {
        "schema": SCHEMA,
        "target": "host",
        "model": name,
        "model_bytes": len(content),
        "signature": runner.sig.key,
        "runtime": {
            "engine": "ai-edge-litert",
            "threads": threads or 1,
            "delegate": "xnnpack" if use_xnnpack else "builtin kernels",
        },
        "init_us": runner.init_us,
        "first_us": first,
        "warmup_avg_us": float(np.mean(warm)) if warm else None,
        "inference_us": stats_us(times),
    }


def compare(
    model_a,
    model_b,
    *,
    runs: int = 50,
    warmup: int = 5,
    threads: int | None = None,
    use_xnnpack: bool = True,
    seed: int = 0,
) -> dict:
    """Benchmark A and B alternately in one process; ratios are B / A (below 1: B faster).
    Each side's `memory` is its peak in a child process of its own (`_peak_alone`)."""
    (ca, na), (cb, nb) = read_model_file(model_a), read_model_file(model_b)
    a = _HostRunner(ca, threads, use_xnnpack, seed)
    b = _HostRunner(cb, threads, use_xnnpack, seed)
    firsts = (a.once(), b.once())
    for _ in range(warmup):
        a.once(), b.once()
    ta, tb = [], []
    for _ in range(runs):
        ta.append(a.once())
        tb.append(b.once())
    ra = _host_report(a, na, ca, threads, use_xnnpack, firsts[0], [], ta)
    rb = _host_report(b, nb, cb, threads, use_xnnpack, firsts[1], [], tb)
    ra["memory"] = _peak_alone(ca, threads, use_xnnpack, seed)
    rb["memory"] = _peak_alone(cb, threads, use_xnnpack, seed)
    sa, sb = ra["inference_us"], rb["inference_us"]
    ratios = {k: sb[k] / sa[k] for k in ("avg", "p50", "p90", "min") if sa.get(k)}
    ratios["init"] = b.init_us / a.init_us if a.init_us else None
    return {
        "schema": SCHEMA,
        "mode": "compare",
        "alternating": True,
        "a": ra,
        "b": rb,
        "ratio_b_over_a": ratios,
    }


def bench_web(model, *, runs: int = 20, warmup: int = 3, accelerator: str = "wasm", seed: int = 0) -> dict:
    """Benchmark in headless Chromium with LiteRT.js (runtimes.web); same JSON schema."""
    from runtimes.litert import LiteRTModel
    from runtimes.web import run_in_browser

    content, name = read_model_file(model)
    sig = LiteRTModel(content).signatures[0]
    result = run_in_browser(content, random_inputs(sig, seed), accelerator=accelerator, warmup=warmup, runs=runs)
    return {
        "schema": SCHEMA,
        "target": "web",
        "model": name,
        "model_bytes": len(content),
        "signature": sig.key,
        "runtime": {
            "engine": "LiteRT.js (@litertjs/core)",
            "accelerator": accelerator,
            "browser": result.user_agent,
            "threads": 1,
        },
        "init_us": result.init_ms * 1e3,
        "first_us": result.first_ms * 1e3,
        "warmup_avg_us": None,
        "inference_us": stats_us([t * 1e3 for t in result.times_ms]),
    }
