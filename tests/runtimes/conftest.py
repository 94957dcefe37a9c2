"""Shared fixtures for the runtime tests: zoo models converted once per session."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def converted(name: str, quant: str | None = None) -> bytes:
    """The zoo model `name` converted to .tflite bytes (float32, or quant="full_int8" with
    int8 inputs/outputs, calibrated on seeded random samples)."""
    import torch

    import litert_torch
    from benchmarks.zoo import build

    model, args = build(name)
    if quant is None:
        return litert_torch.convert(model, args, progress=False).model_content()
    from litert_torch import quantize

    generator = torch.Generator().manual_seed(5)
    calibration = [tuple(torch.randn(a.shape, generator=generator) for a in args) for _ in range(8)]
    edge = litert_torch.convert(
        model, args, quant_config=quantize.full_int8(io="int8"), calibration_data=calibration, progress=False
    )
    return edge.model_content()


@pytest.fixture
def zoo_tflite():
    return converted
