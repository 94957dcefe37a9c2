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
import math
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


class LazyConstant:
    """A weight not computed yet: `source` (any numpy array or strided view, e.g. a
    parameter seen through a layout transpose) times each per-channel float32 scale in
    turn (folded batch norms), rounded to float32 after each product, as numpy computes
    `source * scales[0] * scales[1]`. Transposing and scaling build new recipes without
    touching a weight; the values are computed once, by `write` straight into the
    file's bytes (the writer), or by the first reader of `Tensor.data`."""

    __slots__ = ("source", "scales")

    def __init__(self, source: np.ndarray, scales: tuple[np.ndarray, ...] = ()):
        self.source = source
        self.scales = scales

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def nbytes(self) -> int:
        return self.source.nbytes

    def transpose(self, perm) -> LazyConstant:
        expand = [np.reshape(s, (1,) * (self.source.ndim - np.ndim(s)) + np.shape(s)) for s in self.scales]
        return LazyConstant(np.transpose(self.source, perm), tuple(np.transpose(s, perm) for s in expand))

    def scaled(self, scale: np.ndarray) -> LazyConstant:
        """Times `scale` (float32, broadcasting against the shape): float32 weights only."""
        assert self.source.dtype == np.float32 and scale.dtype == np.float32
        return LazyConstant(self.source, (*self.scales, scale))

    def write(self, out: np.ndarray) -> np.ndarray:
        """Compute the values into `out` (C-contiguous, this shape and dtype)."""
        np.copyto(out, self.source)  # (the rearrangement first: a strided multiply is 2-5x slower)
        for scale in self.scales:
            np.multiply(out, scale, out=out)
        return out

    def materialize(self) -> np.ndarray:
        return self.write(np.empty(self.shape, self.dtype))

    def take(self, flat_indices: np.ndarray) -> np.ndarray:
        """The values at these positions of the C-order flattened result, computed
        without the rest (equal to `materialize().reshape(-1)[flat_indices]`)."""
        values = self.source.flat[flat_indices]
        for scale in self.scales:
            values = np.multiply(values, np.broadcast_to(scale, self.shape).flat[flat_indices])
        return values

    def same_recipe(self, other: LazyConstant) -> bool:
        """Whether both read the same memory the same way with equal scales (then their
        values are equal without computing them)."""
        a, b = self.source.__array_interface__, other.source.__array_interface__
        return (
            (a["data"], a["strides"], a["shape"], a["typestr"]) == (b["data"], b["strides"], b["shape"], b["typestr"])
            and len(self.scales) == len(other.scales)
            and all(np.array_equal(x, y) for x, y in zip(self.scales, other.scales))
        )


def transposed(constant: np.ndarray | LazyConstant, perm) -> LazyConstant:
    """`constant` transposed by `perm`, as a lazy constant (nothing is copied)."""
    lazy = constant if isinstance(constant, LazyConstant) else LazyConstant(constant)
    return lazy.transpose(perm)


def constant_values(constant: np.ndarray | LazyConstant) -> np.ndarray:
    """The values of a stored constant as a C-contiguous array (computing a lazy one)."""
    return constant.materialize() if isinstance(constant, LazyConstant) else constant


def take_flat(constant: np.ndarray | LazyConstant, flat_indices: np.ndarray) -> np.ndarray:
    """Values at C-order flat positions of a stored constant, lazy or not, without computing
    or copying the rest."""
    return constant.take(flat_indices) if isinstance(constant, LazyConstant) else constant.flat[flat_indices]


def fingerprint(constant: np.ndarray | LazyConstant, samples: int = 64) -> bytes:
    """The bytes of about `samples` evenly spaced values (all of a small constant): tells
    almost all unequal constants apart without reading, or computing, the rest (equal
    fingerprints are then confirmed by a full comparison)."""
    size = math.prod(constant.shape)
    return take_flat(constant, np.arange(0, size, max(1, size // samples))).tobytes()


def same_bytes(a: np.ndarray | LazyConstant, b: np.ndarray | LazyConstant) -> bool:
    """Whether two stored constants of one dtype and shape hold equal bytes (a lazy one is
    computed only when the other is not the same recipe)."""
    if a is b or (isinstance(a, LazyConstant) and isinstance(b, LazyConstant) and a.same_recipe(b)):
        return True
    return byte_view(constant_values(a)) == byte_view(constant_values(b))


def byte_view(array: np.ndarray) -> memoryview:
    """The array's bytes in C order, as a flat memoryview (a copy only if not contiguous)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B")


class Tensor:
    """A value in the graph: an activation, a graph input/output or a constant (`data`).

    A constant's values are read through `data` (a numpy array). They may be stored as a
    `LazyConstant` (`constant`), computed on the first read of `data`; code that only
    moves constants (layout transposes, batch-norm folding, de-duplication, the writer)
    uses `constant` and never computes them."""

    __slots__ = ("name", "shape", "dtype", "_constant", "shape_signature", "quant", "is_variable", "id")

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        data: np.ndarray | LazyConstant | None = None,
        shape_signature: tuple[int, ...] | None = None,
        quant: QuantParams | None = None,
        is_variable: bool = False,
    ):
        self.name = name
        self.shape = tuple(map(int, shape))
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self._constant = data
        self.shape_signature = shape_signature
        self.quant = quant
        self.is_variable = is_variable
        self.id = next(_ids)

    @property
    def data(self) -> np.ndarray | None:
        """The constant's values (None for activations); a lazy constant is computed now, once."""
        if isinstance(self._constant, LazyConstant):
            self._constant = self._constant.materialize()
        return self._constant

    @data.setter
    def data(self, value: np.ndarray | LazyConstant | None) -> None:
        self._constant = value

    @property
    def constant(self) -> np.ndarray | LazyConstant | None:
        """The stored constant as it is: an array or a `LazyConstant` (not computed)."""
        return self._constant

    @property
    def is_const(self) -> bool:
        return self._constant is not None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

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
    # what constant folding removed, for the user's report (converter.passes.folding_summary):
    # {"ops": ops removed, "zero branches": branches added to a tensor whose output is always 0}
    folded: dict[str, int] = field(default_factory=dict)

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
