"""Full-integer quantization of a float IR graph: int8 (or int16) activations.

Given each float activation's range (calibration) or fixed parameters (a PT2E model's
quantize/dequantize pairs), every op with an integer kernel in LiteRT is rewritten to
compute in integers; the others stay float32, with DEQUANTIZE before them and QUANTIZE
after, so keeping a layer in float (mixed precision) is the same mechanism.

Rules, after TFLite's integer kernels:
- activations per-tensor: int8 asymmetric, int16 symmetric (zero point 0);
- weights (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV filters) int8
  symmetric per output channel; biases int32 (int64 under int16 activations) with
  scale = input scale x weight scale; other float constants per-tensor in the
  activation type over their own range;
- outputs whose kernels fix their parameters: SOFTMAX and LOGISTIC 1/256 and -128
  (int16: 1/32768, 0), TANH 1/128 and 0 (int16: 1/32768, 0);
- ops that move values without arithmetic (RESHAPE, TRANSPOSE, pools, slices, pads,
  resizes ...) keep their input's parameters;
- CONCATENATION/PACK take the union of their inputs' ranges and every input is
  requantized to it (int8 concatenation kernels do not rescale), or written at it by its
  producer when the concat is its only reader;
- int16 ADD/SUB use the general-scale kernel (`potScaleInt16=False`).
Model I/O: "float" keeps float32 inputs/outputs (QUANTIZE/DEQUANTIZE inside the model);
"int8"/"int16" exposes the quantized tensors; "uint8" adds a QUANTIZE between uint8 I/O
and the int8 graph (zero point + 128, same scale).
"""

from __future__ import annotations

import numpy as np

from converter import ir
from converter.quantize import numerics
from converter.quantize.report import FloatOp
from converter.quantize.select import keeps_float

OWN, SAME, CONCAT = "own", "same", "concat"
_FIXED = {
    "SOFTMAX": {"int8": (1 / 256, -128), "int16": (1 / 32768, 0)},
    "LOGISTIC": {"int8": (1 / 256, -128), "int16": (1 / 32768, 0)},
    "TANH": {"int8": (1 / 128, 0), "int16": (1 / 32768, 0)},
}
_COMMON = {
    "CONV_2D": OWN,
    "DEPTHWISE_CONV_2D": OWN,
    "FULLY_CONNECTED": OWN,
    "TRANSPOSE_CONV": OWN,
    "ADD": OWN,
    "SUB": OWN,
    "MUL": OWN,
    "MEAN": OWN,
    "BATCH_MATMUL": OWN,
    "RELU": OWN,
    "RELU6": OWN,
    "LEAKY_RELU": OWN,
    "RESHAPE": SAME,
    "TRANSPOSE": SAME,
    "SQUEEZE": SAME,
    "EXPAND_DIMS": SAME,
    "MAX_POOL_2D": SAME,
    "AVERAGE_POOL_2D": SAME,
    "STRIDED_SLICE": SAME,
    "SLICE": SAME,
    "GATHER": SAME,
    "PAD": SAME,
    "PADV2": SAME,
    "SPLIT": SAME,
    "SPLIT_V": SAME,
    "DEPTH_TO_SPACE": SAME,
    "SPACE_TO_DEPTH": SAME,
    "RESIZE_NEAREST_NEIGHBOR": SAME,
    "RESIZE_BILINEAR": SAME,
    "REDUCE_MAX": SAME,
    "REDUCE_MIN": SAME,
    "UNPACK": SAME,
    "CONCATENATION": CONCAT,
    "PACK": CONCAT,
    "SOFTMAX": "fixed",
    "LOGISTIC": "fixed",
    "TANH": "fixed",
}
INT8_RULES = {
    **_COMMON,
    "HARD_SWISH": OWN,
    "GELU": OWN,
    "RSQRT": OWN,
    "SQUARED_DIFFERENCE": OWN,
    "TILE": SAME,
    "BROADCAST_TO": SAME,
    "REVERSE_V2": SAME,
}
INT16_RULES = dict(_COMMON)

# op -> (filter input, per-channel axis, bias input)
_FILTERS = {
    "CONV_2D": (1, 0, 2),
    "DEPTHWISE_CONV_2D": (1, 3, 2),
    "FULLY_CONNECTED": (1, 0, 2),
    "TRANSPOSE_CONV": (1, 0, 3),
}
_DATA_INPUT = {"SPLIT": 1}  # where the moved values are, for SAME ops (else input 0)


def _params(scale, zero_point, axis: int = 0) -> ir.QuantParams:
    return ir.QuantParams(
        np.atleast_1d(np.asarray(scale, np.float32)), np.atleast_1d(np.asarray(zero_point, np.int64)), axis
    )


# Values beyond this magnitude are sentinels (-3.4e38 "minus infinity" in attention
# masks), not activations: int8 cannot hold them next to ordinary values, and LiteRT's
# kernels abort when the rescaling multipliers such ranges imply overflow. Ops touching
# them stay float (and are reported). Ordinary activations may be large: a randomly
# initialised Inception-v3 reaches 6e11 in its last blocks, and int8 is scale-free.
SENTINEL = 1e30
KEPT = "kept float by keep_float="
MASK_MARGIN = 12.0  # masked logits sit this far below the lowest kept one: n x exp(-12) << 1/256
NOT_FLOAT = "computes no float values"


def _sane(lo: float, hi: float) -> bool:
    return max(abs(lo), abs(hi)) < SENTINEL


def _same_params(a: ir.QuantParams, b: ir.QuantParams) -> bool:
    return np.array_equal(np.asarray(a.scale, np.float32), np.asarray(b.scale, np.float32)) and np.array_equal(
        a.zero_point, b.zero_point
    )


class _Rewriter:
    """One graph's rewrite; `emit` appends to the new op list as the walk goes."""

    def __init__(self, graph: ir.Graph, ranges: dict, fixed: dict, act: str, keep_float):
        self.graph, self.ranges, self.fixed, self.keep_float = graph, ranges, fixed, keep_float
        self.act = np.dtype(act)
        self.act_name = act
        self.rules = INT8_RULES if act == "int8" else INT16_RULES
        self.ops: list[ir.Op] = []
        self.int_of: dict[int, ir.Tensor] = {}  # float tensor id -> quantized twin
        self.float_of: dict[int, ir.Tensor] = {}  # quantized tensor id -> float twin
        self.requantized: dict[tuple, ir.Tensor] = {}
        self.constants: dict[tuple, ir.Tensor] = {}
        self.quantized_ops = 0
        self.float_ops: list[FloatOp] = []
        self.consumers = graph.consumers()  # of the float graph (tensor ids are kept)
        self.fixed = dict(fixed)
        self.masks: set[int] = set()  # ids of sentinel mask constants added before a softmax
        for op in graph.ops:
            self._plan_mask_add(op)
        self.concat_params: dict[int, ir.QuantParams] = {}  # id(op) -> planned output parameters
        self._plan_concat_inputs()

    # ---- parameters ----------------------------------------------------------------------
    def is_int(self, t: ir.Tensor) -> bool:
        return not t.is_const and t.quant is not None and t.dtype == self.act

    def activation_params(self, t: ir.Tensor) -> ir.QuantParams | None:
        if t.id in self.fixed:
            return self.fixed[t.id]
        if t.id in self.ranges and _sane(*self.ranges[t.id]):
            return _params(*numerics.activation_params(*self.ranges[t.id], self.act))
        return None

    def range_of(self, t: ir.Tensor) -> tuple[float, float] | None:
        if self.is_int(t):
            q = t.quant
            lo = (numerics.QMIN[self.act] - q.zero_point[0]) * q.scale[0]
            hi = (numerics.QMAX[self.act] - q.zero_point[0]) * q.scale[0]
            return float(lo), float(hi)
        return self.ranges.get(t.id)

    # ---- conversions between float and quantized tensors --------------------------------
    def new_tensor(self, like: ir.Tensor, dtype, quant, suffix: str) -> ir.Tensor:
        return ir.Tensor(f"{like.name}_{suffix}", like.shape, dtype, shape_signature=like.shape_signature, quant=quant)

    def as_int(self, t: ir.Tensor, want: ir.QuantParams | None = None, source=None) -> ir.Tensor:
        """A quantized version of activation `t` (with parameters `want` when given)."""
        if self.is_int(t):
            q = t
        elif t.id in self.int_of:
            q = self.int_of[t.id]
        else:
            q = self.new_tensor(t, self.act, want or self.activation_params(t), "quantized")
            self.ops.append(ir.Op("QUANTIZE", [t], [q], source=source))
            self.int_of[t.id] = q
        if want is None or _same_params(q.quant, want):
            return q
        key = (q.id, float(want.scale[0]), int(want.zero_point[0]))
        if key not in self.requantized:
            r = self.new_tensor(q, self.act, want, "requantized")
            self.ops.append(ir.Op("QUANTIZE", [q], [r], source=source))
            self.requantized[key] = r
        return self.requantized[key]

    def as_float(self, t: ir.Tensor, source=None) -> ir.Tensor:
        if not self.is_int(t):
            return t
        if t.id not in self.float_of:
            f = self.new_tensor(t, np.float32, None, "dequantized")
            self.ops.append(ir.Op("DEQUANTIZE", [t], [f], source=source))
            self.float_of[t.id] = f
        return self.float_of[t.id]

    def constant(self, t: ir.Tensor, params: ir.QuantParams | None = None) -> ir.Tensor:
        """A float constant quantized per-tensor in the activation type (own range, or `params`)."""
        if params is None:
            params = _params(*numerics.activation_params(float(t.data.min()), float(t.data.max()), self.act))
        key = (t.id, float(params.scale[0]), int(params.zero_point[0]))
        if key not in self.constants:
            data = numerics.quantize_values(t.data, params.scale[0], params.zero_point[0], self.act)
            self.constants[key] = ir.Tensor(f"{t.name}_quantized", t.shape, self.act, data=data, quant=params)
        return self.constants[key]

    def filter(self, w: ir.Tensor, axis: int) -> ir.Tensor:
        key = (w.id, "filter")
        if key not in self.constants:
            if w.quant is not None and w.dtype == np.int8:  # already int8 (a PT2E weight)
                self.constants[key] = w
            else:
                q, scale = numerics.per_channel_symmetric(w.data, axis)
                self.constants[key] = ir.Tensor(
                    f"{w.name}_int8", w.shape, np.int8, data=q, quant=_params(scale, np.zeros(scale.size), axis)
                )
        return self.constants[key]

    def bias(self, b: ir.Tensor, input_scale: float, weight: ir.Tensor) -> ir.Tensor:
        scale = (np.float64(input_scale) * np.asarray(weight.quant.scale, np.float64)).astype(np.float32)
        dtype = np.int32 if self.act == np.int8 else np.int64
        scale = np.broadcast_to(scale, b.shape).copy() if scale.size == 1 and b.size > 1 else scale
        data = numerics.quantize_values(b.data, scale, np.zeros(scale.size), dtype)
        return ir.Tensor(
            f"{b.name}_quantized", b.shape, dtype, data=data, quant=_params(scale, np.zeros(scale.size), 0)
        )

    # ---- deciding -------------------------------------------------------------------------
    def float_reason(self, op: ir.Op) -> str | None:
        """Why `op` stays float32; None when it is quantized, NOT_FLOAT for ops that read
        and write no float activation (index arithmetic), which are not reported."""
        activations = [
            t for t in op.inputs if t is not None and not t.is_const and (t.dtype == np.float32 or self.is_int(t))
        ]
        if not activations and not any(t.dtype == np.float32 for t in op.outputs):  # index arithmetic
            return NOT_FLOAT
        if keeps_float(op, self.keep_float):
            return KEPT
        rule = self.rules.get(op.opcode)
        if rule is None:
            return f"LiteRT has no {self.act_name} kernel for {op.opcode}"
        if not activations and not any(t is not None and t.is_const and t.dtype == np.float32 for t in op.inputs):
            return "it reads no float input"
        filt = _FILTERS.get(op.opcode)
        for i, t in enumerate(op.inputs):
            if t is None:
                continue
            if filt and i == filt[2]:
                if not t.is_const or t.dtype != np.float32:
                    return f"its bias (input {i}) is not a float32 constant"
            elif t.is_const:
                if t.dtype == np.float32:
                    if (
                        t.data.size
                        and not _sane(float(t.data.min()), float(t.data.max()))
                        and not self._max_padding(op, i)
                        and t.id not in self.masks
                    ):
                        return f"constant input {i} holds sentinel values (|x| >= {SENTINEL:g}, e.g. a mask)"
                elif np.issubdtype(t.dtype, np.floating) or (t.quant is not None and not (filt and i == filt[0])):
                    return f"constant input {i} is {t.dtype.name}"
            elif t.dtype == np.float32 and not self.is_int(t):
                if self.activation_params(t) is None and t.id not in self.int_of:
                    return self._range_problem(t, f"input {i}")
            elif np.issubdtype(t.dtype, np.floating) and not self.is_int(t):
                return f"input {i} is {t.dtype.name}"
        for t in op.outputs:
            if t.dtype != np.float32:
                return f"output {t.name} is {t.dtype.name}"
            if rule == OWN and self.activation_params(t) is None:
                return self._range_problem(t, "its output")
        if rule == CONCAT:
            for t in op.inputs:
                if t is not None and not t.is_const and t.dtype == np.float32 and self.range_of(t) is None:
                    return self._range_problem(t, "an input")
        return None

    def _plan_concat_inputs(self) -> None:
        """int8 CONCATENATION/PACK do not rescale, so each input must carry the output's
        parameters (the union of the inputs' ranges). An input that an op with its own
        output range writes for the concat alone gets those parameters up front: its
        producer writes them directly instead of a requantizing QUANTIZE after it (one
        rounding instead of two; GhostNet had 41 such QUANTIZE ops)."""
        producers = {t.id: op for op in self.graph.ops for t in op.outputs}
        graph_outputs = {t.id for t in self.graph.outputs}
        for op in self.graph.ops:
            if self.rules.get(op.opcode) != CONCAT:
                continue
            inputs = [t for t in op.inputs if t is not None]
            # the union is known up front only when every input's parameters come from its
            # own calibrated range: not for a concat of concats (DenseNet), whose output
            # carries the union of its inputs rather than its own (mse/percentile-clipped) range
            if not inputs or any(
                t.is_const
                or t.dtype != np.float32
                or t.id not in self.ranges
                or not _sane(*self.ranges[t.id])
                or t.id in self.fixed
                or t.id not in producers
                or self.rules.get(producers[t.id].opcode) != OWN
                for t in inputs
            ):
                continue
            lo, hi = min(self.ranges[t.id][0] for t in inputs), max(self.ranges[t.id][1] for t in inputs)
            params = _params(*numerics.activation_params(lo, hi, self.act))
            self.concat_params[id(op)] = params
            for t in inputs:
                producer = producers.get(t.id)
                readers = self.consumers.get(t.id, [])
                if (
                    producer is not None
                    and self.rules.get(producer.opcode) == OWN
                    and t.id not in self.fixed
                    and t.id not in graph_outputs
                    and all(r is op for r in readers)
                ):
                    self.fixed[t.id] = params

    def _plan_mask_add(self, op: ir.Op) -> None:
        """ADD(scores, mask) -> SOFTMAX with a -inf (-3.4e38) mask constant: the sum gets the
        scores' range widened MASK_MARGIN / beta below, and the mask saturates at the lowest
        level, so a masked logit weighs at most exp(-MASK_MARGIN) against any kept one."""
        if op.opcode != "ADD" or len(op.inputs) != 2:
            return
        masks = [
            t
            for t in op.inputs
            if t is not None
            and t.is_const
            and t.dtype == np.float32
            and t.data.size
            and float(t.data.min()) <= -SENTINEL
        ]
        others = [t for t in op.inputs if t is not None and not t.is_const]
        readers = self.consumers.get(op.outputs[0].id, [])
        if len(masks) != 1 or len(others) != 1 or not readers or any(r.opcode != "SOFTMAX" for r in readers):
            return
        if (
            op.outputs[0] in self.graph.outputs
            or others[0].id not in self.ranges
            or not _sane(*self.ranges[others[0].id])
        ):
            return
        kept = masks[0].data[masks[0].data > -SENTINEL]
        if kept.size and not _sane(float(kept.min()), float(kept.max())):
            return
        lo, hi = self.ranges[others[0].id]
        lo, hi = lo + (float(kept.min()) if kept.size else 0.0), hi + (float(kept.max()) if kept.size else 0.0)
        beta = min(float(r.options.get("beta", 1.0)) for r in readers)
        lo = min(lo, hi) - MASK_MARGIN / max(beta, 1e-6)
        self.fixed[op.outputs[0].id] = _params(*numerics.activation_params(lo, hi, self.act))
        self.masks.add(masks[0].id)

    def _max_padding(self, op: ir.Op, i: int) -> bool:
        """PADV2 padding with -inf (-3.4e38) for a max pool (how padded max pools lower):
        in integers, padding with the lowest level gives the same maxima."""
        if op.opcode != "PADV2" or i != 2 or float(op.inputs[2].data.max()) > -SENTINEL:
            return False
        readers = self.consumers.get(op.outputs[0].id, [])
        return (
            bool(readers)
            and all(r.opcode in ("MAX_POOL_2D", "REDUCE_MAX") for r in readers)
            and op.outputs[0] not in self.graph.outputs
        )

    def _range_problem(self, t: ir.Tensor, what: str) -> str:
        if t.id not in self.ranges:
            return (
                f"{what} ({t.name}) has no calibrated range (never finite in the calibration samples, "
                f"or not reached by them)"
            )
        lo, hi = self.ranges[t.id]
        return (
            f"{what} ({t.name}) reaches sentinel values ({lo:.3g} .. {hi:.3g}; |x| >= {SENTINEL:g}, "
            f"e.g. a -inf mask) that int8 cannot share with ordinary values"
        )

    # ---- rewriting one op ---------------------------------------------------------------------
    def quantize_op(self, op: ir.Op) -> None:
        rule = self.rules[op.opcode]
        filt = _FILTERS.get(op.opcode)
        out_params = None
        if rule == CONCAT and id(op) in self.concat_params:
            out_params = self.concat_params[id(op)]
        elif rule == CONCAT:
            ranges = [
                self.range_of(t) if not t.is_const else (float(t.data.min()), float(t.data.max()))
                for t in op.inputs
                if t is not None and (t.dtype == np.float32 or self.is_int(t))
            ]
            lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
            out_params = _params(*numerics.activation_params(lo, hi, self.act))
        elif rule == SAME:
            data = op.inputs[_DATA_INPUT.get(op.opcode, 0)]
            quantized = self.constant(data) if data.is_const else self.as_int(data, source=op.source)
            out_params = quantized.quant
        inputs = list(op.inputs)
        for i, t in enumerate(inputs):
            if t is None or (filt and i == filt[2]):
                continue
            if filt and i == filt[0] and t.is_const:
                inputs[i] = self.filter(t, filt[1] % t.rank)
            elif t.is_const:
                if t.dtype == np.float32:
                    if t.id in self.masks:  # saturates at the sum's lowest level
                        inputs[i] = self.constant(t, self.fixed[op.outputs[0].id])
                    else:
                        inputs[i] = self.constant(t, out_params if rule in (SAME, CONCAT) else None)
            elif t.dtype == np.float32 or self.is_int(t):  # (indices, shapes stay as they are)
                inputs[i] = self.as_int(t, out_params if rule in (SAME, CONCAT) else None, op.source)
        if filt and len(inputs) > filt[2] and inputs[filt[2]] is not None:
            x = inputs[2] if op.opcode == "TRANSPOSE_CONV" else inputs[0]
            inputs[filt[2]] = self.bias(inputs[filt[2]], float(x.quant.scale[0]), inputs[filt[0]])
        op.inputs = inputs
        for t in op.outputs:
            if rule == "fixed":
                params = _params(*_FIXED[op.opcode][self.act_name])
            elif rule in (SAME, CONCAT):
                params = _params(out_params.scale, out_params.zero_point)
            else:
                params = self.activation_params(t)
            t.dtype, t.quant = self.act, params
        if self.act == np.int16 and op.opcode in ("ADD", "SUB"):
            op.options["potScaleInt16"] = False
        self.ops.append(op)
        self.quantized_ops += 1

    # ---- the graph ----------------------------------------------------------------------------
    def run(self, io: str) -> int:
        g = self.graph
        if io != "float":
            self._integer_inputs(io)
        for op in g.ops:
            _divide_as_multiply(op, self.keep_float)
            reason = self.float_reason(op)
            if reason is None:
                self.quantize_op(op)
            else:
                if reason != NOT_FLOAT:
                    self.float_ops.append(FloatOp(op.opcode, op.module, reason, reason == KEPT, g.name))
                op.inputs = [None if t is None else self.as_float(t, op.source) for t in op.inputs]
                self.ops.append(op)
        g.outputs = [self._output(t, io) for t in g.outputs]
        g.ops = self.ops
        return self.quantized_ops

    def _integer_inputs(self, io: str) -> None:
        g = self.graph
        for i, x in enumerate(g.inputs):
            params = self.activation_params(x)
            if x.dtype != np.float32 or params is None:
                continue
            q = self.new_tensor(x, self.act, params, "int")
            outer = q
            if io == "uint8":
                outer = self.new_tensor(x, np.uint8, _params(params.scale, params.zero_point + 128), "uint8")
                self.ops.append(ir.Op("QUANTIZE", [outer], [q]))
            self.ops.append(ir.Op("DEQUANTIZE", [q], [x]))  # for float consumers; dropped when unused
            self.int_of[x.id] = q
            g.inputs[i] = outer

    def _output(self, t: ir.Tensor, io: str) -> ir.Tensor:
        if t.is_const:
            return t
        if io == "float":
            return self.as_float(t)
        if t.dtype != np.float32 and not self.is_int(t):
            return t
        if not self.is_int(t) and self.activation_params(t) is None:
            return t
        q = self.as_int(t)
        if io == "uint8":
            u = self.new_tensor(q, np.uint8, _params(q.quant.scale, q.quant.zero_point + 128), "uint8")
            self.ops.append(ir.Op("QUANTIZE", [q], [u]))
            return u
        return q


def _divide_as_multiply(op: ir.Op, keep_float) -> None:
    """DIV by a nonzero float constant becomes MUL by its reciprocal (within an ulp): LiteRT
    has no int8 DIV, and hard-sigmoid gates (relu6(x + 3) / 6) divide by constants."""
    if op.opcode != "DIV" or len(op.inputs) != 2 or keeps_float(op, keep_float):
        return
    divisor = op.inputs[1]
    if (
        divisor is None
        or not divisor.is_const
        or divisor.dtype != np.float32
        or not np.all(divisor.data != 0)
        or not np.all(np.isfinite(divisor.data))
    ):
        return
    reciprocal = np.asarray(1.0 / np.asarray(divisor.data, np.float64), np.float32).reshape(divisor.shape)
    op.opcode = "MUL"
    op.inputs = [op.inputs[0], ir.Tensor(f"{divisor.name}_reciprocal", divisor.shape, np.float32, data=reciprocal)]


def quantize_graph(
    graph: ir.Graph,
    ranges: dict,
    *,
    activations: str = "int8",
    io: str = "float",
    keep_float=(),
    fixed: dict | None = None,
) -> tuple[int, list[FloatOp]]:
    """Rewrite `graph` in place to integer arithmetic; returns how many ops were quantized
    and the ops left in float (with the reason).

    ranges: tensor id -> (min, max) of float activations (from calibration).
    fixed: tensor id -> QuantParams that override ranges (a PT2E model's own choices).
    """
    from converter.passes.remove_dead_code import remove_dead_code

    rewriter = _Rewriter(graph, ranges, fixed or {}, activations, keep_float)
    count = rewriter.run(io)
    remove_dead_code(graph)
    return count, rewriter.float_ops
