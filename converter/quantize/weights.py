"""Weight-only schemes: dynamic-range int8, weight-only int8 / int4, float16.

Each rewrites the float IR in place; activations stay float32.

- dynamic_int8: the filter of FULLY_CONNECTED, CONV_2D and DEPTHWISE_CONV_2D, and the
  constant right operand of BATCH_MATMUL, becomes an int8 per-channel constant read
  directly by the op: LiteRT's hybrid kernels quantize the float input on the fly and run
  integer arithmetic (FC v12, CONV_2D v5, DEPTHWISE v6, BATCH_MATMUL v4 with
  asymmetricQuantizeInputs; its per-column scales are honoured: measured on ai-edge-litert
  2.3.0, a column 1000x smaller than the largest keeps 0.5% error, 100% with one scale).
  Attention's BATCH_MATMULs multiply two activations: no weight, nothing to quantize in a
  dynamic-range scheme (full_int8 quantizes them). Embedding tables (GATHER of a constant)
  have no hybrid kernel and get DEQUANTIZE as in weight_only_int8.
- weight_only_int8: every weight becomes an int8 per-channel constant followed by a
  DEQUANTIZE; the op itself computes in float (XNNPACK folds the DEQUANTIZE at load).
- weight_only_int4: FULLY_CONNECTED filters become blockwise int4 (fp16 scales, one per
  `block_size` inputs) read natively by the op (LiteRT's blockwise int4 FC kernel, which
  XNNPACK also runs). 1x1 CONV_2D filters become int4 per output channel read by the
  hybrid conv kernel, and embedding tables (GATHER of a constant) int4 per row behind a
  DEQUANTIZE: measured on ai-edge-litert 2.3.0, both match a numpy simulation of the
  int4 weights (0.072 vs 0.072), while blockwise int4 is ignored by CONV_2D (error 0.97)
  and GATHER (1.69). Other weights get weight_only_int8.
- float16: every float32 constant of at least 16 elements becomes float16 + DEQUANTIZE
  (constants beyond float16's range, such as -3.4e38 attention masks, stay float32).
"""

from __future__ import annotations

import numpy as np

from converter import ir
from converter.quantize import numerics
from converter.quantize.select import keeps_float

# op -> (weight input index, per-channel axis of that weight)
WEIGHT_INPUTS = {
    "FULLY_CONNECTED": (1, 0),
    "CONV_2D": (1, 0),
    "DEPTHWISE_CONV_2D": (1, 3),
    "TRANSPOSE_CONV": (1, 0),
    "BATCH_MATMUL": (1, -1),
    "GATHER": (0, 0),
    "EMBEDDING_LOOKUP": (1, 0),
}
HYBRID_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")
FLOAT16_MIN_ELEMENTS = 16
FLOAT16_MAX = float(np.finfo(np.float16).max)


def _float_weight(op: ir.Op) -> tuple[int, ir.Tensor, int] | None:
    """(input index, tensor, axis) of the op's float32 constant weight, if it has one."""
    slot = WEIGHT_INPUTS.get(op.opcode)
    if slot is None:
        return None
    index, axis = slot
    if index >= len(op.inputs):
        return None
    w = op.inputs[index]
    if w is None or not w.is_const or w.dtype != np.float32 or w.rank < 1 or w.data.size < 2:
        return None
    if op.opcode == "BATCH_MATMUL" and (op.options.get("adjY") or w.rank < 2):
        return None
    return index, w, axis % w.rank


def _int8_constant(w: ir.Tensor, axis: int) -> ir.Tensor:
    q, scale = numerics.per_channel_symmetric(w.data, axis)
    return ir.Tensor(
        f"{w.name}_int8", w.shape, np.int8, data=q, quant=ir.QuantParams(scale, np.zeros(scale.shape, np.int64), axis)
    )


def _int4_per_channel(w: ir.Tensor, axis: int) -> ir.Tensor:
    q, scale = numerics.per_channel_symmetric(w.data, axis, bits=4)
    return ir.Tensor(
        f"{w.name}_int4",
        w.shape,
        np.int8,
        data=q,
        quant=ir.QuantParams(scale, np.zeros(scale.shape, np.int64), axis, int4=True),
    )


def _pointwise_conv(op: ir.Op, w: ir.Tensor) -> bool:
    """A 1x1 CONV_2D (filter O x 1 x 1 x I), which LiteRT's hybrid conv runs with int4 filters."""
    return op.opcode == "CONV_2D" and w.rank == 4 and w.shape[1] == 1 and w.shape[2] == 1


def _dequantized(graph_ops: list[ir.Op], constant: ir.Tensor, like: ir.Tensor, source) -> ir.Tensor:
    """Append DEQUANTIZE(constant) -> a float32 tensor shaped like `like`."""
    out = ir.Tensor(f"{like.name}_dequantized", like.shape, np.float32)
    graph_ops.append(ir.Op("DEQUANTIZE", [constant], [out], source=source))
    return out


def quantize_weights(graph: ir.Graph, scheme: str, keep_float, block_size: int = 32) -> None:
    """Apply a weight-only scheme to `graph` in place."""
    if scheme == "float16":
        return _float16(graph, keep_float)
    new_ops: list[ir.Op] = []
    done: dict[tuple[int, str], ir.Tensor] = {}  # (weight id, how) -> replacement, for shared weights
    for op in graph.ops:
        found = None if keeps_float(op, keep_float) else _float_weight(op)
        if found is None:
            new_ops.append(op)
            continue
        index, w, axis = found
        if scheme == "dynamic_int8" and op.opcode in HYBRID_OPS:
            key = (w.id, "hybrid")
            if key not in done:
                done[key] = _int8_constant(w, axis)
            if op.opcode == "BATCH_MATMUL":  # the hybrid kernel (v4) quantizes its float input itself
                op.options["asymmetricQuantizeInputs"] = True
        elif scheme == "weight_only_int4" and _pointwise_conv(op, w):
            key = (w.id, "int4 channels")
            if key not in done:
                done[key] = _int4_per_channel(w, axis)
        elif scheme == "weight_only_int4" and op.opcode == "GATHER":
            key = (w.id, "int4 rows")
            if key not in done:
                done[key] = _dequantized(new_ops, _int4_per_channel(w, axis), w, op.source)
        elif scheme == "weight_only_int4" and op.opcode == "FULLY_CONNECTED" and w.shape[1] % block_size == 0:
            key = (w.id, "int4")
            if key not in done:
                q, scale = numerics.blockwise_int4(w.data, block_size)
                done[key] = ir.Tensor(
                    f"{w.name}_int4",
                    w.shape,
                    np.int8,
                    data=q,
                    quant=ir.QuantParams(scale, np.zeros(1, np.int64), 0, block_size, int4=True),
                )
        else:
            key = (w.id, "dequantize")
            if key not in done:
                done[key] = _dequantized(new_ops, _int8_constant(w, axis), w, op.source)
        op.inputs[index] = done[key]
        new_ops.append(op)
    graph.ops = new_ops


def _float16(graph: ir.Graph, keep_float) -> None:
    new_ops: list[ir.Op] = []
    done: dict[int, ir.Tensor] = {}
    for op in graph.ops:
        if not keeps_float(op, keep_float) and op.opcode != "DEQUANTIZE":
            for i, t in enumerate(op.inputs):
                if t is None or not t.is_const or t.dtype != np.float32 or t.data.size < FLOAT16_MIN_ELEMENTS:
                    continue
                if np.abs(t.data).max() > FLOAT16_MAX:  # masks / sentinels (-3.4e38) would become -inf
                    continue
                if t.id not in done:
                    half = ir.Tensor(f"{t.name}_fp16", t.shape, np.float16, data=t.data.astype(np.float16))
                    done[t.id] = _dequantized(new_ops, half, t, op.source)
                op.inputs[i] = done[t.id]
        new_ops.append(op)
    graph.ops = new_ops
