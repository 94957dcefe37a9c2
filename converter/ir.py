"""The converter's graph IR: tensors, TFLite-level ops and graphs.

The IR sits between ATen lowering and the flatbuffer writer. It is deliberately close to
TFLite: an `Op` names a TFLite builtin (`"CONV_2D"`) and carries that builtin's options
with the schema's own field names (`{"strideW": 2, "padding": "SAME",
"fusedActivationFunction": "RELU"}`), so the writer maps it one to one and a pass can
read it without a translation table.

Layout: lowering emits ops in PyTorch's layout (NCHW activations) and wraps
layout-bound builtins (CONV_2D, pooling, resize ...) in TRANSPOSE ops; the layout pass
moves and cancels those transposes. Every graph is valid at every step.

Shapes: `Tensor.shape` holds the concrete sample shape; `Tensor.shape_signature` holds -1
for dynamic dimensions (None when fully static).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_ids = itertools.count()


@dataclass(eq=False)
class QuantParams:
    """Affine quantization: real = scale * (q - zero_point); per-channel along `axis`."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0
    # Blockwise (weights only): `scale` is (rows, cols / block_size) float16, one scale per
    # block of `block_size` consecutive elements along the last axis; the writer stores it
    # as a constant tensor referenced by BlockwiseQuantization.
    block_size: int = 0
    # int4 weights: `data` holds int8 values in [-8, 7], written packed two per byte as INT4.
    int4: bool = False


@dataclass(eq=False)
class Tensor:
    """A value in the graph: an activation, a graph input/output or a constant (`data`)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    data: np.ndarray | None = None
    shape_signature: tuple[int, ...] | None = None
    quant: QuantParams | None = None
    is_variable: bool = False

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.dtype = np.dtype(self.dtype)
        self.id = next(_ids)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return self.shape_signature is not None and -1 in self.shape_signature

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        sig = self.shape_signature or self.shape
        return f"%{self.name}: {kind}{self.dtype.name}{list(sig)}"


@dataclass(eq=False)
class Op:
    """One TFLite builtin applied to tensors. `inputs` may hold None for an omitted
    optional input (written as index -1). `source` is the user's source line that
    produced the op, kept for error messages."""

    opcode: str
    inputs: list[Tensor | None]
    outputs: list[Tensor]
    options: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    module: str | None = None  # the nn.Module path that produced it ("layer1.0.conv1"), if known

    def __repr__(self) -> str:
        ins = ", ".join("-" if t is None else f"%{t.name}" for t in self.inputs)
        outs = ", ".join(f"%{t.name}" for t in self.outputs)
        opts = f" {self.options}" if self.options else ""
        return f"{outs} = {self.opcode}({ins}){opts}"


@dataclass(eq=False)
class Graph:
    """A subgraph: ordered ops (topological), named inputs and outputs.

    `name` becomes the SignatureDef key; `input_names`/`output_names` are the signature's
    user-facing names, parallel to `inputs`/`outputs`.
    """

    name: str = "serving_default"
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)

    # ---- queries -------------------------------------------------------------------
    def producers(self) -> dict[int, Op]:
        """tensor id -> the op that writes it."""
        return {t.id: op for op in self.ops for t in op.outputs}

    def consumers(self) -> dict[int, list[Op]]:
        """tensor id -> ops that read it (in graph order)."""
        out: dict[int, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                if t is not None:
                    out.setdefault(t.id, []).append(op)
        return out

    def tensors(self) -> list[Tensor]:
        """Every tensor reachable from the graph, each once, in first-seen order."""
        seen: dict[int, Tensor] = {}
        for t in self.inputs:
            seen.setdefault(t.id, t)
        for op in self.ops:
            for t in [*op.inputs, *op.outputs]:
                if t is not None:
                    seen.setdefault(t.id, t)
        for t in self.outputs:
            seen.setdefault(t.id, t)
        return list(seen.values())

    # ---- edits ---------------------------------------------------------------------
    def replace_uses(self, old: Tensor, new: Tensor) -> None:
        """Make every reader of `old` (ops and graph outputs) read `new` instead."""
        for op in self.ops:
            op.inputs = [new if t is old else t for t in op.inputs]
        self.outputs = [new if t is old else t for t in self.outputs]

    def __str__(self) -> str:
        lines = [f"graph {self.name}({', '.join(map(repr, self.inputs))}):"]
        lines += [f"  {op!r}" for op in self.ops]
        lines.append(f"  return {', '.join('%' + t.name for t in self.outputs)}")
        return "\n".join(lines)


@dataclass(eq=False)
class Model:
    """What the writer writes: one or more subgraphs (one per signature) plus metadata.
    Constant tensors with equal bytes share one buffer (the writer de-duplicates)."""

    graphs: list[Graph]
    description: str = "litert_torch"
    metadata: dict[str, bytes] = field(default_factory=dict)

    def model_content(self) -> bytes:
        """The model as .tflite bytes (as `EdgeModel.model_content()`), so readers of
        models (`runtimes`) take an IR model without importing the converter."""
        from converter.writer import write_flatbuffer

        return write_flatbuffer(self)
