"""Quantization sensitivity: which layers cost accuracy, measured in LiteRT.

From one float conversion and one calibration, for each layer (the user's nn.Module
names, as `keep_float=` takes them):
- `alone`: the error that quantizing this layer alone (everything else float) adds to
  the model's output;
- `in_full`: in the fully quantized model, the error of this layer's output against the
  float model's activation at the same place (errors accumulated up to that layer).
Errors are relative RMS: sqrt(sum (q - f)^2 / sum f^2), averaged over the evaluation
samples. Variants are copies of the float IR quantized with a layer predicate; nothing
is exported twice. The interpreter comes from the caller (`runner`, as in calibrate.py).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from converter import ir
from converter.quantize import full_integer
from converter.quantize.select import layer_of

_MOVES = ("QUANTIZE", "DEQUANTIZE")


@dataclass
class LayerSensitivity:
    name: str
    ops: list[str]  # TFLite ops of the layer that quantize
    alone: float  # output error with only this layer quantized
    in_full: float | None  # this layer's activation error in the fully quantized model
    alone_agreement: float | None = None  # top-1 agreement with only this layer quantized (classifiers)


@dataclass
class SensitivityReport:
    scheme: str
    full_error: float  # output error of the fully quantized model
    full_agreement: float | None  # its top-1 agreement (classifiers), else None
    layers: list[LayerSensitivity] = field(default_factory=list)  # in graph order
    samples: int = 0

    def ranking(self) -> list[LayerSensitivity]:
        """Layers, most sensitive (largest `alone` error) first."""
        return sorted(self.layers, key=lambda s: -s.alone)

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "full_error": self.full_error,
            "full_agreement": self.full_agreement,
            "samples": self.samples,
            "layers": [asdict(s) for s in self.layers],
        }

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def table(self, top: int | None = None):
        """A rich Table: layers by sensitivity."""
        from rich.table import Table

        agree = "" if self.full_agreement is None else f", top-1 agreement {self.full_agreement:.1%}"
        table = Table(
            title=f"{self.scheme}: output error {self.full_error:.4f} fully quantized{agree} ({self.samples} samples)"
        )
        for col in ("rank", "layer", "ops", "error alone", "error in full model"):
            table.add_column(col, justify="right" if col in ("rank", "error alone", "error in full model") else "left")
        for rank, s in enumerate(self.ranking()[:top], 1):
            table.add_row(
                str(rank),
                s.name,
                ",".join(sorted(set(s.ops))),
                f"{s.alone:.5f}",
                "-" if s.in_full is None else f"{s.in_full:.5f}",
            )
        return table

    def print(self, top: int | None = 20, console=None) -> None:
        from rich.console import Console

        (console or Console()).print(self.table(top))

    def plot(self, path, top: int | None = 30) -> None:
        """Per-layer error bars (alone and in the full model) as a PNG."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        layers = self.ranking()[:top]
        names = [s.name for s in layers]
        y = np.arange(len(layers))
        fig, ax = plt.subplots(figsize=(9, 0.3 * len(layers) + 1.5))
        ax.barh(y - 0.2, [s.alone for s in layers], 0.4, label="quantized alone: output error")
        ax.barh(y + 0.2, [s.in_full or 0.0 for s in layers], 0.4, label="fully quantized: error at this layer")
        ax.set_yticks(y, names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("relative RMS error")
        ax.set_title(f"{self.scheme}: sensitivity per layer (full model output error {self.full_error:.4f})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def relative_error(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    num = sum(float(np.sum((np.asarray(a, np.float64) - e) ** 2)) for a, e in zip(actual, expected))
    den = sum(float(np.sum(np.asarray(e, np.float64) ** 2)) for e in expected)
    return float(np.sqrt(num / max(den, 1e-30)))


def _top1(outputs: list[np.ndarray]) -> np.ndarray | None:
    first = outputs[0]
    return np.argmax(first, axis=-1) if first.ndim == 2 and first.shape[-1] > 1 else None


class Evaluator:
    """The float model's outputs on the evaluation samples, and errors of variants."""

    def __init__(self, float_model: ir.Model, ranges, activations: str, samples: list[tuple], runner):
        from converter.writer import write_flatbuffer

        self.float_model, self.ranges, self.activations = float_model, ranges, activations
        self.samples, self.runner = samples, runner
        self.graph_name = float_model.graphs[0].name
        self._write = write_flatbuffer
        self.reference = [self._outputs(runner(write_flatbuffer(float_model)), s) for s in samples]

    def _outputs(self, runtime, sample) -> list[np.ndarray]:
        return [np.asarray(o, np.float64) for o in runtime.run(sample, self.graph_name)]

    def variant(self, keep_float) -> tuple[ir.Model, list]:
        """A quantized copy of the float model; `keep_float`: names, op types or a predicate."""
        model = copy.deepcopy(self.float_model)  # tensor ids survive the copy: ranges apply
        float_ops = []
        for graph in model.graphs:
            _, kept = full_integer.quantize_graph(
                graph, self.ranges[graph.name], activations=self.activations, keep_float=keep_float
            )
            float_ops += kept
        return model, float_ops

    def error(self, model: ir.Model) -> tuple[float, float | None]:
        """(mean relative error of the outputs, top-1 agreement or None) of `model`."""
        runtime = self.runner(self._write(model))
        errors, agree, classifier = [], 0, True
        for sample, expected in zip(self.samples, self.reference):
            actual = self._outputs(runtime, sample)
            errors.append(relative_error(actual, expected))
            a, e = _top1(actual), _top1(expected)
            classifier = classifier and a is not None
            if classifier:
                agree += int(np.all(a == e))
        return float(np.mean(errors)), (agree / len(self.samples) if classifier else None)


def quantized_layers(model: ir.Model, activations: str) -> dict[str, list[str]]:
    """Layer name -> its ops that compute in integers, in graph order (a quantized model)."""
    act = np.dtype(activations)
    layers: dict[str, list[str]] = {}
    for op in model.graphs[0].ops:
        if op.opcode not in _MOVES and any(t.dtype == act for t in op.outputs):
            layers.setdefault(layer_of(op), []).append(op.opcode)
    return layers


def analyze(
    float_model: ir.Model,
    ranges,
    activations: str,
    scheme: str,
    eval_samples: list[tuple],
    runner,
    keep_float=(),
    progress=None,
) -> SensitivityReport:
    """The sensitivity of every quantizable layer of `float_model` (one signature)."""
    if len(float_model.graphs) != 1:
        raise ValueError("the sensitivity analysis takes a model with one signature")
    ev = Evaluator(float_model, ranges, activations, eval_samples, runner)
    full, _ = ev.variant(keep_float)
    full_error, full_agreement = ev.error(full)
    layers = quantized_layers(full, activations)
    in_full = _layer_errors(ev, full, list(layers))
    report = SensitivityReport(scheme, full_error, full_agreement, samples=len(eval_samples))
    names = list(layers)
    if progress is not None:
        names = progress.track(names, "layers quantized one at a time")
    for name in names:
        alone, _ = ev.variant(lambda op, name=name: layer_of(op) != name)
        error, agreement = ev.error(alone)
        report.layers.append(LayerSensitivity(name, layers[name], error, in_full.get(name), agreement))
    return report


def _layer_errors(ev: Evaluator, quantized: ir.Model, names: list[str]) -> dict[str, float]:
    """Per layer: the relative error of its last output in `quantized` against the float
    model's tensor at the same place, over (at most 4 of) the evaluation samples."""
    graph_f, graph_q = ev.float_model.graphs[0], quantized.graphs[0]
    last: dict[str, ir.Tensor] = {}
    for op in graph_f.ops:
        if op.outputs and op.outputs[0].dtype == np.float32:
            last[layer_of(op)] = op.outputs[0]
    index_f = {t.id: i for i, t in enumerate(graph_f.tensors())}
    tensors_q = graph_q.tensors()
    index_q = {t.id: (i, t) for i, t in enumerate(tensors_q)}
    run_f = ev.runner(ev._write(ev.float_model))
    run_q = ev.runner(ev._write(quantized))
    sums: dict[str, list[float]] = {n: [0.0, 0.0] for n in names if n in last and last[n].id in index_q}
    for sample in ev.samples[:4]:
        run_f.run(sample, ev.graph_name)
        run_q.run(sample, ev.graph_name)
        for name in sums:
            t = last[name]
            f = np.asarray(run_f.get_tensor(index_f[t.id], 0), np.float64)
            i, tq = index_q[t.id]
            q = np.asarray(run_q.get_tensor(i, 0), np.float64)
            if tq.quant is not None and tq.dtype != np.float32:
                q = (q - float(tq.quant.zero_point[0])) * float(tq.quant.scale[0])
            sums[name][0] += float(np.sum((q - f) ** 2))
            sums[name][1] += float(np.sum(f**2))
    return {n: float(np.sqrt(a / max(b, 1e-30))) for n, (a, b) in sums.items()}
