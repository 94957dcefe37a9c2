"""Mixed precision for an accuracy budget (`litert_torch.quantize.auto`).

The layers are ranked by how much quantizing each alone costs (sensitivity.py); the
model keeps the k most sensitive in float, with k the smallest that meets the budget on
the evaluation data. The error grows, in practice, as fewer layers stay float, so k is
found by doubling (0, 1, 2, 4 ...) and then bisecting: about 2 log2(layers) quantized
candidates are measured, each a copy of the float IR run in LiteRT.
"""

from __future__ import annotations

from converter import ir
from converter.quantize import full_integer, sensitivity
from converter.quantize.calibrate import calibrated_ranges
from converter.quantize.config import AutoConfig
from converter.quantize.report import QuantReport
from converter.quantize.select import pinned


def quantize_for_budget(model: ir.Model, config: AutoConfig, runner, progress=None) -> QuantReport:
    """Rewrite `model` in place with the fewest float layers meeting `config`'s budget;
    the report's `auto` holds the chosen keep_float list, the measured error and the
    sensitivity report."""
    base = config.base
    activations = "int16" if base.scheme == "int16x8" else "int8"
    ranges = calibrated_ranges(model, base, runner, progress)
    graph = model.graphs[0]
    evals = list(config.eval_samples[graph.name])
    analysis = sensitivity.analyze(
        model, ranges, activations, str(base), evals, runner, keep_float=base.keep_float, progress=progress
    )
    modules_with_ops = {op.module for op in graph.ops if op.module}
    order = [pinned(s.name, modules_with_ops) for s in analysis.ranking()]
    ev = sensitivity.Evaluator(model, ranges, activations, evals, runner)
    measured: dict[int, tuple[float, float | None]] = {}  # float layers -> (error, agreement)

    def keeping(k: int) -> tuple[str, ...]:
        """keep_float with the k most sensitive layers float (and the user's): the very
        list the report gives to pin."""
        return tuple(order[:k]) + tuple(base.keep_float)

    def measure(k: int) -> bool:
        if k not in measured:
            measured[k] = ev.error(ev.variant(keeping(k))[0])
        return config.meets(*measured[k])

    low, high = -1, 0  # measure(low) fails (or low = -1), measure(high) meets
    while not measure(high):
        if high >= len(order):
            break
        low, high = high, min(len(order), max(1, 2 * high))
    while high - low > 1:
        mid = (low + high) // 2
        if measure(mid):
            high = mid
        else:
            low = mid
    chosen = order[:high]
    count, float_ops = full_integer.quantize_graph(
        graph, ranges[graph.name], activations=activations, io=base.io, keep_float=keeping(high)
    )
    report = QuantReport(str(config), count, float_ops)
    error, agreement = measured[high]
    report.auto = {
        "keep_float": list(chosen),
        "float_layers": len(chosen),
        "layers": len(order),
        "error": error,
        "agreement": agreement,
        "fully_quantized_error": measured[0][0],
        "fully_quantized_agreement": measured[0][1],
        "met": config.meets(error, agreement),
        "measured": dict(sorted(measured.items())),
        "sensitivity": analysis,
    }
    if not report.auto["met"]:
        import warnings

        warnings.warn(f"{config}: not met even with every layer float (error {error:.4g})", stacklevel=4)
    return report
