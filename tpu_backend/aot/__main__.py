"""`python -m tpu_backend.aot SCRIPT --topology v5e:16x16 --mesh fsdp=64,tp=4 [--size 8b]`

Compiles SCRIPT's training step for a TPU topology on this host (no chip needed) and
prints, per chip, memory against HBM, FLOPs, bytes accessed, collectives and compile
time; writes the same as JSON (`--json`). Exits 1 when the step does not fit a chip.

SCRIPT defines `aot_step(size=..., batch=..., seq=...)` returning a dict with `model`
(built on the meta device), `inputs`, `targets` (tensors or `(shape, dtype)` pairs, the
GLOBAL batch), `loss(output, *targets)` and optionally `tensor_parallel` (a
`tpu_backend.distributed.parallelize_module` plan, used when the mesh has a "tp" axis);
see `examples/llama_fsdp_tp.py`. Only the options the function takes are passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import time


def load_step(script: str, options: dict) -> dict:
    """Import SCRIPT (as a module, its `__main__` guard does not run) and call its `aot_step`."""
    if not os.path.exists(script):
        raise SystemExit(f"{script}: no such file")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    spec = importlib.util.spec_from_file_location("_aot_script", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    if not hasattr(module, "aot_step"):
        raise SystemExit(
            f"{script} defines no aot_step(...): add one returning dict(model=..., inputs=..., targets=..., loss=...) "
            "(see examples/llama_fsdp_tp.py)"
        )
    accepted = inspect.signature(module.aot_step).parameters
    unknown = [k for k, v in options.items() if v is not None and k not in accepted]
    if unknown:
        raise SystemExit(f"{script}'s aot_step takes no {', '.join('--' + k for k in unknown)}")
    return module.aot_step(**{k: v for k, v in options.items() if v is not None})


def table(report):
    """The report as a rich Table."""
    from rich.table import Table

    from tpu_backend.aot.report import gib

    t = Table(title=f"{report.topology} ({report.chips} x {report.device_kind}), mesh {report.mesh}, per chip")
    t.add_column("figure")
    t.add_column("value", justify="right")
    hbm = report.hbm_bytes
    rows = [
        ("parameters (whole model)", f"{report.parameters / 1e9:.3f} B"),
        ("arguments", gib(report.argument_bytes)),
        ("  parameters", gib(report.state_bytes["parameters"])),
        ("  optimizer state", gib(report.state_bytes["optimizer state"])),
        ("  batch + buffers", gib(report.state_bytes["batch"] + report.state_bytes["buffers"])),
        ("outputs (not aliased)", gib(report.output_bytes - report.alias_bytes)),
        ("temporaries", gib(report.temp_bytes)),
        ("total", f"{gib(report.total_bytes)} ({100 * report.total_bytes / hbm:.0f}% of {gib(hbm)})"),
        ("fits", "[green]yes[/green]" if report.fits else "[red]NO[/red]"),
        ("rematerialised instructions", str(report.rematerialized)),
        ("FLOPs", f"{report.flops / 1e12:.2f} T" if report.flops >= 1e11 else f"{report.flops / 1e9:.2f} G"),
        ("bytes accessed", gib(report.bytes_accessed)),
        *((f"  {name}", str(n)) for name, n in report.collectives.items()),
        ("Pallas kernel calls", _kernels_text(report)),
        ("activation checkpointing", report.remat),
        ("MFU at the roofline (upper bound)", _mfu_text(report)),
        ("trace / lower / compile", " / ".join(f"{report.seconds[k]:.1f} s" for k in ("trace", "lower", "compile"))),
    ]
    rows.insert(rows.index(("bytes accessed", gib(report.bytes_accessed))) + 1, ("collectives", ""))
    for row in rows:
        t.add_row(*row)
    return t


def _mfu_text(report) -> str:
    if report.mfu_estimate is None:
        return "- (the batch is not token ids)"
    return (
        f"{100 * report.mfu_estimate:.1f}% (6 x {report.parameters / 1e9:.2f} B parameters x {report.tokens} tokens "
        f"in {1e3 * report.roofline_seconds:.0f} ms at the chip's peak FLOP/s or HBM bandwidth)"
    )


def _kernels_text(report) -> str:
    if not report.kernels:
        return "off"
    return ", ".join(f"{name} {n}" for name, n in report.kernel_calls.items()) or "none (XLA took every call)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_backend.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="a Python file defining aot_step(...), e.g. examples/llama_fsdp_tp.py")
    parser.add_argument("--topology", required=True, help="v5e:2x2 ... v5e:16x16, v6e:4x4, v5p:2x2x1, v4:2x2x1")
    parser.add_argument("--mesh", required=True, help="axis sizes, e.g. fsdp=64,tp=4 (axes: dp, fsdp, tp)")
    parser.add_argument("--size", help="the script's model size (examples/llama_fsdp_tp.py: tiny, small, 350m, 1b, 8b)")
    parser.add_argument("--batch", type=int, help="global batch (sequences)")
    parser.add_argument("--seq", type=int, help="sequence length")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    parser.add_argument("--kernels", choices=["on", "off"], help="Pallas kernels (default: off if TPU_KERNELS=off)")
    parser.add_argument(
        "--remat",
        choices=["none", "full", "matmuls"],
        default="none",
        help="activation checkpointing of the model's repeated blocks: full keeps each block's input and "
        "recomputes the rest, matmuls keeps its products with weights too (default: none)",
    )
    parser.add_argument("--json", help="write the report here (default: aot-<topology>-<mesh>.json)")
    args = parser.parse_args(argv)

    from rich.console import Console

    import tpu_backend.aot as aot

    console = Console()
    began = time.perf_counter()

    def progress(message: str) -> None:
        console.print(f"[dim]{time.perf_counter() - began:6.1f} s[/dim] {message}")

    step = load_step(args.script, {"size": args.size, "batch": args.batch, "seq": args.seq})
    mesh = aot.parse_mesh(args.mesh)
    plan = step.get("tensor_parallel") if "tp" in mesh else None
    kernels = None if args.kernels is None else args.kernels == "on"
    try:
        report = aot.compile_step(
            step["model"],
            step["inputs"],
            step["targets"],
            step["loss"],
            topology=args.topology,
            mesh=mesh,
            tensor_parallel=plan,
            optimizer=args.optimizer,
            kernels=kernels,
            remat=args.remat,
            progress=progress,
        )
    except aot.StepDoesNotFit as refused:  # the compiler itself refused (out of HBM)
        console.print(f"[red]{refused}[/red]")
        return 1
    console.print(table(report))
    path = args.json or f"aot-{args.topology.replace(':', '_')}-{args.mesh.replace('=', '').replace(',', '_')}.json"
    report.dump(path)
    console.print(f"report written to {path}")
    if not report.fits:
        console.print(f"[red]{aot.StepDoesNotFit(report)}[/red]")
        return 1
    for tip in report.advice():
        console.print(f"[yellow]tight:[/yellow] {tip}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
