"""Per-chip HBM of Llama training steps on TPU pods, compiled on this CPU host
(`tpu_backend.aot`), beside an analytic estimate: the figures of docs/aot.md.

    python -m benchmarks.device.aot_llama --case 1b-v5e-2x2
    python -m benchmarks.device.aot_llama --case 8b-fsdp-v5e-16x16
    python -m benchmarks.device.aot_llama --case 8b-fsdp-tp-v5e-16x16
    python -m benchmarks.device.aot_llama --list

One case per run (a big compile takes minutes and several GB). The analytic estimate,
per chip, with P parameters split over fsdp x tp chips and T = tokens per chip:
parameters 2P, gradients 2P, AdamW moments 4P bytes (all bf16, over the shards);
activations kept for the backward pass, per layer and token, bf16: the residual stream,
the two norms' inputs and the two block outputs (6 d, replicated over tp without sequence
parallel), q, k, v and the attention output (2 d + 2 kv, over tp), the FFN's w1 and w3
outputs (2 hidden, over tp); attention's scores (heads / tp x seq^2 per sequence, 4 bytes:
XLA's attention keeps them in float32) unless the flash kernel runs; the head's logits in
bf16 and float32 and their log-softmax (10 x vocabulary bytes per token, over tp).
Elementwise results (RoPE's rotated copies, SwiGLU's silu and product, RMSNorm's scaled
output) are not counted: XLA fuses them into their consumers and recomputes them in the
backward; counting them too (`--naive`) overestimates the compiled step by ~20%.
No activation checkpointing (the traced step cannot hold it yet).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# name: (size, topology, mesh, global batch)
CASES = {
    "1b-v5e-2x2": ("1b", "v5e:2x2", "fsdp=4", 8),
    "350m-v5e-1x1": ("350m", "v5e:1x1", "dp=1", 1),
    "8b-fsdp-v5e-16x16": ("8b", "v5e:16x16", "fsdp=256", 256),
    "8b-fsdp-tp-v5e-16x16": ("8b", "v5e:16x16", "fsdp=64,tp=4", 64),
}


def parameter_count(c) -> int:
    kv = c.key_value_heads * (c.dim // c.heads)
    block = 2 * c.dim * c.dim + 2 * c.dim * kv + 3 * c.dim * c.hidden + 2 * c.dim
    return c.layers * block + 2 * c.vocab * c.dim + c.dim


def analytic(c, rows: int, fsdp: int, tp: int, flash: bool, naive: bool = False) -> dict[str, float]:
    """Per-chip bytes by part (see the module docstring)."""
    shards = fsdp * tp
    p = parameter_count(c)
    kv = c.key_value_heads * (c.dim // c.heads)
    tokens = rows * c.seq
    if naive:  # every intermediate autograd would keep
        per_token = 2 * (8 * c.dim + (3 * c.dim + 3 * kv + 4 * c.hidden) / tp)
    else:
        per_token = 2 * (6 * c.dim + (2 * c.dim + 2 * kv + 2 * c.hidden) / tp)
    attention = 0 if flash else 4 * (c.heads / tp) * c.seq * c.seq * rows
    kept = c.layers * (per_token * tokens + attention)
    return {
        "parameters": 2 * p / shards,
        "gradients": 2 * p / shards,
        "optimizer": 4 * p / shards,
        "activations": kept + 10 * c.vocab * tokens / tp,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="Pallas kernels on (flash attention)")
    parser.add_argument("--json", help="append the row here (JSON lines)")
    parser.add_argument("--naive", action="store_true", help="count every elementwise intermediate as kept")
    args = parser.parse_args(argv)
    if args.list or not args.case:
        for name, case in CASES.items():
            print(f"{name:28} {case}")
        return 0

    import tpu_backend.aot as aot
    from examples.llama_fsdp_tp import PRESETS, aot_step
    from tpu_backend.aot.report import GiB

    size, topology, mesh, batch = CASES[args.case]
    step = aot_step(size, batch=batch)
    axes = aot.parse_mesh(mesh)
    began = time.perf_counter()
    row = {"case": args.case, "size": size, "topology": topology, "mesh": mesh, "batch": batch}
    row.update(kernels=args.kernels)
    try:
        report = aot.compile_step(
            step["model"],
            step["inputs"],
            step["targets"],
            step["loss"],
            topology=topology,
            mesh=axes,
            tensor_parallel=step["tensor_parallel"] if "tp" in axes else None,
            kernels=args.kernels,
            progress=lambda m: print(f"  [{time.perf_counter() - began:5.0f} s] {m}", flush=True),
        )
        row.update(report.to_json())
        compiled = report.total_bytes
    except aot.StepDoesNotFit as refused:
        print(refused)
        row.update(fits=False, refused=str(refused), required_temp_bytes=refused.required_temp_bytes)
        compiled = None
    rows = batch // (axes.get("fsdp", 1) * axes.get("dp", 1))
    estimate = analytic(PRESETS[size], rows, axes.get("fsdp", 1), axes.get("tp", 1), args.kernels, args.naive)
    row["analytic"] = estimate
    total = sum(estimate.values())
    print(f"{args.case}: {parameter_count(PRESETS[size]) / 1e9:.2f}B parameters, {rows} sequence(s) per chip")
    print(
        "  analytic: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in estimate.items()) + f"; total {total / GiB:.2f} GiB"
    )
    if compiled is not None:
        print(
            f"  compiled: {compiled / GiB:.2f} GiB per chip (ratio compiled / analytic {compiled / total:.2f}); "
            f"fits: {report.fits}; {report.summary()}"
        )
    elif row.get("required_temp_bytes"):
        print(f"  compiler: temporaries alone need {row['required_temp_bytes'] / GiB:.2f} GiB; does not fit")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
