"""Check tpu_backend.aot's memory prediction on a real chip: predicted bytes per chip for
`v5e:1x1` against the peak bytes the chip held while running the same training step.

    python -m benchmarks.device.aot_chip_check                       # Llama 374M, bf16, batch 1 x 2048, AdamW
    python -m benchmarks.device.aot_chip_check --size 350m --batch 4 --remat full --kernels on

One process, on a TPU VM (one chip): first `tpu_backend.aot.compile_step` compiles the step
for compile-only devices of `--topology` (no memory used on the chip), then the model is
built with real weights on the "tpu" device and `tpu_backend.TrainStep` runs the same step
(the same traced program: one program, parameters and AdamW state donated and updated in
place, `--remat` and `--kernels` as planned). The chip's peak after the steps is compared
with the prediction; target: within 10%. On a TPU the peak is two figures of
`memory_stats()`: `peak_bytes_in_use` (buffers: arguments, outputs and program code) plus
`peak_bytes_reserved` (the region a running program's temporaries live in, which
`peak_bytes_in_use` leaves out: a probe with a 512 MiB temporary showed it there alone).
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="350m", help="examples/llama_fsdp_tp.py preset (350m, 1b, ...)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--topology", default="v5e:1x1")
    parser.add_argument("--remat", default="none", choices=("none", "full", "matmuls"))
    parser.add_argument("--kernels", default="off", choices=("on", "off"), help="the Pallas kernels, in both")
    parser.add_argument(
        "--report",
        help="a JSON report of the same step compiled elsewhere (python -m tpu_backend.aot --json): no compile here",
    )
    args = parser.parse_args(argv)

    import jax
    import torch

    import tpu_backend
    import tpu_backend.aot as aot
    from examples.llama_fsdp_tp import Llama, aot_step

    kernels = args.kernels == "on"
    tpu_backend.kernels.use("auto" if kernels else "off")
    step = aot_step(args.size, batch=args.batch, seq=args.seq)
    began = time.perf_counter()
    if args.report:
        import json
        from types import SimpleNamespace

        with open(args.report) as f:
            report = SimpleNamespace(**json.load(f))
        print(f"prediction from {args.report}: {report.total_bytes:,} bytes per chip")
    else:
        report = aot.compile_step(
            step["model"],
            step["inputs"],
            step["targets"],
            step["loss"],
            topology=args.topology,
            mesh="dp=1",
            kernels=kernels,
            remat=args.remat,
            progress=lambda m: print(f"  [{time.perf_counter() - began:5.0f} s] {m}", flush=True),
        )
        print(report.summary(), flush=True)

    # The same step on the chip: the program TrainStep traces is the one planned above.
    config = step["model"].config
    torch.manual_seed(0)
    model = Llama(config).to(torch.bfloat16).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = tpu_backend.TrainStep(model, step["loss"], optimizer, remat=args.remat)
    g = torch.Generator().manual_seed(0)
    losses, times = [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, config.vocab, (args.batch, config.seq + 1), generator=g)
        inputs, targets = tokens[:, :-1].to("tpu"), tokens[:, 1:].to("tpu")
        start = time.perf_counter()
        loss = run(inputs, targets)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    stats = jax.devices()[0].memory_stats() or {}
    buffers, scratch = stats.get("peak_bytes_in_use"), stats.get("peak_bytes_reserved", 0)
    predicted = report.total_bytes
    print(f"losses: {', '.join(f'{x:.4f}' for x in losses)}; step seconds: {', '.join(f'{t:.2f}' for t in times)}")
    print(f"{'':28}{'bytes':>16}{'GiB':>10}")
    print(f"{'predicted (aot, ' + args.topology + ')':28}{predicted:>16,}{predicted / 2**30:>10.3f}")
    print(f"  {'arguments':26}{report.argument_bytes:>16,}")
    print(f"  {'temporaries':26}{report.temp_bytes:>16,}")
    print(f"  {'outputs - aliased':26}{report.output_bytes - report.alias_bytes:>16,}")
    print(f"  {'program code':26}{report.code_bytes:>16,}")
    if buffers is None:
        print("measured: this device reports no peak_bytes_in_use (not a TPU?)")
        return 1
    peak = buffers + scratch
    ratio = peak / predicted
    print(f"{'measured peak':28}{peak:>16,}{peak / 2**30:>10.3f}")
    print(f"  {'peak_bytes_in_use':26}{buffers:>16,}  (buffers and program code)")
    print(f"  {'peak_bytes_reserved':26}{scratch:>16,}  (temporaries)")
    print(f"ratio measured / predicted: {ratio:.3f} ({'within' if abs(ratio - 1) <= 0.10 else 'OUTSIDE'} 10%)")
    return 0 if abs(ratio - 1) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
