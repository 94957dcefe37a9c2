"""Minimal lowerings for converter-core tests, used ONLY where the real lowering
(converter/lowering/<family>.py) is not registered yet, and removed after each test.

Pipeline, writer and API tests need a few ops end to end; they must not depend on
which families have landed. `with basic_lowerings(): ...` registers what is missing.
"""

from __future__ import annotations

import contextlib

import torch

import converter.lowering  # noqa: F401  (registers the real lowerings first)
from converter.lowering.registry import LOWERINGS, find_lowering

aten = torch.ops.aten


def _add(ctx, a, b, alpha=1):
    if not hasattr(b, "shape"):
        b = ctx.const([b], dtype=ctx.out_dtype())
    return ctx.emit("ADD", [a, b])


def _mul(ctx, a, b):
    if not hasattr(b, "shape"):
        b = ctx.const([b], dtype=ctx.out_dtype())
    return ctx.emit("MUL", [a, b])


def _relu(ctx, a):
    return ctx.emit("RELU", [a])


def _linear(ctx, x, w, b=None):
    return ctx.emit("FULLY_CONNECTED", [x, w, b], {"keepNumDims": True})


def _clone(ctx, a, memory_format=None):
    return a


FALLBACKS = {
    aten.add.Tensor: _add,
    aten.mul.Tensor: _mul,
    aten.relu.default: _relu,
    aten.linear.default: _linear,
    aten.clone.default: _clone,
}


@contextlib.contextmanager
def basic_lowerings():
    added = [op for op in FALLBACKS if find_lowering(op) is None]
    for op in added:
        LOWERINGS[op] = FALLBACKS[op]
    try:
        yield
    finally:
        for op in added:
            LOWERINGS.pop(op, None)
