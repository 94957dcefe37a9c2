"""torch.ao PT2E / QAT models: honour their quantize/dequantize pairs.

Lowering turns a PT2E model's activation fake-quantization into QUANTIZE -> DEQUANTIZE
op pairs (`converter/lowering/quantized.py`). `absorb_qdq` removes every such pair from
the float graph and returns the parameters it fixed, keyed by the id of the float
tensor it quantized; `full_integer.quantize_graph(..., fixed=...)` then uses exactly
those parameters instead of calibrated ones. Ops PT2E left unquantized (no pair around
them) stay float.
"""

from __future__ import annotations

import numpy as np

from converter import ir


def has_qdq(model: ir.Model) -> bool:
    """True when a graph holds a QUANTIZE from float (a PT2E/QAT model's fake quantization)."""
    return any(op.opcode == "QUANTIZE" and op.inputs[0].dtype == np.float32 for g in model.graphs for op in g.ops)


def absorb_qdq(graph: ir.Graph) -> dict[int, ir.QuantParams]:
    """Remove QUANTIZE(float x) -> DEQUANTIZE pairs (in place); returns {x.id: params}."""
    consumers = graph.consumers()
    fixed: dict[int, ir.QuantParams] = {}
    dropped: set[int] = set()
    for op in graph.ops:
        if op.opcode != "QUANTIZE" or op.inputs[0].dtype != np.float32:
            continue
        x, q = op.inputs[0], op.outputs[0]
        readers = consumers.get(q.id, [])
        if q in graph.outputs or not readers or any(r.opcode != "DEQUANTIZE" for r in readers):
            continue  # an integer output the user asked for: leave it
        fixed[x.id] = q.quant
        dropped.add(id(op))
        for r in readers:
            graph.replace_uses(r.outputs[0], x)
            dropped.add(id(r))
    graph.ops = [op for op in graph.ops if id(op) not in dropped]
    return fixed
