"""Peak memory of converting a model with large weights, relative to the weights' size.

Each measurement runs in a fresh child process (so peaks do not mix): import, build a
model of two embedding tables (plus a small linear head) holding `--gb` GiB of float32
weights in total, then `litert_torch.convert` and (with `--export`) `edge.export(path)`.
Peak resident memory (Linux `VmHWM`, reset through /proc/self/clear_refs after the model
is built) is reported as:

- `peak/weights`: (peak RSS - RSS before the model existed) / weight bytes: the whole
  process's memory for the weights, the model's own copy included. 1.0 is the floor;
  the target is <= 1.5 (never two copies of the weights at once);
- `extra/weights`: (peak RSS - RSS with the model built) / weight bytes: what conversion
  adds on top of the model.

Above 2 GiB of constants the writer stores weights after the flatbuffer
(`Buffer.offset/size`); `--threshold BYTES` lowers that limit to exercise the same layout
with a smaller model.

    python -m benchmarks.converter.memory_bench --gb 0.5 1.0 --threshold 0
    python -m benchmarks.converter.memory_bench --gb 2.2 --export /tmp/big.tflite --check --json mem.json

Needs free memory of about 2.5x the largest `--gb` (this machine: 23 GB, shared: one job at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import harness
from benchmarks.harness import ROOT, module_command, repo_env, write_json


def _status(field: str) -> int:
    """A /proc/self/status memory field, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def big_model(weight_bytes: int):
    """Two embedding tables (half the bytes each) and a small linear head; returns
    (module, sample_args). Rows are 1,024 floats."""
    import torch

    class TwoTables(torch.nn.Module):
        def __init__(self, rows: int):
            super().__init__()
            self.a = torch.nn.Embedding(rows, 1024)
            self.b = torch.nn.Embedding(rows, 1024)
            self.head = torch.nn.Linear(1024, 8)

        def forward(self, idx):
            return self.head(self.a(idx) + self.b(idx))

    rows = max(1, weight_bytes // (2 * 1024 * 4))
    with torch.no_grad():
        model = TwoTables(rows).eval()
    last = torch.tensor([[0, 1, rows // 2, rows - 1]])
    return model, (last,)


def child(gb: float, threshold: int | None, export: str | None, check: bool = False) -> dict:
    import torch

    import converter.writer as writer
    import litert_torch

    if threshold is not None:
        writer.EXTERNAL_DATA_THRESHOLD = threshold  # read at call time by write_flatbuffer_parts
    torch.manual_seed(0)
    base = _status("VmRSS")
    model, args = big_model(int(gb * 2**30))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    with_model = _status("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    edge = litert_torch.convert(model, args, progress=False)
    seconds = time.perf_counter() - start
    peak_convert = _status("VmHWM")
    result = {
        "gb": gb,
        "weight_bytes": weights,
        "file_bytes": len(edge),
        "convert_s": round(seconds, 2),
        "external_data": len(edge) > writer.EXTERNAL_DATA_THRESHOLD,
        "rss_before_model": base,
        "rss_with_model": with_model,
        "peak_convert": peak_convert,
        "convert_peak/weights": round((peak_convert - base) / weights, 3),
        "convert_extra/weights": round((peak_convert - with_model) / weights, 3),
    }
    if export:
        start = time.perf_counter()
        edge.export(export)
        peak = _status("VmHWM")
        result.update(
            {
                "export_s": round(time.perf_counter() - start, 2),
                "peak_export": peak,
                "export_peak/weights": round((peak - base) / weights, 3),
                "export_extra/weights": round((peak - with_model) / weights, 3),
            }
        )
    if check:  # after the peaks were read: load the file back and compare with PyTorch
        del edge
        from runtimes.litert import max_relative_error

        again = litert_torch.load(export)
        with torch.no_grad():
            expected = model(*args).numpy()
        result["max_relative_error"] = max_relative_error(again(*args), expected)
    return result


def measure(gb: float, threshold: int | None = None, export: str | None = None, check: bool = False) -> dict:
    """One measurement, in a fresh process (`check`: load the exported file and compare)."""
    cmd = module_command(__spec__.name, "--child", str(gb))
    if check:
        cmd.append("--check")
    if threshold is not None:
        cmd += ["--threshold", str(threshold)]
    if export:
        cmd += ["--export", export]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=repo_env(LITERT_TORCH_PROGRESS="0"))
    if done.returncode:
        raise RuntimeError(f"memory child failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, nargs="+", default=[0.5], help="GiB of weights per measurement")
    parser.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="bytes of constants above which data goes after the flatbuffer (default 2 GiB - 64 MiB)",
    )
    parser.add_argument("--export", default=None, help="also export to this path (deleted afterwards)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--check", action="store_true", help="load the exported file back and compare with PyTorch")
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child is not None:
        print(json.dumps(child(ns.child, ns.threshold, ns.export, ns.check)))
        return 0

    from rich.console import Console

    rows = []
    for gb in ns.gb:
        try:
            rows.append(measure(gb, ns.threshold, ns.export, ns.check and bool(ns.export)))
        finally:
            if ns.export and os.path.exists(ns.export):
                os.unlink(ns.export)
    columns = ("weights", "layout", "convert s", "convert peak/weights", "convert extra/weights",
               "export peak/weights", "max rel error")  # fmt: skip
    table = harness.table("Peak memory of conversion (RSS, relative to weight bytes)", columns, labels=0)
    for r in rows:
        table.add_row(
            f"{r['weight_bytes'] / 2**30:.2f} GiB",
            "external" if r["external_data"] else "inline",
            f"{r['convert_s']:.1f}",
            f"{r['convert_peak/weights']:.2f}",
            f"{r['convert_extra/weights']:.2f}",
            f"{r.get('export_peak/weights', float('nan')):.2f}",
            f"{r['max_relative_error']:.1e}" if "max_relative_error" in r else "-",
        )
    Console().print(table)
    if ns.json:
        write_json(ns.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
