"""`benchmarks/quant_bench.py`'s options added for measuring on a loaded machine:
`--cpu-time` (per-invoke CPU time of the invoking thread) and `--methods percentile=P`."""

from __future__ import annotations

import itertools
import time

import torch

import litert_torch
from benchmarks import quant_bench
from benchmarks.litert_measure import LoadedModel


def _model(width: int) -> LoadedModel:
    layer = torch.nn.Linear(width, width).eval()
    return LoadedModel(litert_torch.convert(layer, (torch.randn(1, width),), progress=False).model_content())


def test_latencies_time_each_invoke_with_the_given_clock():
    ticks = itertools.count()
    small, large = _model(8), _model(512)
    sample = (torch.randn(1, 8),)
    [seconds] = quant_bench._latencies([small], sample, runs=10, clock=lambda: next(ticks))
    assert seconds == 1  # one tick between the start and the end of each timed invoke
    # with the thread's CPU time, a 4096x larger matmul measures larger, however loaded the machine
    small_s, large_s = (
        quant_bench._latencies([m], (torch.randn(1, w),), runs=20, clock=time.thread_time)[0]
        for m, w in ((small, 8), (large, 512))
    )
    assert 0 < small_s < large_s


def test_methods_entry_sets_the_percentile():
    assert quant_bench._calibration("mse") == {"calibration": "mse"}
    assert quant_bench._calibration("percentile=99.0") == {"calibration": "percentile", "percentile": 99.0}
