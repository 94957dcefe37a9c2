"""Calibration: the range of every float activation over the calibration samples.

The float model is written and run in the LiteRT interpreter itself (builtin kernels,
no XNNPACK, every intermediate tensor kept), so the ranges are those of the very graph
being quantized, after every pass, with no second implementation of any op. The writer
numbers a graph's tensors in `Graph.tensors()` order, so interpreter tensor i of
subgraph g is `model.graphs[g].tensors()[i]`. The caller passes the interpreter in
(`runner`: model bytes -> an object with `run(inputs, signature)` and
`get_tensor(index, subgraph)`), so the converter does not depend on `runtimes/`.

Estimators (`calibration=`), each streaming: per tensor a fixed-size state, whatever the
number of samples:
- "minmax": the minimum and maximum over all samples. Every calibration value stays
  representable; one outlier widens the whole range.
- "moving_average": an exponential moving average of each sample's min and max
  (weight `averaging_constant` for a new sample); damps outlier samples in large sets.
- "percentile": clips the (100 - `percentile`)% lowest and highest values (99.99: one
  value in 10,000 at each end), from a histogram.
- "mse": the range that minimises the expected squared quantization error (rounding
  noise inside the range, clipping error outside), searched over shrunk ranges on the
  same histogram.
The model's outputs are the exception: no later op absorbs a clipped output, and the
maximum of a few calibration samples is an extreme-value statistic that unseen inputs
exceed (ConvNeXt-nano's logits: 16 samples give max 1.39, 500 unseen ones reach 1.98).
Whatever the method, an output's range is the calibration min/max widened to the mean
per-sample extreme +- OUTPUT_MARGIN_SD standard deviations of the per-sample extremes
(`output_range`); the step grows little (x1.0-1.4 on the zoo's classifiers) and clipping
of unseen inputs becomes rare (see docs/design/converter.md, Quantization).
Histograms have HISTOGRAM_BINS bins; when a sample exceeds the range the bins are merged
into wider ones (exactly: old bin edges stay edges), so one pass suffices.
"""

from __future__ import annotations

import math

import numpy as np

from converter import ir
from converter.quantize.config import CALIBRATIONS, QuantConfig

Ranges = dict[int, tuple[float, float]]  # tensor id -> (min, max)
HISTOGRAM_BINS = 2048
MSE_CANDIDATES = 128  # shrink factors tried per tensor by "mse"
OUTPUT_MARGIN_SD = 4.0  # graph outputs: per-sample extremes' mean +- this many sd
OUTPUT_RANGES = f"min/max widened to mean +- {OUTPUT_MARGIN_SD:g} sd of the per-sample extremes"


class Histogram:
    """Counts of values in HISTOGRAM_BINS equal bins from `lo`; grows by merging bins."""

    def __init__(self, bins: int = HISTOGRAM_BINS):
        self.bins = bins
        self.counts: np.ndarray | None = None
        self.lo = 0.0
        self.width = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.zeros = 0  # values exactly 0 (ReLU's floor, padding): exact at any range

    @property
    def hi(self) -> float:
        return self.lo + self.bins * self.width

    def add(self, values: np.ndarray) -> None:
        values = values.reshape(-1)
        vmin, vmax = float(values.min()), float(values.max())
        self.min, self.max = min(self.min, vmin), max(self.max, vmax)
        self.zeros += int(np.count_nonzero(values == 0))
        lo, hi = min(vmin, 0.0), max(vmax, 0.0)  # every range contains zero
        if self.counts is None:
            self.lo, self.width = lo, max(hi - lo, 1e-12) / self.bins
            self.counts = np.zeros(self.bins, np.float64)
        elif lo < self.lo or hi > self.hi:
            self._grow(lo, hi)
        index = np.clip(((values - self.lo) / self.width).astype(np.int64), 0, self.bins - 1)
        self.counts += np.bincount(index, minlength=self.bins)

    def _grow(self, lo: float, hi: float) -> None:
        below = max(0, math.ceil((self.lo - lo) / self.width))  # bins added below the origin
        new_lo = self.lo - below * self.width
        factor = max(1, math.ceil((max(hi, self.hi) - new_lo) / (self.bins * self.width)))
        target = (np.arange(self.bins) + below) // factor
        self.counts = np.bincount(target, weights=self.counts, minlength=self.bins)[: self.bins]
        self.lo, self.width = new_lo, self.width * factor

    def centers(self) -> np.ndarray:
        return self.lo + (np.arange(self.bins) + 0.5) * self.width

    def percentile_range(self, percentile: float) -> tuple[float, float]:
        """Clip the (100 - percentile)% most extreme values on each side of zero."""
        total = self.counts.sum()
        tail = total * (100.0 - percentile) / 100.0
        cdf = np.cumsum(self.counts)
        lo_bin = int(np.searchsorted(cdf, tail, side="right"))
        hi_bin = int(np.searchsorted(cdf, total - tail, side="left"))
        lo = max(self.min, self.lo + lo_bin * self.width)
        hi = min(self.max, self.lo + (hi_bin + 1) * self.width)
        return min(lo, 0.0), max(hi, 0.0)

    def mse_range(self, levels: int, symmetric: bool) -> tuple[float, float]:
        """The range minimising the expected squared error of quantizing the histogram's
        values to `levels` steps: each end shrunk towards zero by its own factor in
        (0, 1], found by alternating one-dimensional searches (one end, then the other).
        Exact zeros are left out: zero is a level of every candidate range, so they cost
        no rounding noise (counting them overweighted rounding against clipping: on ReLU
        outputs with 80-95% zeros the range came out so narrow that its error exceeded
        min/max's, up to 3x)."""
        lo, hi = min(self.min, 0.0), max(self.max, 0.0)
        counts = self.counts.copy()
        counts[min(int(-self.lo / self.width), self.bins - 1)] -= self.zeros  # the bin holding 0
        keep = counts > 0
        x, n = self.centers()[keep], counts[keep]
        factors = np.linspace(1.0 / MSE_CANDIDATES, 1.0, MSE_CANDIDATES)
        if symmetric:
            m = max(-lo, hi)
            best = int(np.argmin(_expected_error(x, n, -m * factors, m * factors, levels)))
            return -m * float(factors[best]), m * float(factors[best])
        a, b = lo, hi
        for _ in range(3):
            b = float(hi * factors[np.argmin(_expected_error(x, n, np.full_like(factors, a), hi * factors, levels))])
            a = float(lo * factors[np.argmin(_expected_error(x, n, lo * factors, np.full_like(factors, b), levels))])
        return a, b


def _expected_error(x: np.ndarray, n: np.ndarray, lows: np.ndarray, highs: np.ndarray, levels: int) -> np.ndarray:
    """Per candidate range [lows[k], highs[k]]: the summed squared error of quantizing
    values `x` (with counts `n`): rounding noise step^2/12 inside, clipping outside."""
    a, b = lows[:, None], highs[:, None]
    step = np.maximum(b - a, 1e-30) / (levels - 1)
    clipped = np.clip(x[None, :], a, b)
    error = np.where(clipped == x[None, :], step**2 / 12.0, (x[None, :] - clipped) ** 2)
    return (error * n[None, :]).sum(axis=1)


class _Estimator:
    """One tensor's streaming statistic for one calibration method."""

    def __init__(self, method: str, averaging_constant: float):
        self.method, self.c = method, averaging_constant
        self.lo, self.hi = math.inf, -math.inf
        self.hist = Histogram() if method in ("percentile", "mse") else None
        self.seen = 0
        self.abs_lo, self.abs_hi = math.inf, -math.inf
        self.extremes = np.zeros((3, 2))  # rows: count, sum, sum of squares; columns: min, max

    def add(self, value: np.ndarray) -> None:
        if not value.size or not np.all(np.isfinite(value)):
            if value.size:
                self.lo, self.hi = -math.inf, math.inf  # +-inf or nan: the tensor stays float
            return
        vmin, vmax = float(value.min()), float(value.max())
        self.abs_lo, self.abs_hi = min(self.abs_lo, vmin), max(self.abs_hi, vmax)
        ext = np.array([vmin, vmax])
        self.extremes += [np.ones(2), ext, ext**2]
        if self.method == "moving_average" and self.seen:
            self.lo += self.c * (vmin - self.lo)
            self.hi += self.c * (vmax - self.hi)
        elif self.method == "moving_average":
            self.lo, self.hi = vmin, vmax
        else:
            self.lo, self.hi = min(self.lo, vmin), max(self.hi, vmax)
        if self.hist is not None and math.isfinite(self.lo) and math.isfinite(self.hi):
            self.hist.add(value)
        self.seen += 1

    def range(self, percentile: float, levels: int, symmetric: bool) -> tuple[float, float] | None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return None
        if self.method == "percentile":
            return self.hist.percentile_range(percentile)
        if self.method == "mse":
            return self.hist.mse_range(levels, symmetric)
        return self.lo, self.hi

    def output_range(self) -> tuple[float, float] | None:
        """A graph output's range: see the module doc (no downstream op absorbs a clip)."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return None
        n, total, squares = self.extremes
        mean = total / n
        sd = np.sqrt(np.maximum(squares / n - mean**2, 0.0) * n / np.maximum(n - 1, 1))
        margin = OUTPUT_MARGIN_SD * sd
        return min(self.abs_lo, float(mean[0] - margin[0])), max(self.abs_hi, float(mean[1] + margin[1]))


def collect_ranges(
    model: ir.Model,
    samples,
    runner,
    *,
    method: str = "minmax",
    percentile: float = 99.99,
    averaging_constant: float = 0.1,
    activations: str = "int8",
    progress=None,
) -> dict[str, Ranges]:
    """Per graph name: tensor id -> (min, max) of every float32 non-constant tensor.

    samples: {graph name: iterable of input tuples (numpy)}; consumed once, in one pass.
    runner: model bytes -> interpreter (see the module doc).
    progress: a converter.progress.Progress (optional) that shows the samples done.
    """
    from converter.writer import write_flatbuffer

    if method not in CALIBRATIONS:
        raise ValueError(f"calibration={method!r}: choose one of {', '.join(CALIBRATIONS)}")
    runtime = runner(write_flatbuffer(model))
    levels = 65535 if activations == "int16" else 256
    result: dict[str, Ranges] = {}
    for graph_index, graph in enumerate(model.graphs):
        watched = [(i, t) for i, t in enumerate(graph.tensors()) if not t.is_const and t.dtype == np.float32]
        stats = {t.id: _Estimator(method, averaging_constant) for _, t in watched}
        stream = samples[graph.name]
        if progress is not None:
            stream = progress.track(stream, f"calibrating {graph.name} ({method})")
        for sample in stream:
            runtime.run(sample, graph.name)
            for index, t in watched:
                stats[t.id].add(runtime.get_tensor(index, graph_index))
        result[graph.name] = {}
        outputs = {t.id for t in graph.outputs}
        for tid, stat in stats.items():
            if tid in outputs:
                r = stat.output_range()
            else:
                r = stat.range(percentile, levels, symmetric=activations == "int16")
            if r is not None:  # +-inf or never computed: stays float (and is reported)
                result[graph.name][tid] = r
    return result


def calibrated_ranges(model: ir.Model, config: QuantConfig, runner, progress=None) -> dict:
    """Per graph name: tensor id -> (min, max), by `config`'s calibration method."""
    if config.samples is None:
        raise ValueError(
            "the config holds no calibration samples; it must come from validate_config "
            "(litert_torch.convert(..., quant_config=, calibration_data=) does this)"
        )
    if runner is None:
        raise ValueError(
            "calibrated schemes need runner= (an interpreter factory, litert_torch.quantize.calibration_runner)"
        )
    return collect_ranges(
        model,
        config.samples,
        runner,
        method=config.calibration,
        percentile=config.percentile,
        averaging_constant=config.averaging_constant,
        activations="int16" if config.scheme == "int16x8" else "int8",
        progress=progress,
    )
