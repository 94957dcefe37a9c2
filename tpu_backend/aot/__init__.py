"""Plan past one chip: compile a training step for a TPU pod on a CPU host, and know it fits.

    import torch, tpu_backend.aot as aot
    with torch.device("meta"):                    # no weights are allocated
        model = Llama(config).to(torch.bfloat16)
    report = aot.compile_step(
        model, inputs=[((256, 8192), torch.long)], targets=[((256, 8192), torch.long)], loss=loss_fn,
        topology="v5e:16x16", mesh="fsdp=64,tp=4", tensor_parallel=plan, remat="full",
    )
    report.total_bytes, report.fits, report.collectives, report.flops

    python -m tpu_backend.aot examples/llama_fsdp_tp.py --topology v5e:16x16 --mesh fsdp=64,tp=4 --size 8b

The step is the device's own, the one `tpu_backend.TrainStep` runs: AOTAutograd's joint
forward + backward and PyTorch's foreach AdamW traced on fake tensors through the device's
dispatch (`capture.py`), the repeated blocks checkpointed per `remat` (`remat.py`), run
through the device's FX -> JAX interpreter with the shardings `tpu_backend.distributed`
gives and FSDP's gather-where-used stated (`plan.py`), compiled by libtpu for compile-only
devices of the topology, and read back per chip (`report.py`).

| module | owns |
| --- | --- |
| `capture.py` | `trace_step`: the step as one ATen graph over its parameters, optimizer state and batch |
| `remat.py` | activation checkpointing of the repeated blocks in one program (fenced recomputation) |
| `plan.py` | `compile_step`: meshes over compile-only devices, argument shardings, the compile |
| `report.py` | `Report` (per-chip memory, FLOPs, collectives, MFU estimate, seconds), `StepDoesNotFit`, HBM per chip |
| `__main__.py` | the command: a script's `aot_step(...)` compiled, a table printed, JSON written |
"""

from tpu_backend.aot.capture import StepGraph, StepInput, trace_step
from tpu_backend.aot.plan import compile_step, device_mesh, parse_mesh
from tpu_backend.aot.report import HBM_BYTES, Report, StepDoesNotFit, count_collectives, hbm_bytes

__all__ = [
    "HBM_BYTES",
    "Report",
    "StepDoesNotFit",
    "StepGraph",
    "StepInput",
    "compile_step",
    "count_collectives",
    "device_mesh",
    "hbm_bytes",
    "parse_mesh",
    "trace_step",
]
