"""Recurrent layers: `aten.lstm.input` and `aten.gru.input` (nn.LSTM, nn.GRU).

Both ops are kept whole (decompositions.KEEP) and lowered here for every variant nn.LSTM
and nn.GRU produce: uni- and bidirectional, any number of layers, batch_first either way,
with or without initial states and biases, LSTM projections (`proj_size`). The result is
(output, h_n[, c_n]) exactly as PyTorch returns it. Two forms, chosen by what measured
faster in LiteRT (benchmarks/converter/recurrent_bench.py):

Unrolled (GRU always; LSTM with batch > 1, a dynamic batch, or projections), with the
work hoisted out of the time loop:
- the input projection of every time step is ONE FULLY_CONNECTED over the whole sequence
  (keepNumDims), with both biases folded in; UNPACK then hands each step its slice;
- each step adds one FULLY_CONNECTED of the hidden state (no bias) and the gate math;
- LSTM gate rows are reordered in numpy from PyTorch's (i, f, g, o) to (i, f, o, g), so one
  LOGISTIC covers three gates and one TANH the cell candidate;
- a zero initial state (the default) skips the first step's recurrent matmul;
- outputs of a direction are one PACK along the time axis, directions one CONCATENATION.

Fused (LSTM with a static batch of 1): one UNIDIRECTIONAL_SEQUENCE_LSTM per layer and
direction (the reverse direction runs on a REVERSE_V2 of the sequence). Its hidden and cell
states are variable tensors that the kernel updates in place and that persist between
invocations; an ADD of zero rewrites them from the initial states (inputs or zeros) at the
start of every call, so the model stays stateless, and the final cell state is read back
from the variable (ordered after the LSTM by a zero term on its output, so no delegate reads
it early). Passes never fold or merge ops that write variable tensors.

The batch dimension may be dynamic; the time axis may not (torch.export itself fixes it
for these ops).
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Op, Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten


class _Shapes:
    """Sample shapes and shape signatures of (batch, features) tensors in one layer."""

    def __init__(self, x: Tensor, time_axis: int):
        batch_axis = 1 - time_axis
        self.time_axis = time_axis
        self.steps = x.shape[time_axis]
        self.batch = x.shape[batch_axis]
        self.dynamic_batch = x.is_dynamic and x.shape_signature[batch_axis] == -1
        if x.is_dynamic and x.shape_signature[time_axis] == -1:
            raise ValueError("dynamic sequence length")  # turned into a clear error by the caller

    def rows(self, width: int):
        """(shape, signature) of a (batch, width) tensor."""
        return (self.batch, width), ((-1, width) if self.dynamic_batch else None)

    def sequence(self, width: int):
        """(shape, signature) of a whole-sequence tensor with `width` features."""
        shape = [0, 0, width]
        shape[self.time_axis], shape[1 - self.time_axis] = self.steps, self.batch
        sig = None
        if self.dynamic_batch:
            sig = list(shape)
            sig[1 - self.time_axis] = -1
            sig = tuple(sig)
        return tuple(shape), sig


def _const_array(ctx, t: Tensor | None, what: str) -> np.ndarray | None:
    if t is None:
        return None
    if not t.is_const:
        raise emit.unsupported(
            ctx,
            f"a recurrent layer whose {what} is computed in the graph",
            "Recurrent weights must be parameters (constants) of the module.",
        )
    return t.data.astype(np.float32)


def _fc(ctx, x: Tensor, weight: np.ndarray, bias: np.ndarray | None, shape, signature) -> Tensor:
    """FULLY_CONNECTED with keepNumDims: x (..., in) @ weight.T (+ bias) -> (..., out)."""
    inputs = [x, ctx.const(np.ascontiguousarray(weight)), None if bias is None else ctx.const(bias)]
    return emit.op(
        ctx,
        "FULLY_CONNECTED",
        inputs,
        {
            "fusedActivationFunction": "NONE",
            "weightsFormat": "DEFAULT",
            "keepNumDims": True,
            "asymmetricQuantizeInputs": False,
        },
        shape=shape,
        dtype=np.float32,
        signature=signature,
    )


def _split(ctx, x: Tensor, sizes: list[int], axis: int) -> list[Tensor]:
    """SPLIT_V of x into `sizes` along `axis` (other dims, dynamic or not, unchanged)."""
    parts = []
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = size
        sig = None
        if x.is_dynamic:
            sig = list(x.shape_signature)
            sig[axis] = size
        parts.append(ctx.tensor(shape, x.dtype, signature=None if sig is None else tuple(sig)))
    ctx.graph.ops.append(
        Op("SPLIT_V", [x, emit.int32(ctx, sizes), emit.int32(ctx, axis)], parts, {"numSplits": len(sizes)}, ctx.source)
    )
    return parts


def _unpack(ctx, x: Tensor, axis: int, sh: _Shapes) -> list[Tensor]:
    """UNPACK a whole-sequence tensor into its time steps, each (batch, features)."""
    shape, sig = sh.rows(x.shape[-1])
    steps = [ctx.tensor(shape, x.dtype, signature=sig) for _ in range(x.shape[axis])]
    ctx.graph.ops.append(Op("UNPACK", [x], steps, {"num": len(steps), "axis": axis}, ctx.source))
    return steps


def _pack(ctx, steps: list[Tensor], sh: _Shapes) -> Tensor:
    shape, sig = sh.sequence(steps[0].shape[-1])
    return emit.op(
        ctx,
        "PACK",
        steps,
        {"valuesCount": len(steps), "axis": sh.time_axis},
        shape=shape,
        dtype=np.float32,
        signature=sig,
    )


def _binary(ctx, opcode: str, a: Tensor, b: Tensor) -> Tensor:
    return emit.binary(ctx, opcode, a, b)


def _unary(ctx, opcode: str, x: Tensor) -> Tensor:
    return emit.unary(ctx, opcode, x)


def _is_zero(ctx, t: Tensor) -> bool:
    """A known-zero state: a zero constant, or (dynamic batch) a FILL with 0 or a slice of one."""
    if t.is_const:
        return not np.any(t.data)
    producer = next((op for op in reversed(ctx.graph.ops) if t in op.outputs), None)
    if producer is None:
        return False
    if producer.opcode == "FILL":
        return _is_zero(ctx, producer.inputs[1])
    return producer.opcode == "STRIDED_SLICE" and _is_zero(ctx, producer.inputs[0])


def _state(ctx, states: Tensor, index: int) -> Tensor:
    """states[index] of a (layers * directions, batch, hidden) initial state."""
    if states.is_const:
        return ctx.const(states.data[index].astype(np.float32))
    # (a dynamic batch axis taken whole becomes a mask bit: the slice follows the run-time batch)
    return emit.strided_slice(ctx, states, [index, 0, 0], [index + 1, *states.shape[1:]], [1, 1, 1], shrink_axis_mask=1)


def _stack_states(ctx, finals: list[Tensor], sh: _Shapes) -> Tensor:
    shape, sig = sh.rows(finals[0].shape[-1])
    return emit.op(
        ctx,
        "PACK",
        finals,
        {"valuesCount": len(finals), "axis": 0},
        shape=(len(finals), *shape),
        dtype=np.float32,
        signature=None if sig is None else (len(finals), *sig),
    )


# ---- one direction of one layer ------------------------------------------------------------


def _lstm_direction(ctx, x: Tensor, weights, h: Tensor, c: Tensor, sh: _Shapes, reverse: bool):
    """Run one LSTM direction over x (whole sequence). Returns (outputs per step, h, c)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    hidden = w_hh.shape[1]
    cell = w_ih.shape[0] // 4
    order = np.concatenate([np.arange(0, 2 * cell), np.arange(3 * cell, 4 * cell), np.arange(2 * cell, 3 * cell)])
    w_ih, w_hh = w_ih[order], w_hh[order]  # (i, f, g, o) -> (i, f, o, g)
    bias = None
    if b_ih is not None:
        bias = (b_ih + b_hh)[order]
    xshape, xsig = sh.sequence(4 * cell)
    projected = _unpack(ctx, _fc(ctx, x, w_ih, bias, xshape, xsig), sh.time_axis, sh)
    rows, rows_sig = sh.rows(4 * cell)
    outputs = [None] * sh.steps
    h_zero, c_zero = _is_zero(ctx, h), _is_zero(ctx, c)
    for t in reversed(range(sh.steps)) if reverse else range(sh.steps):
        gates = projected[t]
        if not h_zero:
            gates = _binary(ctx, "ADD", gates, _fc(ctx, h, w_hh, None, rows, rows_sig))
        sigmoid_part, candidate = _split(ctx, gates, [3 * cell, cell], 1)
        i, f, o = _split(ctx, _unary(ctx, "LOGISTIC", sigmoid_part), [cell] * 3, 1)
        new_info = _binary(ctx, "MUL", i, _unary(ctx, "TANH", candidate))
        c = new_info if c_zero else _binary(ctx, "ADD", _binary(ctx, "MUL", f, c), new_info)
        h = _binary(ctx, "MUL", o, _unary(ctx, "TANH", c))
        if w_hr is not None:
            h = _fc(ctx, h, w_hr, None, *sh.rows(hidden))
        h_zero = c_zero = False
        outputs[t] = h
    return outputs, h, c


def _state_variable(ctx, state: Tensor) -> Tensor:
    """A variable tensor holding `state`, rewritten on EVERY invocation by an ADD of zero:
    the fused LSTM keeps its states in variable tensors that otherwise persist between
    calls (a stateless nn.LSTM would drift from the second call on)."""
    variable = ctx.tensor(state.shape, np.float32, signature=state.shape_signature)
    variable.is_variable = True
    ctx.graph.ops.append(
        Op(
            "ADD",
            [state, emit.scalar_like(ctx, 0.0, np.float32)],
            [variable],
            {"fusedActivationFunction": "NONE"},
            ctx.source,
        )
    )
    return variable


def _lstm_builtin(ctx, x: Tensor, weights, h: Tensor, c: Tensor, sh: _Shapes, reverse: bool):
    """One direction as LiteRT's UNIDIRECTIONAL_SEQUENCE_LSTM. Returns (sequence, h, c);
    the op leaves its final cell state in the cell-state variable."""
    w_ih, w_hh, b_ih, b_hh, _ = weights
    hidden = w_hh.shape[1]
    time = sh.time_axis
    if reverse:
        x = emit.op(
            ctx, "REVERSE_V2", [x, emit.int32(ctx, [time])], shape=x.shape, dtype=x.dtype, signature=x.shape_signature
        )
    bias = b_ih + b_hh if b_ih is not None else np.zeros(4 * hidden, np.float32)
    rows = [slice(k * hidden, (k + 1) * hidden) for k in range(4)]  # i, f, g (TFLite's "cell"), o
    h_var, c_var = _state_variable(ctx, h), _state_variable(ctx, c)
    inputs = [
        x,
        *(ctx.const(np.ascontiguousarray(w_ih[r])) for r in rows),
        *(ctx.const(np.ascontiguousarray(w_hh[r])) for r in rows),
        None,
        None,
        None,
        *(ctx.const(bias[r]) for r in rows),
        None,
        None,
        h_var,
        c_var,
        None,
        None,
        None,
        None,
    ]
    y = emit.op(
        ctx,
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        inputs,
        {
            "fusedActivationFunction": "TANH",
            "cellClip": 0.0,
            "projClip": 0.0,
            "timeMajor": time == 0,
            "asymmetricQuantizeInputs": False,
            "diagonalRecurrentTensors": False,
        },
        shape=sh.sequence(hidden)[0],
        dtype=np.float32,
        signature=sh.sequence(hidden)[1],
    )
    last = [0, 0, 0]
    last[time] = -1
    h_final = emit.op(
        ctx,
        "STRIDED_SLICE",
        [y, emit.int32(ctx, last), emit.int32(ctx, [0, 0, 0]), emit.int32(ctx, [1, 1, 1])],
        {
            "beginMask": 7 & ~(1 << time),
            "endMask": 7,
            "ellipsisMask": 0,
            "newAxisMask": 0,
            "shrinkAxisMask": 1 << time,
            "offset": False,
        },
        shape=sh.rows(hidden)[0],
        dtype=np.float32,
        signature=sh.rows(hidden)[1],
    )
    # The final cell state is read from the variable, through a zero term on h_final so
    # that, as dataflow, it comes after the LSTM (else a delegate may read it first).
    after_lstm = emit.binary(ctx, "MUL", h_final, emit.scalar_like(ctx, 0.0, np.float32))
    c_final = emit.binary(ctx, "ADD", c_var, after_lstm)
    if reverse:
        y = emit.op(
            ctx, "REVERSE_V2", [y, emit.int32(ctx, [time])], shape=y.shape, dtype=y.dtype, signature=y.shape_signature
        )
    return y, h_final, c_final


def _gru_direction(ctx, x: Tensor, weights, h: Tensor, sh: _Shapes, reverse: bool):
    """Run one GRU direction over x. Returns (outputs per step, h).

    r, z = sigmoid(x W_ir/iz + h W_hr/hz + biases); n = tanh(x W_in + b_in + r (h W_hn + b_hn));
    h' = n + z (h - n). The r/z recurrent biases are folded into the input projection."""
    w_ih, w_hh, b_ih, b_hh, _ = weights
    hidden = w_hh.shape[1]
    in_bias = rec_bias = None
    if b_ih is not None:
        in_bias = b_ih + np.concatenate([b_hh[: 2 * hidden], np.zeros(hidden, np.float32)])
        rec_bias = np.concatenate([np.zeros(2 * hidden, np.float32), b_hh[2 * hidden :]])
    xshape, xsig = sh.sequence(3 * hidden)
    projected = _fc(ctx, x, w_ih, in_bias, xshape, xsig)
    x_rz, x_n = _split(ctx, projected, [2 * hidden, hidden], 2)
    x_rz, x_n = _unpack(ctx, x_rz, sh.time_axis, sh), _unpack(ctx, x_n, sh.time_axis, sh)
    rows, rows_sig = sh.rows(3 * hidden)
    outputs = [None] * sh.steps
    h_zero = _is_zero(ctx, h)
    for t in reversed(range(sh.steps)) if reverse else range(sh.steps):
        if h_zero:  # h W_hh is zero: only the bias of n remains
            r, z = _split(ctx, _unary(ctx, "LOGISTIC", x_rz[t]), [hidden, hidden], 1)
            h_n = ctx.const(np.zeros(hidden, np.float32) if rec_bias is None else rec_bias[2 * hidden :])
            n = _unary(ctx, "TANH", _binary(ctx, "ADD", x_n[t], _binary(ctx, "MUL", r, h_n)))
            h = _binary(ctx, "SUB", n, _binary(ctx, "MUL", z, n))
        else:
            h_rz, h_n = _split(ctx, _fc(ctx, h, w_hh, rec_bias, rows, rows_sig), [2 * hidden, hidden], 1)
            r, z = _split(ctx, _unary(ctx, "LOGISTIC", _binary(ctx, "ADD", x_rz[t], h_rz)), [hidden, hidden], 1)
            n = _unary(ctx, "TANH", _binary(ctx, "ADD", x_n[t], _binary(ctx, "MUL", r, h_n)))
            h = _binary(ctx, "ADD", n, _binary(ctx, "MUL", z, _binary(ctx, "SUB", h, n)))
        h_zero = False
        outputs[t] = h
    return outputs, h


# ---- the ops ---------------------------------------------------------------------------------


def _layer_weights(ctx, params, has_biases: bool, num_layers: int, bidirectional: bool):
    """[(w_ih, w_hh, b_ih, b_hh, w_hr)] per (layer, direction), in PyTorch's order."""
    directions = 2 if bidirectional else 1
    per = len(params) // (num_layers * directions)
    arrays = [_const_array(ctx, p, "weights") for p in params]
    out = []
    for k in range(num_layers * directions):
        group = arrays[k * per : (k + 1) * per]
        w_ih, w_hh = group[0], group[1]
        b_ih, b_hh = (group[2], group[3]) if has_biases else (None, None)
        w_hr = group[4 if has_biases else 2] if per in (3, 5) else None
        out.append((w_ih, w_hh, b_ih, b_hh, w_hr))
    return out


def _check(ctx, x: Tensor, dropout: float, train: bool, batch_first: bool) -> _Shapes:
    if train and dropout > 0:
        raise emit.unsupported(ctx, "recurrent dropout in training mode", "Convert the model in eval mode.")
    if x.rank != 3:
        raise emit.unsupported(ctx, f"a rank-{x.rank} recurrent input", "Pass (batch, time, features) input.")
    try:
        return _Shapes(x, 1 if batch_first else 0)
    except ValueError:
        raise emit.unsupported(
            ctx,
            "a dynamic sequence length for LSTM/GRU (unrolled over time)",
            "Export with a static sequence length (dynamic batch is supported), or pad sequences to a fixed length.",
        ) from None


def _run_layers(ctx, x, weights, num_layers, bidirectional, sh, step_fn):
    """Stack layers and directions; `step_fn(x, weights, k, reverse)` runs one direction
    and returns (its output sequence, its final states)."""
    finals = []
    for layer in range(num_layers):
        directions = [False, True] if bidirectional else [False]
        sequences = []
        for d, reverse in enumerate(directions):
            k = layer * len(directions) + d
            sequence, states = step_fn(x, weights[k], k, reverse)
            sequences.append(sequence)
            finals.append(states)
        x = sequences[0] if len(sequences) == 1 else emit.concat(ctx, sequences, 2)
    return x, finals


def _use_builtin(sh: _Shapes, weights) -> bool:
    """The fused LSTM where it measured faster: a static batch of 1 (0.3-0.7x the unrolled
    latency; at batch 8 it was 2x slower), and no projection (kept unrolled)."""
    return not sh.dynamic_batch and sh.batch == 1 and all(w[4] is None for w in weights)


@lowers(aten.lstm.input)
def lstm(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    sh = _check(ctx, x, dropout, train, batch_first)
    weights = _layer_weights(ctx, params, has_biases, num_layers, bidirectional)
    h0, c0 = hx

    builtin = _use_builtin(sh, weights)

    def run(seq, w, k, reverse):
        h, c = _state(ctx, h0, k), _state(ctx, c0, k)
        if builtin:
            y, h, c = _lstm_builtin(ctx, seq, w, h, c, sh, reverse)
            return y, (h, c)
        outputs, h, c = _lstm_direction(ctx, seq, w, h, c, sh, reverse)
        return _pack(ctx, outputs, sh), (h, c)

    y, finals = _run_layers(ctx, x, weights, num_layers, bidirectional, sh, run)
    h_n = _stack_states(ctx, [h for h, _ in finals], sh)
    c_n = _stack_states(ctx, [c for _, c in finals], sh)
    return y, h_n, c_n


@lowers(aten.gru.input)
def gru(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    sh = _check(ctx, x, dropout, train, batch_first)
    weights = _layer_weights(ctx, params, has_biases, num_layers, bidirectional)

    def run(seq, w, k, reverse):
        outputs, h = _gru_direction(ctx, seq, w, _state(ctx, hx, k), sh, reverse)
        return _pack(ctx, outputs, sh), h

    y, finals = _run_layers(ctx, x, weights, num_layers, bidirectional, sh, run)
    return y, _stack_states(ctx, finals, sh)
