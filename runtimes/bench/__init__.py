"""Benchmarks of .tflite models: on the host (ai-edge-litert), on Android and iOS (LiteRT's
`benchmark_model`), in the browser (LiteRT.js via runtimes.web), all in one JSON schema.

Host numbers: init (interpreter construction, XNNPACK setup and tensor allocation), first inference,
warm-up average, then the timed runs (average, p50, p90, min, max, std) in microseconds;
peak memory is the process's peak resident set (VmHWM), read before and after.
`compare` runs two models alternately in one process (run i of A, run i of B, ...) so
machine load hits both alike, and reports B/A ratios; each model's peak memory is read in
a child process that loads and runs only it.

On a phone: `android_script` writes a shell script that pushes the model with adb and runs
`benchmark_model` with the same options; `parse_benchmark_model` turns that tool's log
(also what the iOS benchmark app prints) into the same JSON.

Split by concern: `host` (host and browser timings, `compare`), `op_profile` (per-op
host timings), `device_scripts` (adb / iOS scripts for `benchmark_model`),
`device_logs` (its logs -> JSON), `reports` (JSON files, plots).
"""

from runtimes.bench.device_logs import parse_benchmark_model
from runtimes.bench.device_scripts import DEVICE_DIR, android_script, benchmark_args, ios_params, ios_script
from runtimes.bench.host import SCHEMA, bench_host, bench_web, compare, random_inputs, stats_us
from runtimes.bench.op_profile import op_profile, op_profile_by_type
from runtimes.bench.reports import plot, write_json

__all__ = [
    "DEVICE_DIR",
    "SCHEMA",
    "android_script",
    "bench_host",
    "bench_web",
    "benchmark_args",
    "compare",
    "ios_params",
    "ios_script",
    "op_profile",
    "op_profile_by_type",
    "parse_benchmark_model",
    "plot",
    "random_inputs",
    "stats_us",
    "write_json",
]
