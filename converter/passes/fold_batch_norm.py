"""Affine folding: a per-channel MUL and/or ADD after a conv or FC goes into its weights.

Inference batch norm lowers to `y * scale + shift` with per-channel constants. When
that follows CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV or the 3-D
convolutions, it folds:
W'[o] = W[o] * scale[o] and b' = b * scale + shift (a zero bias is created if absent).
SUB of a constant folds as ADD of its negation and DIV by a constant as MUL by its
reciprocal. A RESHAPE that keeps the last (channel) axis may sit between the op and the
MUL/ADD (LeViT's `bn(fc(x).flatten(0, 1)).reshape_as(x)`): it then reshapes the folded
op's output instead.

Guarantees:
- only folds when the producer's output is read by that single MUL/ADD (and is no graph
  output), the producer has no fused activation, its weights (and bias) are float
  constants without quantization, and the constant broadcasts along the output channel
  axis only (the last axis: run after `to_nhwc`), i.e. its shape is all ones except
  possibly the last dimension, which equals the channel count (or 1);
- the MUL/ADD must not change the output's shape or dtype;
- weights are never modified: the op gets a new constant tensor, a `LazyConstant`
  recipe (the weight times the float32 scale, computed once by the writer or the first
  reader of its values), so folding copies no weight.
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph, LazyConstant, Op, Tensor

from ._graph import Uses, activation, fresh_name, remove_ops

# opcode -> (filter input index, output-channel axis of the filter, bias input index)
AFFINE_OPS = {
    "CONV_2D": (1, 0, 2),
    "DEPTHWISE_CONV_2D": (1, 3, 2),
    "FULLY_CONNECTED": (1, 0, 2),
    "TRANSPOSE_CONV": (1, 0, 3),
    "CONV_3D": (1, 4, 2),  # filter (kd, kh, kw, in, out)
    "CONV_3D_TRANSPOSE": (1, 3, 3),  # filter (kd, kh, kw, out, in); inputs: shape, filter, x, bias
}


def fold_batch_norm(graph: Graph) -> Graph:
    """Fold per-channel MUL/ADD (SUB/DIV) constants into the preceding affine op.

    One walk with one use index: a fold only re-points the op's output at its follower's
    (whose readers the index already knows), so an op folds its MUL and then its ADD in
    turn, and the folded followers are dropped together at the end."""
    uses = Uses(graph)
    folded = []
    for op in graph.ops:
        if op.opcode not in AFFINE_OPS or len(op.outputs) != 1:
            continue
        while activation(op) == "NONE":
            follower = uses.only_consumer(op.outputs[0])
            reshape = follower if _keeps_channels(follower, op.outputs[0]) else None
            if reshape is not None:  # LeViT's `bn(fc(x).flatten(0, 1)).reshape_as(x)`
                follower = uses.only_consumer(reshape.outputs[0])
            if follower is None:
                break
            per_channel = _per_channel_operand(follower, (reshape or op).outputs[0])
            if per_channel is None or not _foldable_weights(op):
                break
            kind, vector = per_channel
            if not _fold(op, kind, vector):
                break
            (reshape or op).outputs[0] = follower.outputs[0]
            folded.append(follower)
    if folded:
        remove_ops(graph, folded)
    return graph


def _keeps_channels(op: Op | None, y: Tensor) -> bool:
    """Whether `op` is a RESHAPE of `y` that keeps its last (channel) axis, so a per-channel
    MUL/ADD after it is the same per-channel MUL/ADD before it."""
    if op is None or op.opcode != "RESHAPE" or op.inputs[0] is not y or y.rank == 0:
        return False
    out = op.outputs[0]
    static = not (y.is_dynamic or out.is_dynamic)
    return static and out.rank > 0 and out.shape[-1] == y.shape[-1] and out.quant is None and y.quant is None


def _per_channel_operand(op: Op, y: Tensor) -> tuple[str, np.ndarray] | None:
    """("scale"|"shift", per-channel vector) if `op` is y*c, y/c, y+c, c+y or y-c with a
    constant c broadcast along the last axis only, else None."""
    if op.opcode not in ("MUL", "DIV", "ADD", "SUB") or len(op.inputs) != 2 or op.outputs[0].is_variable:
        return None  # (an op writing a variable tensor, e.g. an LSTM state refresh, must stay)
    if (
        activation(op) != "NONE"
        or op.outputs[0].shape != y.shape
        or op.outputs[0].dtype != y.dtype
        or op.outputs[0].quant is not None
    ):
        return None
    a, b = op.inputs
    if a is y and b is not None and b.is_const:
        c = b
    elif b is y and a is not None and a.is_const and op.opcode in ("MUL", "ADD"):
        c = a
    else:
        return None
    channels = y.shape[-1] if y.rank else 1
    data = np.asarray(c.data)
    if (
        c.quant is not None
        or not np.issubdtype(data.dtype, np.floating)
        or data.ndim > y.rank
        or any(d != 1 for d in data.shape[:-1])
        or (data.ndim and data.shape[-1] not in (1, channels))
    ):
        return None
    vector = np.broadcast_to(data.reshape(-1).astype(np.float64), (channels,))
    if op.opcode == "MUL":
        return "scale", vector
    if op.opcode == "DIV":
        return ("scale", 1.0 / vector) if np.all(vector != 0) else None
    if op.opcode == "ADD":
        return "shift", vector
    return "shift", -vector


def _foldable_weights(op: Op) -> bool:
    w_index, _, b_index = AFFINE_OPS[op.opcode]
    w = op.inputs[w_index]
    bias = op.inputs[b_index] if b_index < len(op.inputs) else None
    if w is None or not w.is_const or w.quant is not None or w.dtype != np.float32:
        return False
    if bias is not None and (not bias.is_const or bias.quant is not None or bias.dtype != np.float32):
        return False
    if op.outputs[0].dtype != np.float32:
        return False
    if op.opcode == "FULLY_CONNECTED" and op.options.get("weightsFormat", "DEFAULT") not in ("DEFAULT", 0):
        return False
    return True


def _fold(op: Op, kind: str, vector: np.ndarray) -> bool:
    """Fold the per-channel scale or shift into `op`'s weights/bias. False if the
    channel counts do not line up (then nothing changes)."""
    w_index, axis, b_index = AFFINE_OPS[op.opcode]
    w = op.inputs[w_index]
    out_channels = w.shape[axis]
    if vector.shape[0] != out_channels:
        return False
    bias = op.inputs[b_index] if b_index < len(op.inputs) else None
    b = np.zeros(out_channels, np.float64) if bias is None else np.asarray(bias.data, np.float64).reshape(-1)
    if b.shape[0] != out_channels:
        return False
    if kind == "scale":
        shape = [1] * w.rank
        shape[axis] = out_channels
        new_w = _scaled(w.constant, vector.reshape(shape))
        op.inputs[w_index] = Tensor(fresh_name(w.name), new_w.shape, np.float32, data=new_w)
        b = b * vector
        if bias is None:
            return True  # no bias to scale: none is needed
    else:
        b = b + vector
    new_b = b.astype(np.float32)
    bias_tensor = Tensor(
        fresh_name(bias.name if bias is not None else f"{op.outputs[0].name}_bias"), new_b.shape, np.float32, data=new_b
    )
    while len(op.inputs) <= b_index:
        op.inputs.append(None)
    op.inputs[b_index] = bias_tensor
    return True


def _scaled(weights: np.ndarray | LazyConstant, scale: np.ndarray) -> np.ndarray | LazyConstant:
    """float32(weights * scale), rounded once. When the scale is float32 (a MUL by a
    float32 constant) the float32 product is already that (a product of two float32
    values is exact in float64): a lazy product, computed once when written. Otherwise
    (a DIV's float64 reciprocal) the float64 product is computed now."""
    scale32 = scale.astype(np.float32)
    if np.array_equal(scale32, scale):
        lazy = weights if isinstance(weights, LazyConstant) else LazyConstant(weights)
        return lazy.scaled(scale32)
    values = weights.materialize() if isinstance(weights, LazyConstant) else weights
    return (np.asarray(values, np.float64) * scale).astype(np.float32)
