"""The decomposition table: what it keeps whole reaches the lowerings whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import converter.lowering  # noqa: F401  (registers every lowering)
from converter.lowering.decompositions import KEEP, decomposition_table
from converter.lowering.registry import find_lowering
from converter.pipeline import decompose, export_module
from tests.converter.lowering.conftest import Fn

aten = torch.ops.aten


def test_every_kept_op_has_a_lowering():
    missing = [str(op) for op in KEEP if find_lowering(op) is None]
    assert not missing, f"ops kept whole but never lowered: {missing}"


def test_table_is_a_fresh_copy_without_the_kept_ops():
    table = decomposition_table()
    assert not any(op in table for op in KEEP)
    table.clear()
    assert len(decomposition_table()) > 100


X = torch.randn(1, 4, 8, 8)


@pytest.mark.parametrize("module, args, kept", [
    (nn.Linear(8, 3), (torch.randn(2, 5, 8),), aten.linear.default),
    (Fn(torch.matmul), (torch.randn(2, 3, 4), torch.randn(4, 5)), aten.matmul.default),
    (Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), (X,), aten.upsample_bilinear2d.vec),
    (Fn(lambda x: F.interpolate(x, scale_factor=2)), (X,), aten.upsample_nearest2d.vec),
    (nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular"), (X,), aten._pad_circular.default),
    (nn.PixelUnshuffle(2), (X,), aten.pixel_unshuffle.default),
    (nn.Hardswish(), (X,), aten.hardswish.default),
    (nn.GELU(approximate="tanh"), (X,), aten.gelu.default),
])
def test_kept_op_reaches_the_converter_whole(module, args, kept):
    program = decompose(export_module(module, args))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert kept in targets, targets
