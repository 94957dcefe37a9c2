"""hoist_transpose_above_pad: PAD -> TRANSPOSE becomes TRANSPOSE -> PAD with permuted
paddings (same values in LiteRT); a PAD read elsewhere too, or a MIRROR_PAD, stays."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from converter.passes import hoist_transpose_above_pad
from tests.converter.passes.passes_helpers import NCHW_TO_NHWC, check_pass
from tests.helpers import assert_converts


def pad(b, x, paddings, opcode="PAD", value=None):
    shape = tuple(d + p0 + p1 for d, (p0, p1) in zip(x.shape, paddings))
    inputs = [x, b.const(np.asarray(paddings, np.int32))] + ([b.const(np.float32(value))] if value is not None else [])
    return b.op(opcode, inputs, shape=shape)


def test_pad_moves_below_the_transpose():
    def build(b):
        x = b.input((1, 3, 6, 8))
        y = b.transpose(pad(b, x, [[0, 0], [0, 0], [0, 1], [2, 1]]), NCHW_TO_NHWC)
        z = b.transpose(pad(b, x, [[0, 0], [1, 0], [1, 1], [0, 0]], "PADV2", -3.0), NCHW_TO_NHWC)
        return b.output(y, z)

    g = check_pass(build, hoist_transpose_above_pad)
    assert [op.opcode for op in g.ops] == ["TRANSPOSE", "PAD", "TRANSPOSE", "PADV2"]


def test_shared_or_mirror_pads_stay():
    def build(b):
        x = b.input((1, 3, 6, 8))
        shared = pad(b, x, [[0, 0], [0, 0], [1, 1], [1, 1]])
        mirrored = pad(b, x, [[0, 0], [0, 0], [1, 1], [1, 1]], "MIRROR_PAD")
        return b.output(b.transpose(shared, NCHW_TO_NHWC), shared, b.transpose(mirrored, NCHW_TO_NHWC))

    g = check_pass(build, hoist_transpose_above_pad)
    assert [op.opcode for op in g.ops] == ["PAD", "MIRROR_PAD", "TRANSPOSE", "TRANSPOSE"]


def test_stem_conv_pads_in_nhwc():
    """MobileNet's stem: a stride-2 3x3 conv with padding=1 on an even input (not SAME)."""
    stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
    edge = assert_converts(stem, (torch.randn(1, 3, 16, 16),))
    assert [op.opcode for op in edge.ir_model.graphs[0].ops][:3] == ["TRANSPOSE", "PAD", "CONV_2D"]
