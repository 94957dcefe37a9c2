"""Fuse a RELU/RELU6/RELU_N1_TO_1 op into the op producing its input.

Most TFLite kernels apply a clamp to their result through the option
`fusedActivationFunction` at no cost; a separate activation op costs a pass over the
tensor. Only clamps are fused: kernels compute the fused activation as a [min, max]
range and silently ignore TANH/SIGN_BIT there, so a TANH stays an op. CONCATENATION
has the option but its kernel rejects any activation (and XNNPACK ignores it), so it
is no fusion target either (both checked with ai-edge-litert 2.3.0).

Guarantees: fuses only when the producer is in `FUSIBLE_PRODUCERS`, has no fused
activation yet and one output, that output is read by the activation alone and is no
graph output, and both tensors have the same dtype. The activation's output tensor
becomes the producer's output (it keeps its quantization parameters).
"""

from __future__ import annotations

import numpy as np

from converter.ir import Graph

from ._graph import Uses, activation, remove_ops

ACTIVATIONS = frozenset({"RELU", "RELU6", "RELU_N1_TO_1"})

# Builtins whose options carry fusedActivationFunction and whose kernels honour it.
FUSIBLE_PRODUCERS = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "TRANSPOSE_CONV",
        "AVERAGE_POOL_2D",
        "MAX_POOL_2D",
        "L2_POOL_2D",
        "CONV_3D",
        "CONV_3D_TRANSPOSE",
    }
)

_FUSIBLE_DTYPES = {np.dtype(d) for d in (np.float32, np.float16, np.int8, np.uint8, np.int16)}


def fuse_activations(graph: Graph) -> Graph:
    """Fold activation ops into their producers' `fusedActivationFunction` (in place)."""
    uses = Uses(graph)
    dead = []
    for act in graph.ops:
        if act.opcode not in ACTIVATIONS or act.options.get("fusedActivationFunction") not in (None, "NONE", 0):
            continue
        x = act.inputs[0]
        producer = uses.producer.get(x.id)
        if (
            producer is None
            or producer.opcode not in FUSIBLE_PRODUCERS
            or len(producer.outputs) != 1
            or activation(producer) != "NONE"
        ):
            continue
        if uses.only_consumer(x) is not act or x.dtype != act.outputs[0].dtype or x.dtype not in _FUSIBLE_DTYPES:
            continue
        producer.options["fusedActivationFunction"] = act.opcode
        producer.outputs[0] = act.outputs[0]
        dead.append(act)
    remove_ops(graph, dead)
    return graph
