"""Calibration: the range of every float activation over the calibration samples.

The float model is written and run in the LiteRT interpreter itself (builtin kernels,
no XNNPACK, `experimental_preserve_all_tensors=True`), so the ranges are those of the
very graph being quantized, after every pass, with no second implementation of any op.
The writer numbers a graph's tensors in `Graph.tensors()` order, so interpreter tensor
i of subgraph g is `model.graphs[g].tensors()[i]`.

Range estimator: the minimum and maximum over all samples (running min/max). It keeps
every calibration value representable, which is what small calibration sets need;
outliers widen the scale (a percentile estimator would clip them instead).
"""

from __future__ import annotations

import numpy as np

from converter import ir

Ranges = dict[int, tuple[float, float]]  # tensor id -> (min, max)


def collect_ranges(model: ir.Model, samples: dict[str, list[tuple[np.ndarray, ...]]], runner) -> dict[str, Ranges]:
    """Per graph name: tensor id -> (min, max) of every float32 non-constant tensor.

    `runner` loads .tflite bytes into the LiteRT interpreter (the API layer passes
    `runtimes.litert.LiteRTModel`; the converter does not import the runtimes):
    `runner(content, use_xnnpack=False, preserve_all_tensors=True)` returns an object
    with `.run(inputs, signature)` and `.interpreter`."""
    from converter.writer import write_flatbuffer

    runtime = runner(write_flatbuffer(model), use_xnnpack=False, preserve_all_tensors=True)
    interpreter = runtime.interpreter
    result: dict[str, Ranges] = {}
    for graph_index, graph in enumerate(model.graphs):
        watched = [(i, t) for i, t in enumerate(graph.tensors()) if not t.is_const and t.dtype == np.float32]
        lows = {t.id: np.inf for _, t in watched}
        highs = {t.id: -np.inf for _, t in watched}
        for sample in samples[graph.name]:
            runtime.run(sample, graph.name)
            for index, t in watched:
                value = interpreter.get_tensor(index, graph_index)
                if value.size:
                    lows[t.id] = min(lows[t.id], float(np.min(value)))
                    highs[t.id] = max(highs[t.id], float(np.max(value)))
        result[graph.name] = {tid: (lows[tid], highs[tid]) for tid in lows
                              if np.isfinite(lows[tid]) and np.isfinite(highs[tid])}  # +-inf: stays float
    return result
