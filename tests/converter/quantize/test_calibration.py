"""Calibration methods (minmax, moving_average, percentile, mse): streamed histograms that
match numpy's statistics, ranges that cut outliers where they should, better accuracy
than min/max when one calibration sample is an outlier, and bad options refused first."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import litert_torch
from converter.quantize import QuantConfig
from converter.quantize.calibrate import Histogram
from litert_torch import quantize
from tests.converter.quantize.test_quantize import SmallCNN, _model, assert_fully_integer


def test_streamed_histogram_equals_numpy_on_the_whole_data():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(0, 1 + k, 5000) for k in range(6)] + [np.array([40.0, -25.0])]  # the range grows
    hist = Histogram()
    for c in chunks:
        hist.add(c)
    data = np.concatenate(chunks)
    assert hist.counts.sum() == data.size
    assert hist.lo <= data.min() and hist.hi >= data.max()
    expected, _ = np.histogram(data, bins=hist.bins, range=(hist.lo, hist.hi))
    assert np.abs(hist.counts - expected).sum() <= 2  # values on a bin edge may fall either side
    lo, hi = hist.percentile_range(99.9)
    assert abs(hi - np.percentile(data, 99.9)) <= 2 * hist.width
    assert abs(lo - np.percentile(data, 0.1)) <= 2 * hist.width


def _quantization_mse(data, lo, hi, levels=256):
    scale = (hi - lo) / (levels - 1)
    q = np.clip(np.round((data - lo) / scale), 0, levels - 1)
    return float(np.mean((q * scale + lo - data) ** 2))


def test_mse_range_is_the_best_clipping_of_a_heavy_tailed_tensor():
    rng = np.random.default_rng(1)
    data = np.concatenate([rng.laplace(0, 1, 50_000), rng.laplace(0, 8, 250)]) + 0.5  # asymmetric, heavy tails
    hist = Histogram()
    hist.add(data)
    lo, hi = hist.mse_range(256, symmetric=False)
    found = _quantization_mse(data, lo, hi)
    grid = [
        _quantization_mse(data, data.min() * f, data.max() * g)
        for f in np.linspace(0.05, 1, 40)
        for g in np.linspace(0.05, 1, 40)
    ]
    assert found <= 1.05 * min(grid)  # as good as a brute-force search over both ends
    assert found < 0.95 * _quantization_mse(data, data.min(), data.max())  # and better than min/max
    assert hi < data.max() and lo > data.min()


@pytest.mark.parametrize("zeros", [0.5, 0.9])
def test_mse_range_counts_no_rounding_error_for_exact_zeros(zeros):
    """ReLU outputs: most values exactly 0, which every range holds exactly. Counting them
    as rounding noise clipped the range so far that mse lost to min/max (3x at 95% zeros)."""
    rng = np.random.default_rng(2)
    data = np.where(rng.random(100_000) < zeros, 0.0, np.abs(rng.laplace(0, 1, 100_000)))
    hist = Histogram()
    hist.add(data)
    assert hist.zeros == np.count_nonzero(data == 0)
    lo, hi = hist.mse_range(256, symmetric=False)
    found = _quantization_mse(data, lo, hi)
    best = min(_quantization_mse(data, 0.0, data.max() * f) for f in np.linspace(0.05, 1, 200))
    assert found <= 1.02 * best
    assert found < _quantization_mse(data, 0.0, data.max())


class Features(nn.Module):
    """A conv feature extractor whose output carries the activations' precision."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))

    def forward(self, x):
        return self.body(x)


def _outlier_setup(spikes: bool):
    """16 calibration samples: with `spikes`, heavy-tailed (Student's t, 3 degrees of
    freedom: rare values far out); otherwise Gaussian with the last sample 40x larger (an
    outlier sample). Evaluation inputs are Gaussian."""
    model = _model(Features)
    gen = torch.Generator().manual_seed(3)
    calibration = [torch.randn(1, 3, 12, 12, generator=gen) for _ in range(16)]
    if spikes:
        t = torch.distributions.StudentT(3.0)
        torch.manual_seed(3)
        calibration = [t.sample((1, 3, 12, 12)) for _ in range(16)]
    else:
        calibration[-1] = 40 * calibration[-1]
    tests = [torch.randn(1, 3, 12, 12, generator=gen) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x).numpy() for x in tests]
    return model, [(x,) for x in calibration], tests, expected


def _error(model, calibration, tests, expected, config):
    edge = litert_torch.convert(model, (tests[0],), quant_config=config, calibration_data=calibration)
    assert_fully_integer(edge, np.int16 if config.scheme == "int16x8" else np.int8)
    return float(np.mean([np.sqrt(np.mean((edge(x) - e) ** 2)) / np.std(e) for x, e in zip(tests, expected)]))


def test_percentile_clips_rare_outlier_values_and_mse_is_no_worse():
    setup = _outlier_setup(spikes=True)
    errors = {
        "minmax": _error(*setup, quantize.full_int8()),
        "percentile": _error(*setup, quantize.full_int8(calibration="percentile", percentile=99.9)),
        "mse": _error(*setup, quantize.full_int8(calibration="mse")),
    }
    assert errors["percentile"] < 0.65 * errors["minmax"], errors
    # mse minimises the error on the calibration data itself, tails included: on 8 bits it
    # clips these mildly (its optimality is checked above); it must not be worse here
    assert errors["mse"] <= errors["minmax"], errors


def test_moving_average_damps_an_outlier_sample_and_int16x8_takes_methods():
    setup = _outlier_setup(spikes=False)
    minmax = _error(*setup, quantize.full_int8())
    assert _error(*setup, quantize.full_int8(calibration="moving_average")) < 0.5 * minmax
    assert _error(*setup, quantize.int16x8(calibration="moving_average")) < _error(*setup, quantize.int16x8())


def test_calibration_streams_a_generator_once_and_checks_each_sample():
    model = _model(SmallCNN)
    x = torch.randn(1, 3, 16, 16)
    drawn = []

    def samples(n, bad_at=None):
        for k in range(n):
            drawn.append(k)
            yield (torch.randn(1, 3, 8, 8) if k == bad_at else torch.randn(1, 3, 16, 16),)

    edge = litert_torch.convert(
        model, (x,), quant_config=quantize.full_int8(calibration="percentile"), calibration_data=samples(5)
    )
    assert drawn == [0, 1, 2, 3, 4] and edge.quant_report.float_ops == []
    with pytest.raises(ValueError, match=r"calibration sample 3, input 0 has shape \(1, 3, 8, 8\)"):
        litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=samples(5, bad_at=3))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: quantize.full_int8(calibration="kl"), "calibration='kl'"),
        (lambda: quantize.full_int8(calibration="percentile", percentile=100.5), "percentile=100.5"),
        (lambda: quantize.int16x8(calibration="moving_average", averaging_constant=0), "averaging_constant=0"),
    ],
)
def test_bad_calibration_options_fail_at_once_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_calibration_option_in_a_handmade_config_fails_before_conversion(monkeypatch):
    from tests.converter.quantize.test_quantize import _no_conversion

    _no_conversion(monkeypatch)
    with pytest.raises(ValueError, match="calibration='histogram'"):
        litert_torch.convert(
            nn.Linear(4, 2),
            (torch.randn(1, 4),),
            quant_config=QuantConfig("full_int8", calibration="histogram"),
            calibration_data=[(torch.randn(1, 4),)],
        )


class TinyClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("method", ["minmax", "mse"])
def test_model_outputs_do_not_clip_an_unseen_input_with_larger_logits(method):
    """16 calibration samples set the logits' range; the unseen input with the largest
    logit out of 256 more from the same distribution exceeds it. Nothing downstream absorbs
    a clipped output, so its range is widened by the spread of the per-sample extremes."""
    model = _model(TinyClassifier)
    gen = torch.Generator().manual_seed(2)  # unseen logits reach 1.39x the calibration max
    calibration = [torch.randn(1, 3, 8, 8, generator=gen) for _ in range(16)]
    with torch.no_grad():
        peak = max(float(model(x).abs().max()) for x in calibration)
        unseen = [torch.randn(1, 3, 8, 8, generator=gen) for _ in range(256)]
        test = max(unseen, key=lambda x: float(model(x).abs().max()))
        expected = model(test).numpy()
    assert np.abs(expected).max() > 1.2 * peak  # the test input's logits leave the calibrated range
    edge = litert_torch.convert(
        model,
        (test,),
        quant_config=quantize.full_int8(calibration=method),
        calibration_data=[(x,) for x in calibration],
    )
    assert_fully_integer(edge)
    # a clipped output would lose >= 20% of the largest logit; rounding costs ~1% of the range
    assert np.max(np.abs(edge(test) - expected)) < 0.03 * np.abs(expected).max()
    assert "per-sample extremes" in str(edge.quant_report) and edge.quant_report.to_dict()["output_ranges"]
