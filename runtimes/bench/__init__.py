"""Benchmarks of .tflite models: on the host (ai-edge-litert), on Android and iOS (LiteRT's
`benchmark_model`), in the browser (LiteRT.js via runtimes.web), all in one JSON schema.

Host numbers: init (interpreter construction, XNNPACK setup and tensor allocation), first inference,
warm-up average, then the timed runs (average, p50, p90, min, max, std) in microseconds;
peak memory is the process's peak resident set (ru_maxrss), read before and after.
`compare` runs two models alternately in one process (run i of A, run i of B, ...) so
machine load hits both alike, and reports B/A ratios.

On a phone: `android_script` writes a shell script that pushes the model with adb and runs
`benchmark_model` with the same options; `parse_benchmark_model` turns that tool's log
(also what the iOS benchmark app prints) into the same JSON.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import time

import numpy as np

SCHEMA = "litert-torch-bench/1"


def _read(model) -> tuple[bytes, str]:
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), "<bytes>"
    if not os.path.isfile(model):
        raise FileNotFoundError(f"no such model file: {model}")
    with open(model, "rb") as f:
        return f.read(), str(model)


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
    return {"count": int(t.size), "avg": float(t.mean()), "p50": float(np.percentile(t, 50)),
            "p90": float(np.percentile(t, 90)), "min": float(t.min()), "max": float(t.max()),
            "std": float(t.std())}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


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


def bench_host(model, *, runs: int = 50, warmup: int = 5, threads: int | None = None,
               use_xnnpack: bool = True, seed: int = 0, per_op: bool = False) -> dict:
    """Benchmark a model (path or bytes) in the LiteRT interpreter on this machine; with
    `per_op`, add `op_profile` (see `op_profile`)."""
    content, name = _read(model)
    rss_before = _peak_rss_mb()
    runner = _HostRunner(content, threads, use_xnnpack, seed)
    first = runner.once()
    warm = [runner.once() for _ in range(warmup)]
    times = [runner.once() for _ in range(runs)]
    return {
        "schema": SCHEMA, "target": "host", "model": name, "model_bytes": len(content),
        "signature": runner.sig.key,
        "runtime": {"engine": "ai-edge-litert", "threads": threads or 1,
                    "delegate": "xnnpack" if use_xnnpack else "builtin kernels"},
        "init_us": runner.init_us, "first_us": first,
        "warmup_avg_us": float(np.mean(warm)) if warm else None,
        "inference_us": stats_us(times),
        "memory": {"peak_rss_mb": _peak_rss_mb(), "peak_rss_before_mb": rss_before},
        "op_profile": op_profile(content, threads=threads, use_xnnpack=use_xnnpack) if per_op else None,
    }


def compare(model_a, model_b, *, runs: int = 50, warmup: int = 5, threads: int | None = None,
            use_xnnpack: bool = True, seed: int = 0) -> dict:
    """Benchmark A and B alternately in one process; ratios are B / A (below 1: B faster)."""
    (ca, na), (cb, nb) = _read(model_a), _read(model_b)
    a = _HostRunner(ca, threads, use_xnnpack, seed)
    b = _HostRunner(cb, threads, use_xnnpack, seed)
    firsts = (a.once(), b.once())
    for _ in range(warmup):
        a.once(), b.once()
    ta, tb = [], []
    for _ in range(runs):
        ta.append(a.once())
        tb.append(b.once())
    sa, sb = stats_us(ta), stats_us(tb)

    def result(runner, name, content, first, stats):
        return {"schema": SCHEMA, "target": "host", "model": name, "model_bytes": len(content),
                "signature": runner.sig.key,
                "runtime": {"engine": "ai-edge-litert", "threads": threads or 1,
                            "delegate": "xnnpack" if use_xnnpack else "builtin kernels"},
                "init_us": runner.init_us, "first_us": first, "warmup_avg_us": None, "inference_us": stats}

    ratios = {k: sb[k] / sa[k] for k in ("avg", "p50", "p90", "min") if sa.get(k)}
    ratios["init"] = b.init_us / a.init_us if a.init_us else None
    return {"schema": SCHEMA, "mode": "compare", "alternating": True,
            "a": result(a, na, ca, firsts[0], sa), "b": result(b, nb, cb, firsts[1], sb),
            "ratio_b_over_a": ratios}


def bench_web(model, *, runs: int = 20, warmup: int = 3, accelerator: str = "wasm", seed: int = 0) -> dict:
    """Benchmark in headless Chromium with LiteRT.js (runtimes.web); same JSON schema."""
    from runtimes.litert import LiteRTModel
    from runtimes.web import run_in_browser

    content, name = _read(model)
    sig = LiteRTModel(content).signatures[0]
    result = run_in_browser(content, random_inputs(sig, seed), accelerator=accelerator, warmup=warmup, runs=runs)
    return {"schema": SCHEMA, "target": "web", "model": name, "model_bytes": len(content), "signature": sig.key,
            "runtime": {"engine": "LiteRT.js (@litertjs/core)", "accelerator": accelerator,
                        "browser": result.user_agent, "threads": 1},
            "init_us": result.init_ms * 1e3, "first_us": result.first_ms * 1e3, "warmup_avg_us": None,
            "inference_us": stats_us([t * 1e3 for t in result.times_ms])}


# ---------------------------------------------------------------------------------- per-op profile

def _single_op_model(schema, model_t, sg, op) -> bytes:
    """A model holding only `op` of subgraph `sg`: its computed inputs become the graph's
    inputs, its constants keep their data."""
    import copy

    import flatbuffers

    new = schema.ModelT()
    new.version, new.operatorCodes = model_t.version, model_t.operatorCodes
    new.buffers = [schema.BufferT()]
    tensors, index = [], {}

    def take(k):
        if k < 0:
            return -1
        if k not in index:
            t = copy.copy(sg.tensors[k])
            data = model_t.buffers[t.buffer].data if t.buffer < len(model_t.buffers) else None
            if data is not None and len(data):
                new.buffers.append(model_t.buffers[t.buffer])
                t.buffer = len(new.buffers) - 1
            else:
                t.buffer = 0
            index[k] = len(tensors)
            tensors.append(t)
        return index[k]

    one = copy.copy(op)
    one.inputs = [take(int(k)) for k in (op.inputs if op.inputs is not None else [])]
    one.outputs = [take(int(k)) for k in op.outputs]
    one.intermediates = [take(int(k)) for k in op.intermediates] if op.intermediates is not None else None
    graph = schema.SubGraphT()
    graph.tensors, graph.operators = tensors, [one]
    graph.inputs = [k for k in one.inputs if k >= 0 and tensors[k].buffer == 0 and not tensors[k].isVariable]
    graph.outputs = list(one.outputs)
    new.subgraphs = [graph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(new.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _time_alone(content: bytes, runs: int, threads: int | None, use_xnnpack: bool) -> float:
    """Median microseconds of one invoke of a single-op model (zeros for integer inputs, so
    indices stay in range; normal floats otherwise)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kwargs = {} if use_xnnpack else {
        "experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    interpreter = Interpreter(model_content=content, num_threads=threads, **kwargs)
    interpreter.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interpreter.get_input_details():
        dtype = np.dtype(d["dtype"])
        value = rng.standard_normal(d["shape"]).astype(dtype) if dtype.kind == "f" else np.zeros(d["shape"], dtype)
        interpreter.set_tensor(d["index"], value)
    interpreter.invoke()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        interpreter.invoke()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def op_profile(model, *, runs: int = 20, threads: int | None = None, use_xnnpack: bool = True,
               subgraph: int = 0) -> list[dict]:
    """Per-op host timings: each op of `subgraph` runs alone, as a one-op model, in the
    LiteRT interpreter (ai-edge-litert has no op profiler in Python). Sums differ from the
    whole model's time (no fusion or cache reuse across ops); use it to find hot ops.
    Rows: index, op, median_us, percent (of the sum), or error."""
    from ai_edge_litert import schema_py_generated as schema

    from common.tflite_schema import CONTROL_FLOW, opcode_name

    content, _ = _read(model)
    model_t = schema.ModelT.InitFromPackedBuf(content, 0)
    sg = model_t.subgraphs[subgraph]
    rows = []
    for i, op in enumerate(sg.operators):
        code = model_t.operatorCodes[op.opcodeIndex]
        name = opcode_name(code.builtinCode, code.deprecatedBuiltinCode)
        row = {"index": i, "op": name}
        try:
            if name in CONTROL_FLOW:
                raise ValueError("control flow calls other subgraphs")
            row["median_us"] = _time_alone(_single_op_model(schema, model_t, sg, op), runs, threads, use_xnnpack)
        except (ValueError, RuntimeError) as e:
            row["error"] = str(e).splitlines()[0][:120]
        rows.append(row)
    total = sum(r.get("median_us", 0.0) for r in rows) or 1.0
    for r in rows:
        if "median_us" in r:
            r["percent"] = 100.0 * r["median_us"] / total
    return rows


def op_profile_by_type(rows: list[dict]) -> list[dict]:
    """The per-op rows summed by op type, largest first (like benchmark_model's summary)."""
    by: dict[str, dict] = {}
    for r in rows:
        entry = by.setdefault(r["op"], {"op": r["op"], "count": 0, "total_us": 0.0, "percent": 0.0})
        entry["count"] += 1
        entry["total_us"] += r.get("median_us", 0.0)
        entry["percent"] += r.get("percent", 0.0)
    return sorted(by.values(), key=lambda e: -e["total_us"])


# ---------------------------------------------------------------------------------- on device

DEVICE_DIR = "/data/local/tmp"


def benchmark_args(*, runs: int = 50, warmup: int = 5, threads: int = 4, delegate: str = "cpu",
                   op_profile: bool = False) -> list[str]:
    """`benchmark_model` flags for the same options the host bench takes."""
    args = [f"--num_threads={threads}", f"--num_runs={runs}", f"--warmup_runs={warmup}",
            "--report_peak_memory_footprint=true"]
    if delegate == "gpu":
        args.append("--use_gpu=true")
    elif delegate == "xnnpack":
        args.append("--use_xnnpack=true")
    elif delegate != "cpu":
        raise ValueError(f"delegate must be cpu, xnnpack or gpu, got {delegate!r}")
    if op_profile:
        args.append("--enable_op_profiling=true")
    return args


def android_script(model_path: str, *, benchmark_binary: str = "benchmark_model", serial: str | None = None,
                   **options) -> str:
    """A bash script that pushes the model (and the benchmark binary) with adb, runs
    LiteRT's `benchmark_model` on the phone and prints its log."""
    adb = "adb" + (f" -s {shlex.quote(serial)}" if serial else "")
    remote = f"{DEVICE_DIR}/{os.path.basename(model_path)}"
    flags = " ".join(shlex.quote(a) for a in benchmark_args(**options))
    return f"""#!/usr/bin/env bash
# Generated by litert-torch bench --target android: run LiteRT's benchmark_model on a phone.
# Needs adb and a benchmark_model binary for the phone's ABI (from the LiteRT releases,
# or `bazel build -c opt --config=android_arm64 //tflite/tools/benchmark:benchmark_model`).
set -euo pipefail
BENCH=${{BENCHMARK_MODEL:-{shlex.quote(benchmark_binary)}}}
{adb} push {shlex.quote(model_path)} {remote}
{adb} push "$BENCH" {DEVICE_DIR}/benchmark_model
{adb} shell chmod +x {DEVICE_DIR}/benchmark_model
{adb} shell {DEVICE_DIR}/benchmark_model --graph={remote} {flags}
"""


def ios_params(model_path: str, **options) -> dict:
    """`benchmark_params.json` for the TFLite iOS benchmark app (its `args` are
    benchmark_model's flags; the app prints benchmark_model's log to the console)."""
    return {"benchmark_name": os.path.splitext(os.path.basename(model_path))[0],
            "args": [f"--graph={os.path.basename(model_path)}", *benchmark_args(**options)]}


def ios_script(model_path: str, app_dir: str = "TFLiteBenchmark", **options) -> str:
    params = json.dumps(ios_params(model_path, **options), indent=2)
    return f"""#!/usr/bin/env bash
# Generated by litert-torch bench --target ios: run the model in the TFLite iOS benchmark app
# (tflite/tools/benchmark/ios). Copies the model and benchmark_params.json into the app's
# benchmark_data folder, then builds and runs it on the connected device; the console log
# is benchmark_model's, which `litert-torch bench --parse LOG` reads.
set -euo pipefail
APP={shlex.quote(app_dir)}
mkdir -p "$APP/TFLiteBenchmark/benchmark_data"
cp {shlex.quote(model_path)} "$APP/TFLiteBenchmark/benchmark_data/"
cat > "$APP/TFLiteBenchmark/benchmark_data/benchmark_params.json" <<'JSON'
{params}
JSON
xcodebuild -project "$APP/TFLiteBenchmark.xcodeproj" -scheme TFLiteBenchmark \\
  -destination 'generic/platform=iOS' build
echo "Install and launch TFLiteBenchmark on the device; save its console log and run:"
echo "  litert-torch bench --parse LOG --target ios"
"""


_NUM = r"(-?[\d.]+(?:e[+-]?\d+)?)"


def _fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=" + _NUM, line)}


def parse_benchmark_model(log: str, target: str = "android") -> dict:
    """Parse `benchmark_model`'s log (Android binary or iOS app) into the bench JSON.

    Reads: the parameter lines (threads, delegate, graph), the two `count=... avg=...`
    lines (warm-up, then the timed runs), the 'Inference timings in us' summary, the
    memory footprint lines and, when present, the op-profiling summary table."""
    def param(name):
        m = re.search(rf"{name}: \[([^\]]*)\]", log)
        return m.group(1) if m else None

    # The run statistics are lines that start with count= (after the log prefix); the op
    # profile's "Timings (microseconds): count=..." lines are not.
    stat_lines = [line for line in log.splitlines() if re.match(r"(INFO: |\S*\s*)?count=\d+", line.strip())]
    if not stat_lines:
        raise ValueError("no 'count=... avg=...' lines: this is not benchmark_model output "
                         "(or the run failed; look for ERROR lines in the log)")
    runs = _fields(stat_lines[-1])
    summary = re.search(r"Init: " + _NUM + r", First inference: " + _NUM + r", Warmup \(avg\): " + _NUM
                        + r", Inference \(avg\): " + _NUM, log)
    delegate = "gpu" if (param("Use gpu") in ("1", "true")) else (
        "xnnpack" if param("Use xnnpack") in ("1", "true") else "cpu")
    replaced = re.search(r"Replacing (\d+) out of (\d+) node\(s\) with delegate \((\w+)\)", log)
    memory = {}
    m = re.search(r"Memory footprint delta from the start of the tool \(MB\): init=" + _NUM + " overall=" + _NUM, log)
    if m:
        memory.update(init_delta_mb=float(m.group(1)), overall_delta_mb=float(m.group(2)))
    m = re.search(r"Overall peak memory footprint \(MB\) via periodic monitoring: " + _NUM, log)
    if m:
        memory["peak_rss_mb"] = float(m.group(1))
    m = re.search(r"The input model file size \(MB\): " + _NUM, log)
    return {
        "schema": SCHEMA, "target": target, "model": param("Graph"),
        "model_bytes": int(float(m.group(1)) * 1e6) if m else None, "signature": param("Signature"),
        "runtime": {"engine": "benchmark_model", "threads": int(param("Num threads") or 1), "delegate": delegate,
                    "delegated_nodes": f"{replaced.group(1)}/{replaced.group(2)} ({replaced.group(3)})"
                    if replaced else None},
        "init_us": float(summary.group(1)) if summary else None,
        "first_us": float(summary.group(2)) if summary else runs.get("first"),
        "warmup_avg_us": float(summary.group(3)) if summary else None,
        "inference_us": {"count": int(runs.get("count", 0)), "avg": runs.get("avg"),
                         "p50": runs.get("median"), "p90": None, "p95": runs.get("p95"), "p5": runs.get("p5"),
                         "min": runs.get("min"), "max": runs.get("max"), "std": runs.get("std")},
        "memory": memory,
        "op_profile": _parse_op_profile(log),
    }


def _parse_op_profile(log: str) -> list[dict] | None:
    """The 'Summary by node type' table of --enable_op_profiling, as rows."""
    start = log.find("Summary by node type")
    if start < 0:
        return None
    rows = []
    for line in log[start:].splitlines()[2:]:
        parts = line.split()
        if len(parts) < 6 or parts[0].startswith("Timings") or not re.match(r"[\d.]+", parts[2] or ""):
            if rows:
                break
            continue
        # [node type] [count] [avg ms] [avg %] [cdf %] [mem KB] [times called]
        rows.append({"op": parts[0], "count": int(parts[1]), "avg_ms": float(parts[2]),
                     "percent": float(parts[3].rstrip("%")), "times_called": int(parts[-1])})
    return rows or None


# ---------------------------------------------------------------------------------- reports

def write_json(result: dict, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, path)


def plot(results: list[dict], path: str, title: str = "Inference time") -> str:
    """A PNG bar chart of p50 inference time (with min..p90 whiskers) per result; labels
    are 'model (target)'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, p50, low, high = [], [], [], []
    for r in results:
        s = r["inference_us"]
        labels.append(f"{os.path.basename(str(r['model']))}\n({r['target']})")
        p50.append(s["p50"] / 1e3)
        low.append((s["p50"] - s["min"]) / 1e3)
        high.append(((s.get("p90") or s.get("p95") or s["max"]) - s["p50"]) / 1e3)
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(results)), 3.6))
    ax.bar(range(len(results)), p50, yerr=[low, high], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(results)), labels, fontsize=8)
    ax.set_ylabel("ms (p50; whiskers min..p90)")
    ax.set_title(title)
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path
