"""`benchmark_model` logs (Android binary or iOS app) -> the bench JSON schema."""

from __future__ import annotations

import re

from runtimes.bench.host import SCHEMA

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
        raise ValueError(
            "no 'count=... avg=...' lines: this is not benchmark_model output "
            "(or the run failed; look for ERROR lines in the log)"
        )
    runs = _fields(stat_lines[-1])
    summary = re.search(
        r"Init: "
        + _NUM
        + r", First inference: "
        + _NUM
        + r", Warmup \(avg\): "
        + _NUM
        + r", Inference \(avg\): "
        + _NUM,
        log,
    )
    delegate = (
        "gpu"
        if (param("Use gpu") in ("1", "true"))
        else ("xnnpack" if param("Use xnnpack") in ("1", "true") else "cpu")
    )
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
        "schema": SCHEMA,
        "target": target,
        "model": param("Graph"),
        "model_bytes": int(float(m.group(1)) * 1e6) if m else None,
        "signature": param("Signature"),
        "runtime": {
            "engine": "benchmark_model",
            "threads": int(param("Num threads") or 1),
            "delegate": delegate,
            "delegated_nodes": f"{replaced.group(1)}/{replaced.group(2)} ({replaced.group(3)})" if replaced else None,
        },
        "init_us": float(summary.group(1)) if summary else None,
        "first_us": float(summary.group(2)) if summary else runs.get("first"),
        "warmup_avg_us": float(summary.group(3)) if summary else None,
        "inference_us": {
            "count": int(runs.get("count", 0)),
            "avg": runs.get("avg"),
            "p50": runs.get("median"),
            "p90": None,
            "p95": runs.get("p95"),
            "p5": runs.get("p5"),
            "min": runs.get("min"),
            "max": runs.get("max"),
            "std": runs.get("std"),
        },
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
        rows.append(
            {
                "op": parts[0],
                "count": int(parts[1]),
                "avg_ms": float(parts[2]),
                "percent": float(parts[3].rstrip("%")),
                "times_called": int(parts[-1]),
            }
        )
    return rows or None
