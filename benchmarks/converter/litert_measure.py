"""Measure .tflite models in the LiteRT interpreter: outputs, latency, error, op histogram.

Latency: the Python `Interpreter` with XNNPACK (applied by default) on 1 thread; after
warm-up runs, the median of repeated `invoke()` calls. When two models are compared, their
runs alternate (A, B, B, A, ...) so that load from other processes hits both alike.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from benchmarks.harness import interleaved
from common.tflite_schema import BUILTIN_NAMES
from runtimes.litert import without_xnnpack_notice


class LoadedModel:
    """A .tflite model loaded into a 1-thread XNNPACK interpreter, callable with numpy inputs."""

    def __init__(self, content: bytes, threads: int = 1):
        self.content = content
        with without_xnnpack_notice():
            self.interpreter = Interpreter(model_content=content, num_threads=threads)
            self.interpreter.allocate_tensors()
        self.inputs = sorted(self.interpreter.get_input_details(), key=lambda d: d["index"])
        self.outputs = sorted(self.interpreter.get_output_details(), key=lambda d: d["index"])

    def set_inputs(self, arrays) -> None:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"the model takes {len(self.inputs)} inputs, got {len(arrays)}")
        for detail, array in zip(self.inputs, arrays):
            if tuple(detail["shape"]) != tuple(array.shape):
                raise ValueError(
                    f"input {detail['name']!r} has shape {tuple(detail['shape'])}, the sample has {array.shape}"
                )
            self.interpreter.set_tensor(detail["index"], np.ascontiguousarray(array, dtype=detail["dtype"]))

    def invoke_seconds(self) -> float:
        start = time.perf_counter()
        self.interpreter.invoke()
        return time.perf_counter() - start

    def run(self, arrays) -> list[np.ndarray]:
        self.set_inputs(arrays)
        self.interpreter.invoke()
        return [self.interpreter.get_tensor(d["index"]).copy() for d in self.outputs]


def invoke_times(models: list[LoadedModel], arrays, runs: int = 20, warmup: int = 3, clock=time.perf_counter):
    """Seconds of each invoke (by `clock`, e.g. time.thread_time), per model; invokes
    interleaved A B B A ... after warm-up, so load and position hit all models alike."""
    for model in models:
        model.set_inputs(arrays)
    samples = interleaved([m.interpreter.invoke for m in models], runs, clock, warmup)
    return [[ms / 1e3 for ms in s] for s in samples]


def median_latencies(models: list[LoadedModel], arrays, runs: int = 20, warmup: int = 3) -> list[float]:
    """Median wall seconds per invoke for each model (`invoke_times`)."""
    return [statistics.median(s) for s in invoke_times(models, arrays, runs, warmup)]


def max_relative_error(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """max |actual - expected| / max |expected| over all outputs (each output scaled by its own
    largest magnitude, so values near zero do not blow the figure up)."""
    if len(actual) != len(expected):
        raise ValueError(f"{len(actual)} outputs, expected {len(expected)}")
    worst = 0.0
    for a, e in zip(actual, expected):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        if a.shape != e.shape:
            raise ValueError(f"output shape {a.shape}, expected {e.shape}")
        scale = max(float(np.abs(e).max(initial=0.0)), 1e-12)
        worst = max(worst, float(np.abs(a - e).max(initial=0.0)) / scale)
    return worst


def op_histogram(content: bytes) -> Counter:
    """How many times each operator (builtin name, or custom code) appears in all subgraphs."""
    model = schema.Model.GetRootAs(content, 0)
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        names.append(custom.decode() if custom else BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"))
    histogram: Counter = Counter()
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for o in range(subgraph.OperatorsLength()):
            histogram[names[subgraph.Operators(o).OpcodeIndex()]] += 1
    return histogram


def histogram_summary(histogram: dict, top: int = 4) -> str:
    """'CONV_2D 20, ADD 8, ...' for the `top` most frequent ops, then '+N kinds'."""
    common = sorted(histogram.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{name} {count}" for name, count in common[:top])
    return text + (f", +{len(common) - top} kinds" if len(common) > top else "")
