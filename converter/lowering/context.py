"""LoweringContext: what a lowering function uses to emit ops into the graph."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from converter.ir import Graph, LazyConstant, Op, Tensor

TORCH_TO_NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.bfloat16: np.float32,  # TFLite has no bf16 compute: bf16 graphs are lowered in float32
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
}


_NUMPY_DTYPES = {t: np.dtype(n) for t, n in TORCH_TO_NUMPY.items()}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no TFLite equivalent") from None


def static_shape(shape: Sequence) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(sample shape, shape signature or None) of a possibly symbolic torch shape.
    Symbolic dimensions become -1 in the signature and their hint in the sample shape."""
    if all(type(d) is int for d in shape):  # the common, static case
        return tuple(shape), None
    sample, signature, dynamic = [], [], False
    for d in shape:
        if isinstance(d, torch.SymInt):
            hint = d.node.hint if d.node.hint is not None else 1
            sample.append(int(hint))
            signature.append(-1)
            dynamic = True
        else:
            sample.append(int(d))
            signature.append(int(d))
    return tuple(sample), (tuple(signature) if dynamic else None)


class LoweringContext:
    """Emits ops into `graph` on behalf of the fx node being lowered (`self.node`)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.node: torch.fx.Node | None = None
        self.source: str | None = None
        self._names: dict[str, int] = {}

    # ---- the current node's value -----------------------------------------------------
    @property
    def meta(self) -> Any:
        """The node's example value (a FakeTensor, or a tuple of them)."""
        return self.node.meta.get("val") if self.node is not None else None

    def out_shape(self, index: int | None = None) -> tuple[int, ...]:
        val = self.meta if index is None else self.meta[index]
        return static_shape(val.shape)[0]

    def out_dtype(self, index: int | None = None) -> np.dtype:
        val = self.meta if index is None else self.meta[index]
        return numpy_dtype(val.dtype)

    # ---- tensors ------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def tensor(self, shape, dtype, name: str | None = None, signature=None) -> Tensor:
        """A new activation tensor (not yet produced by any op)."""
        base = name or (self.node.name if self.node is not None else "t")
        return Tensor(self.unique_name(base), shape, dtype, shape_signature=signature)

    def const(self, value, dtype=None, name: str | None = None) -> Tensor:
        """A constant tensor holding `value` (array-like, or a `LazyConstant` kept as is)."""
        if isinstance(value, LazyConstant) and (dtype is None or np.dtype(dtype) == value.dtype):
            return Tensor(self.unique_name(name or "const"), value.shape, value.dtype, data=value)
        data = np.asarray(value, dtype=dtype, order="C")  # (np.ascontiguousarray would make 0-d 1-d)
        return Tensor(self.unique_name(name or "const"), data.shape, data.dtype, data=data)

    # ---- ops ----------------------------------------------------------------------------
    def emit(
        self,
        opcode: str,
        inputs: Sequence[Tensor | None],
        options: dict | None = None,
        *,
        shape: Sequence[int] | None = None,
        dtype=None,
        signature: Sequence[int] | None = None,
        num_outputs: int = 1,
    ) -> Tensor | list[Tensor]:
        """Append `opcode(inputs)` and return its output tensor (a list if num_outputs > 1).

        Without `shape`/`dtype` the output takes the current node's shape and dtype
        (the common case: the op is the whole lowering, or its last step). With an
        explicit `shape` and no `signature`, the output is static.
        """
        outputs = []
        meta = self.meta if shape is None or dtype is None else None
        for i in range(num_outputs):
            val = meta if num_outputs == 1 or meta is None else meta[i]
            if shape is None:
                out_shape, out_sig = static_shape(val.shape)
            else:
                out_shape, out_sig = tuple(shape), (tuple(signature) if signature is not None else None)
            out_dtype = dtype if dtype is not None else numpy_dtype(val.dtype)
            outputs.append(self.tensor(out_shape, out_dtype, signature=out_sig))
        self.graph.ops.append(Op(opcode, list(inputs), outputs, dict(options or {}), self.source))
        return outputs[0] if num_outputs == 1 else outputs
