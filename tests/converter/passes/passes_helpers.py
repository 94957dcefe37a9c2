"""Build small IR graphs by hand and run them through the real LiteRT interpreter.

Graphs are written the way lowering writes them (PyTorch layout, layout-bound ops
wrapped in TRANSPOSEs), so the pass tests check exactly what the passes will see.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from converter import ir
from converter.writer import write_flatbuffer
from runtimes.litert import LiteRTModel

NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]


class GraphBuilder:
    """Emit ops like a lowering function would: `b.op("ADD", [x, y])` returns the output."""

    def __init__(self, seed: int = 0):
        self.graph = ir.Graph()
        self.rng = np.random.default_rng(seed)
        self._n = 0

    def _name(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    def input(self, shape, dtype=np.float32, signature=None) -> ir.Tensor:
        t = ir.Tensor(self._name("in"), shape, dtype, shape_signature=signature)
        self.graph.inputs.append(t)
        self.graph.input_names.append(f"args_{len(self.graph.input_names)}")
        return t

    def const(self, value, dtype=None) -> ir.Tensor:
        """A constant; Python floats become float32 (TFLite kernels have no float64)."""
        data = np.array(value, dtype=dtype, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        if dtype is None and data.dtype == np.float64:
            data = data.astype(np.float32)
        return ir.Tensor(self._name("c"), data.shape, data.dtype, data=data)

    def random(self, shape, scale=1.0) -> ir.Tensor:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, opcode, inputs, options=None, shape=None, dtype=None, n_out=1):
        """Append an op; the output shape defaults to the first input's."""
        shape = inputs[0].shape if shape is None else shape
        dtype = inputs[0].dtype if dtype is None else dtype
        outs = [ir.Tensor(self._name(opcode.lower()), shape, dtype) for _ in range(n_out)]
        self.graph.ops.append(ir.Op(opcode, list(inputs), outs, dict(options or {})))
        return outs[0] if n_out == 1 else outs

    def output(self, *tensors) -> ir.Graph:
        for t in tensors:
            self.graph.outputs.append(t)
            self.graph.output_names.append(f"output_{len(self.graph.output_names)}")
        return self.graph

    # ---- lowering-shaped helpers ---------------------------------------------------------
    def transpose(self, x, perm):
        return self.op("TRANSPOSE", [x, self.const(perm, np.int32)], shape=tuple(x.shape[p] for p in perm))

    def reshape(self, x, shape):
        return self.op("RESHAPE", [x, self.const(shape, np.int32)], {"newShape": list(shape)}, shape=shape)

    def conv_nchw(self, x, out_channels, k=3, stride=1, padding="SAME", bias=True, depthwise=False):
        """conv2d as lowering emits it: TRANSPOSE -> CONV_2D -> TRANSPOSE."""
        n, c, h, w = x.shape
        xh = self.transpose(x, NCHW_TO_NHWC)
        if padding == "SAME":
            oh, ow = -(-h // stride), -(-w // stride)
        else:
            oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
        opts = {"padding": padding, "strideH": stride, "strideW": stride, "fusedActivationFunction": "NONE"}
        if depthwise:
            out_channels = c
            weights = self.random((1, k, k, c), 0.3)
            opcode = "DEPTHWISE_CONV_2D"
            opts["depthMultiplier"] = 1
        else:
            weights = self.random((out_channels, k, k, c), 0.3)
            opcode = "CONV_2D"
        b = self.random((out_channels,), 0.1) if bias else None
        y = self.op(opcode, [xh, weights, b], opts, shape=(n, oh, ow, out_channels))
        return self.transpose(y, NHWC_TO_NCHW)

    def batch_norm_nchw(self, x):
        """Inference batch norm as lowering emits it: MUL and ADD by [C,1,1] constants."""
        c = x.shape[1]
        scale = self.const((self.rng.uniform(0.5, 1.5, (c, 1, 1))).astype(np.float32))
        shift = self.random((c, 1, 1), 0.1)
        return self.op("ADD", [self.op("MUL", [x, scale]), shift])


def run(graph: ir.Graph, inputs) -> list[np.ndarray]:
    """Outputs of `graph` on `inputs`, computed by the LiteRT interpreter."""
    model = LiteRTModel(write_flatbuffer(ir.Model([graph])))
    return model.run(inputs)


def histogram(graph: ir.Graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in graph.ops:
        counts[op.opcode] = counts.get(op.opcode, 0) + 1
    return counts


def check_pass(
    build: Callable[[GraphBuilder], ir.Graph],
    apply: Callable[[ir.Graph], object],
    rtol: float = 1e-5,
    atol: float = 1e-5,
    seed: int = 0,
) -> ir.Graph:
    """Build the graph twice, run the pass on one, and assert both give the same
    outputs in LiteRT on random inputs. Returns the transformed graph."""
    reference = build(GraphBuilder(seed))
    optimized = build(GraphBuilder(seed))
    apply(optimized)
    rng = np.random.default_rng(seed + 1)
    inputs = [rng.standard_normal(t.shape).astype(t.dtype) for t in reference.inputs]
    expected = run(reference, inputs)
    actual = run(optimized, inputs)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    return optimized
