"""Compile a traced training step for a TPU topology on this host and read what it costs.

The step's graph (`capture.trace_step`) runs through the device's FX -> JAX interpreter
(`tpu_backend.compile.fx_to_jax`) inside one `jax.jit`, whose arguments are
`ShapeDtypeStruct`s with the shardings the distributed API gives (`tpu_backend.
distributed`): parameters, their gradients' owners and optimizer state as `fully_shard`
and `parallelize_module` place them, batches as `shard_batch` splits them. libtpu's
compiler partitions it for compile-only devices of the named topology
(`kernels.tpu.compile_only_devices`) and reports per-chip memory and cost; the same
compiler refuses what the chip would refuse.

Mesh axes: "dp" (data parallel: parameters replicated, `DataParallel`), "fsdp"
(parameters, gradients and optimizer state split, `fully_shard`), "tp" (tensor parallel,
`parallelize_module` with a plan). The batch is split over "dp" and "fsdp" together.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from torch import nn

from tpu_backend.aot.capture import BATCH, BUFFER, LR, PARAM, STEP_COUNT, StepGraph, trace_step
from tpu_backend.aot.report import (
    Report,
    StepDoesNotFit,
    argument_buffers,
    hbm_bytes,
    is_out_of_memory,
    read_compiled,
)
from tpu_backend.distributed.fsdp import parameter_sharding
from tpu_backend.distributed.mesh import batch_sharding, partition_spec
from tpu_backend.distributed.tensor_parallel import plan_placements
from tpu_backend.ops.registry import jax_dtype

AXES = ("dp", "fsdp", "tp")
BATCH_AXES = ("dp", "fsdp")  # the batch is split over these together


def parse_mesh(text: str) -> dict[str, int]:
    """`"fsdp=64,tp=4"` -> {"fsdp": 64, "tp": 4}."""
    mesh = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition("=")
        if not size.isdigit():
            raise ValueError(f"mesh {text!r}: write axes as name=size, e.g. fsdp=64,tp=4")
        mesh[name.strip()] = int(size)
    return mesh


def device_mesh(topology: str, axes: Mapping[str, int]):
    """A mesh over the compile-only devices of `topology` (as `init_mesh` builds one over a
    run's devices: automatic axes, JAX's topology-aware device order)."""
    from kernels.tpu import compile_only_devices

    unknown = [a for a in axes if a not in AXES]
    if unknown:
        raise ValueError(f"mesh axes {unknown}: use {', '.join(AXES)} (data parallel, FSDP, tensor parallel)")
    devices = compile_only_devices(topology)
    if math.prod(axes.values()) != len(devices):
        raise ValueError(
            f"mesh {dict(axes)} has {math.prod(axes.values())} devices but {topology} has {len(devices)} chips: "
            "make the axis sizes multiply to the chip count"
        )
    names = tuple(axes)
    return jax.make_mesh(tuple(axes.values()), names, devices=devices, axis_types=(AxisType.Auto,) * len(names))


def input_shardings(step: StepGraph, model: nn.Module, mesh, tensor_parallel: Mapping | None) -> list[NamedSharding]:
    """Per step argument, the sharding the distributed API would give it."""
    tp_specs = {}
    if tensor_parallel:
        if "tp" not in mesh.axis_names:
            raise ValueError("a tensor-parallel plan needs a 'tp' mesh axis (e.g. --mesh fsdp=64,tp=4)")
        tp_specs = plan_placements(model, mesh, tensor_parallel, "tp")
    shapes = {s.name: s.shape for s in step.inputs if s.role == PARAM}
    param_shardings = {}
    for name, shape in shapes.items():
        spec = partition_spec(tp_specs[name], mesh, len(shape)) if name in tp_specs else PartitionSpec()
        for dim, entry in enumerate(spec):
            parts = math.prod(mesh.shape[a] for a in ((entry,) if isinstance(entry, str) else entry or ()))
            if parts > 1 and shape[dim] % parts:
                raise ValueError(f"{name}: dim {dim} of {shape} cannot be split over tp={parts}")
        if "fsdp" in mesh.axis_names:
            param_shardings[name] = parameter_sharding(shape, mesh, "fsdp", spec)
        else:
            param_shardings[name] = NamedSharding(mesh, spec)
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_axes = [a for a in mesh.axis_names if a in BATCH_AXES]
    shardings = []
    for s in step.inputs:
        if s.role == PARAM:
            shardings.append(param_shardings[s.name])
        elif s.role in (BUFFER, STEP_COUNT, LR) or (s.role == BATCH and not batch_axes):
            shardings.append(replicated)
        elif s.role == BATCH:
            parts = math.prod(mesh.shape[a] for a in batch_axes)
            if not s.shape or s.shape[0] % parts:
                raise ValueError(
                    f"{s.name}: a batch of {s.shape[0] if s.shape else 0} cannot be split over "
                    f"{' x '.join(batch_axes)} = {parts} chips: use a multiple of {parts}"
                )
            shardings.append(batch_sharding(mesh, batch_axes, len(s.shape)))
        else:  # optimizer state: its parameter's sharding (keep_training_state_sharded)
            shardings.append(param_shardings[s.of])
    return shardings


@contextlib.contextmanager
def _ticking(progress: Callable[[str], None] | None, what: str, every: float = 10.0):
    """Say `what` now and every `every` seconds until the block ends (long compiles)."""
    if progress is None:
        yield
        return
    began = time.perf_counter()
    done = threading.Event()

    def tick():
        while not done.wait(every):
            progress(f"{what}... {time.perf_counter() - began:.0f} s")

    progress(f"{what}...")
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def _kernel_context(topology: str, kernels: bool, mesh):
    """Kernels on: trace and lower inside `kernels.tpu.lowering_for(chip)`, where the
    device's routers take the compiled Pallas path, as they do on the chip, each call
    split over the mesh (`kernels.sharded`: batch over dp and fsdp, heads and vocabulary
    over tp)."""
    if not kernels:
        from tpu_backend import kernels as device_kernels

        with device_kernels.use("off"):
            yield
        return
    from kernels.sharded import KernelMesh, split_over
    from kernels.tpu import lowering_for
    from tpu_backend import kernels as device_kernels

    batch = tuple(a for a in mesh.axis_names if a in BATCH_AXES)
    kernel_mesh = KernelMesh(mesh, batch, "tp" if "tp" in mesh.axis_names else None)
    mode = "auto" if device_kernels.mode() == "off" else device_kernels.mode()  # asked for: the chip's default
    chips = mesh if mesh.size > 1 else None  # one chip: no shard_map, lowering_for's own one-chip mesh
    with device_kernels.use(mode), lowering_for(topology.partition(":")[0], chips), split_over(kernel_mesh):
        yield


def compile_step(
    model: nn.Module,
    inputs: Sequence,
    targets: Sequence,
    loss: Callable,
    *,
    topology: str,
    mesh: Mapping[str, int] | str,
    tensor_parallel: Mapping | None = None,
    optimizer: str = "adamw",
    kernels: bool | None = None,
    remat: str = "none",
    check: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Compile one training step of `model` for TPU `topology` (e.g. "v5e:16x16") sharded
    over `mesh` (e.g. {"fsdp": 64, "tp": 4} or "fsdp=64,tp=4"), on this host.

    `inputs`: what the model takes, `targets`: what `loss(output, *targets)` takes after the
    output, both global batches (tensors of any device, or `(shape, dtype)` pairs); build
    big models on `torch.device("meta")`: nothing is allocated. `tensor_parallel`: a
    `parallelize_module` plan for the "tp" axis. `kernels`: the Pallas kernels on (None:
    unless `TPU_KERNELS=off`). `check`: raise `StepDoesNotFit` when a chip's HBM is too
    small. `remat`: activation checkpointing of the model's repeated blocks, as training
    takes it: "none", "full" (keep each block's input, recompute the rest) or "matmuls" (keep
    its products with weights too; `remat.py`). Returns the per-chip `Report`."""
    from tpu_backend import kernels as device_kernels

    axes = parse_mesh(mesh) if isinstance(mesh, str) else dict(mesh)
    say = progress or (lambda _message: None)
    jax_mesh = device_mesh(topology, axes)
    if kernels is None:
        kernels = device_kernels.mode() != "off"
    began = time.perf_counter()
    with _kernel_context(topology, kernels, jax_mesh):
        with _ticking(progress, "tracing the step (fake tensors)"):
            step = trace_step(model, inputs, targets, loss, optimizer, remat)
        traced = time.perf_counter() - began
        say(f"traced: {step.nodes} graph nodes, {len(step.inputs)} arguments ({traced:.1f} s)")
        shardings = input_shardings(step, model, jax_mesh, tensor_parallel)
        try:
            compiled, lower_seconds, compile_seconds = _compile(step, shardings, jax_mesh, progress)
        except Exception as error:
            if "Mosaic kernels cannot be automatically partitioned" in str(error):
                raise NotImplementedError(
                    f"tpu_backend.aot: a Pallas kernel of the step is not split over the {len(jax_mesh.devices.flat)}-chip "
                    "mesh (XLA cannot partition a Mosaic kernel; kernels.sharded wraps flash attention, the norms and "
                    "cross-entropy in a shard_map, not others): plan with the kernels off (TPU_KERNELS=off, --kernels off)"
                ) from error
            if is_out_of_memory(error):
                arguments = argument_buffers(step, shardings)
                raise StepDoesNotFit(None, str(error), topology, arguments) from error
            raise
    report = read_compiled(
        compiled,
        step,
        shardings,
        topology=topology,
        mesh=axes,
        hbm=hbm_bytes(topology),
        seconds={"trace": traced, "lower": lower_seconds, "compile": compile_seconds},
        kernels=kernels,
        optimizer=optimizer,
        remat=remat,
    )
    if check and not report.fits:
        raise StepDoesNotFit(report)
    return report


def fsdp_constraints(step: StepGraph, shardings: list[NamedSharding]) -> tuple[Callable | None, Callable | None]:
    """FSDP's contract for the step's program: each parameter is gathered whole over the "fsdp"
    axis where it is used, and each gradient is reduced back to its shards. Left to itself,
    XLA's sharding propagation may keep a weight split and split the activations over the
    contracting dimension instead: for the output head that is the whole global batch's
    logits on every chip (31 GiB per chip for Llama-3-8B at 64 x 8192 tokens on v5e:16x16).
    (None, None) without an "fsdp" axis."""
    n = sum(s.role == PARAM for s in step.inputs)
    sharded = shardings[:n]
    if not sharded or "fsdp" not in sharded[0].mesh.axis_names:
        return None, None
    whole = [NamedSharding(s.mesh, _without_axis(s.spec, "fsdp")) for s in sharded]
    constrain = jax.lax.with_sharding_constraint
    return (lambda params: constrain(list(params), whole)), (lambda grads: constrain(list(grads), sharded))


def _without_axis(spec: PartitionSpec, axis: str) -> PartitionSpec:
    entries = []
    for entry in spec:
        kept = tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a != axis)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries)


def _compile(step: StepGraph, shardings: list[NamedSharding], mesh, progress):
    """(compiled executable, lowering seconds, compile seconds) of the step's jitted function;
    parameters and optimizer state are donated and keep their shardings, as in
    `compile_for_tpu`'s donating program."""
    function = step.function(*fsdp_constraints(step, shardings))
    args = [
        jax.ShapeDtypeStruct(s.shape, np.dtype(jax_dtype(s.dtype)), sharding=sharding)
        for s, sharding in zip(step.inputs, shardings)
    ]
    replicated = NamedSharding(mesh, PartitionSpec())
    out_shardings = tuple([replicated] + [shardings[i] for i in step.written])
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    key = [jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)] if step.needs_rng else []  # dropout
    donate = tuple(i + len(key) for i in step.written if step.inputs[i].shape)
    jitted = jax.jit(function, out_shardings=out_shardings, donate_argnums=donate)
    began = time.perf_counter()
    with _ticking(progress, "lowering to StableHLO"):
        lowered = jitted.lower(*key, *args)
    lowered_at = time.perf_counter()
    with _ticking(progress, f"compiling for {len(mesh.devices.flat)} chips with libtpu"):
        compiled = lowered.compile()
    return compiled, lowered_at - began, time.perf_counter() - lowered_at
