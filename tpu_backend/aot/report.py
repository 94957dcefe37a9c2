"""What a compiled training step costs per chip: memory against HBM, FLOPs, collectives.

Read from the executable libtpu compiled (`memory_analysis()`, `cost_analysis()`, the
optimized HLO text); the sharded program is the per-chip program, so every figure is
per chip. Total bytes = arguments + outputs - aliased (donated parameters and optimizer
state come back in their own buffers) + temporaries + the program's code: what the chip
must hold at the step's peak.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from tpu_backend.aot.capture import BATCH, BUFFER, PARAM, StepGraph

GiB = 1 << 30

# HBM per chip (bytes), by the topology name's prefix.
HBM_BYTES = {"v5e": 16 * GiB, "v5litepod": 16 * GiB, "v6e": 32 * GiB, "v5p": 95 * GiB, "v4": 32 * GiB}
# What libtpu lets a program use of it where known (a v5e reports bytes_limit 16,909,336,064 =
# 15.75 GiB and its compiler refuses beyond "available HBM (15.75G)").
USABLE_HBM_BYTES = {"v5e": 16_909_336_064, "v5litepod": 16_909_336_064}

# Peak dense bf16 FLOP/s and HBM bytes/s of one chip (the vendor's published figures).
CHIP_PEAKS = {
    "v5e": (197e12, 819e9),
    "v5litepod": (197e12, 819e9),
    "v6e": (918e12, 1640e9),
    "v5p": (459e12, 2765e9),
    "v4": (275e12, 1228e9),
}

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
# `%name = bf16[8,1024]{1,0:T(8,128)(2,1)} opcode(` in the entry computation
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}
_DTYPE_BYTES.update({"s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1})


def hbm_bytes(topology: str) -> int:
    """HBM a program may use on one chip of `topology` ("v5e:16x16" -> 15.75 GiB of 16)."""
    kind = topology.partition(":")[0]
    if kind not in HBM_BYTES:
        raise ValueError(f"unknown TPU {kind!r} in topology {topology!r}: use one of {', '.join(HBM_BYTES)}")
    return USABLE_HBM_BYTES.get(kind, HBM_BYTES[kind])


def gib(n: float) -> str:
    """Bytes for people: GiB, or MiB below one GiB."""
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:.1f} MiB"


@dataclass
class Buffer:
    """A large array of the compiled program: what it is and its bytes per chip."""

    name: str
    bytes: int
    what: str


@dataclass
class Report:
    """Per-chip figures of one training step compiled for a topology."""

    topology: str
    chips: int
    device_kind: str
    mesh: dict[str, int]
    optimizer: str
    kernels: bool
    parameters: int  # the model's trainable parameters (whole model)
    hbm_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    state_bytes: dict[str, int]  # per chip, from the shardings: parameters, optimizer state, buffers, batch
    flops: float
    bytes_accessed: float
    collectives: dict[str, int]
    seconds: dict[str, float]
    largest: list[Buffer] = field(default_factory=list)
    # instructions libtpu recomputed to fit HBM (its rematerialisation): > 0 means the
    # step fits only by trading FLOPs for memory, and temporaries sit near the limit
    rematerialized: int = 0
    # Pallas (Mosaic) kernel calls in the compiled program, by kernel name (a call inside
    # a loop body counts once)
    kernel_calls: dict[str, int] = field(default_factory=dict)
    remat: str = "none"  # the activation checkpointing the step was planned with
    tokens: int = 0  # tokens of the global batch (its first input's ids), 0 when not token ids

    @property
    def model_flops(self) -> float:
        """The step's useful FLOPs per chip, 6 x parameters x tokens / chips (forward 2, backward
        4 per parameter and token; attention's score FLOPs and any recomputation not counted)."""
        return 6.0 * self.parameters * self.tokens / self.chips

    @property
    def roofline_seconds(self) -> float:
        """The least time the compiled program can take on one chip: its FLOPs at the chip's
        peak or its bytes at HBM bandwidth, whichever is longer (collectives overlapped)."""
        flops, bandwidth = CHIP_PEAKS[self.topology.partition(":")[0]]
        return max(self.flops / flops, self.bytes_accessed / bandwidth)

    @property
    def mfu_estimate(self) -> float | None:
        """`model_flops` over what the chip's peak does in `roofline_seconds`: an upper bound
        on the step's MFU that charges recomputation and memory-bound work (a step on the chip
        also loses time to collectives it cannot overlap and to kernels below peak)."""
        if not self.tokens or not self.flops:
            return None
        return self.model_flops / (self.roofline_seconds * CHIP_PEAKS[self.topology.partition(":")[0]][0])

    @property
    def total_bytes(self) -> int:
        """What the chip holds at the step's peak: the program's code lives in HBM too
        (seen on a v5e: `peak_bytes_in_use` counts it)."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    def advice(self) -> list[str]:
        """What would shrink the step, from the largest part of its memory."""
        tips = []
        state = self.state_bytes.get("parameters", 0) + self.state_bytes.get("optimizer state", 0)
        fsdp = self.mesh.get("fsdp", 1)
        if state > self.hbm_bytes / 4:
            more = f"fsdp={fsdp * 2}" if fsdp > 1 else "an fsdp axis"
            tips.append(
                f"parameters and optimizer state take {gib(state)} per chip: more FSDP shards ({more}) halve them"
            )
        if self.temp_bytes > self.hbm_bytes / 4:
            rows = self.state_bytes.get("batch rows per chip", 0)
            levers = []
            if self.remat != "full":
                levers.append("activation checkpointing per block (--remat full)")
            if rows > 1:
                levers.append(f"a smaller micro-batch ({rows} -> {rows // 2} sequences per chip)")
            levers.append("more tensor parallelism" if rows <= 1 else "a shorter sequence")
            tips.append(
                f"temporaries (activations kept for the backward pass, gathered weights) take {gib(self.temp_bytes)}: "
                + ", or ".join(levers)
                + " shrinks them"
            )
        return tips

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(total_bytes=self.total_bytes, fits=self.fits, advice=self.advice(), mfu_estimate=self.mfu_estimate)
        return out

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=2)

    def summary(self) -> str:
        verdict = "fits" if self.fits else "does NOT fit"
        if self.rematerialized:
            verdict += f", {self.rematerialized} instructions rematerialised to fit"
        return (
            f"{self.topology} mesh {self.mesh}: {gib(self.total_bytes)} per chip of {gib(self.hbm_bytes)} HBM "
            f"({verdict}); {self.flops / 1e12:.1f} TFLOP, "
            + (", ".join(f"{n} {k}" for k, n in self.collectives.items() if n) or "no collectives")
        )


class StepDoesNotFit(RuntimeError):
    """The step needs more HBM per chip than the chip has: `.report` holds the figures, or
    is None when libtpu's compiler refused the program itself (its message is kept: it
    lists the largest allocations)."""

    def __init__(
        self,
        report: Report | None,
        compiler_message: str | None = None,
        topology: str = "",
        arguments: list[Buffer] | None = None,
    ):
        self.report = report
        self.required_temp_bytes = _required_temporaries(compiler_message or "")
        if report is None:
            lines = [
                f"the training step does not fit {topology}: libtpu's compiler ran out of HBM "
                "(it already rematerialises what it can).",
                (compiler_message or "").strip()[:2000],
            ]
            held = sum(b.bytes for b in arguments or [])
            usable = _available_hbm(compiler_message or "") or 16 * GiB
            if arguments and held > usable / 4:
                lines.append(f"The step's arguments take {gib(held)} per chip; the largest:")
                lines += [
                    f"  {gib(b.bytes):>10}  {b.name}  ({b.what})" for b in sorted(arguments, key=lambda b: -b.bytes)[:6]
                ]
                lines.append(
                    "- parameters and optimizer state: more FSDP shards (a larger fsdp axis) split them further"
                )
            elif arguments:
                lines.append(
                    f"The step's arguments (parameters, optimizer state, batch) take only {gib(held)} per chip: "
                    "the temporaries (activations kept for the backward pass) are what does not fit."
                )
            lines.append(
                "- activations: activation checkpointing per block, the flash-attention kernel, a smaller "
                "micro-batch or more tensor parallelism shrink them"
            )
            super().__init__("\n".join(lines))
            return
        lines = [
            f"the training step does not fit {report.topology}: it needs {gib(report.total_bytes)} per chip "
            f"(arguments {gib(report.argument_bytes)}, temporaries {gib(report.temp_bytes)}), "
            f"the chip has {gib(report.hbm_bytes)} of HBM."
        ]
        if report.largest:
            lines.append("Largest buffers per chip:")
            lines += [f"  {gib(b.bytes):>10}  {b.name}  ({b.what})" for b in report.largest[:6]]
        lines += [f"- {tip}" for tip in report.advice()]
        super().__init__("\n".join(lines))


def _required_temporaries(message: str) -> int | None:
    """libtpu's "memory required for HLO temporaries (301.57G)" in bytes, or None."""
    found = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT])\)", message)
    if not found:
        return None
    return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2)))


def _available_hbm(message: str) -> int | None:
    found = re.search(r"available HBM \(([\d.]+)([KMGT])\)", message)
    return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2))) if found else None


def is_out_of_memory(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "exceeds the limit" in text


def count_collectives(hlo_text: str) -> dict[str, int]:
    """How many of each collective the optimized HLO issues (async pairs count once; one
    inside a loop body counts once, however many times the loop runs)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for match in _COLLECTIVE.finditer(hlo_text):
        counts[match.group(1)] += 1
    return counts


def count_kernel_calls(hlo_text: str) -> dict[str, int]:
    """Mosaic kernel calls (`tpu_custom_call`) in the optimized HLO, by the kernel's name."""
    counts: dict[str, int] = {}
    for name in re.findall(r'%([A-Za-z_]+)(?:\.\d+)* = [^\n]*custom_call_target="tpu_custom_call"', hlo_text):
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def count_rematerialized(hlo_text: str) -> int:
    """Instructions the compiler's rematerialisation added (named `<original>.remat...`)."""
    return len(re.findall(r"^\s*(?:ROOT )?%?[\w.\-]*\.remat[\w.\-]* = ", hlo_text, flags=re.MULTILINE))


def _entry_lines(hlo_text: str):
    inside = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY "):
            inside = True
        elif inside and line.startswith("}"):
            return
        elif inside:
            yield line


def largest_buffers(hlo_text: str, argument_names: list[str], limit: int = 8) -> list[Buffer]:
    """The largest arrays of the program's entry computation (arguments by the step's
    names, results by the op that made them), per chip, largest first."""
    found = []
    for line in _entry_lines(hlo_text):
        match = _INSTRUCTION.match(line)
        if not match or match.group(2) not in _DTYPE_BYTES:
            continue
        name, dtype, dims, opcode = match.groups()
        shape = [int(d) for d in dims.split(",") if d]
        nbytes = math.prod(shape) * _DTYPE_BYTES[dtype]
        if opcode == "parameter":
            index = int(re.search(r"parameter\((\d+)\)", line).group(1))
            label = argument_names[index] if index < len(argument_names) else name
            found.append(Buffer(label, nbytes, f"argument {dtype}{shape}"))
        elif opcode not in ("get-tuple-element", "bitcast", "tuple", "copy-done", "all-gather-done"):
            op = _OP_NAME.search(line)
            found.append(Buffer(name, nbytes, f"{opcode} {dtype}{shape}" + (f" from {op.group(1)}" if op else "")))
    found.sort(key=lambda b: -b.bytes)
    return found[:limit]


def _per_chip_bytes(shape, dtype_bytes: int, sharding) -> int:
    return math.prod(sharding.shard_shape(tuple(shape))) * dtype_bytes if shape else dtype_bytes


def argument_buffers(step: StepGraph, shardings) -> list[Buffer]:
    """Each argument of the step with its bytes per chip (from its sharding)."""
    return [
        Buffer(spec.name, _per_chip_bytes(spec.shape, spec.dtype.itemsize, sharding), f"{spec.role} {sharding.spec}")
        for spec, sharding in zip(step.inputs, shardings)
    ]


def state_bytes(step: StepGraph, shardings) -> dict[str, int]:
    """Per chip bytes of the step's arguments by kind (from their shardings)."""
    groups = {PARAM: "parameters", BUFFER: "buffers", BATCH: "batch"}
    out = dict.fromkeys(["parameters", "optimizer state", "buffers", "batch"], 0)
    for spec, sharding in zip(step.inputs, shardings):
        group = groups.get(spec.role, "optimizer state")
        out[group] += _per_chip_bytes(spec.shape, spec.dtype.itemsize, sharding)
    batch = [(s, sh) for s, sh in zip(step.inputs, shardings) if s.role == BATCH and s.shape]
    if batch:
        out["batch rows per chip"] = batch[0][1].shard_shape(batch[0][0].shape)[0]
    return out


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    return cost or {}


def batch_tokens(step: StepGraph) -> int:
    """Tokens of the step's global batch: its first input's element count when it holds token
    ids (integers, batch x sequence); 0 otherwise."""
    first = next(s for s in step.inputs if s.role == BATCH)
    return math.prod(first.shape) if not first.dtype.is_floating_point and len(first.shape) == 2 else 0


def read_compiled(
    compiled, step: StepGraph, shardings, *, topology, mesh, hbm, seconds, kernels, optimizer, remat="none"
) -> Report:
    """The `Report` of a compiled step."""
    memory = compiled.memory_analysis()
    cost = _cost(compiled)
    text = compiled.as_text()
    names = [s.name for s in step.inputs]
    devices = shardings[0].mesh.devices
    return Report(
        topology=topology,
        chips=int(np.size(devices)),
        device_kind=devices.flat[0].device_kind,
        mesh=dict(mesh),
        optimizer=optimizer,
        kernels=bool(kernels),
        remat=remat,
        tokens=batch_tokens(step),
        parameters=sum(math.prod(s.shape) for s in step.inputs if s.role == PARAM),
        hbm_bytes=hbm,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        state_bytes=state_bytes(step, shardings),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collectives=count_collectives(text),
        seconds={k: round(v, 2) for k, v in seconds.items()},
        largest=largest_buffers(text, names),
        rematerialized=count_rematerialized(text),
        kernel_calls=count_kernel_calls(text),
    )
