"""Shape and data-movement ops: reshape, permute, squeeze, cat/stack, split, slicing,
expand, repeat, flip, roll, pixel (un)shuffle and dtype casts."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 4, 5)

SHAPE_OPS = {
    "reshape": lambda x: x.reshape(6, -1),
    "view_flat": lambda x: x.view(-1),
    "flatten": lambda x: x.flatten(1),
    "permute": lambda x: x.permute(0, 2, 3, 1),
    "transpose": lambda x: x.transpose(1, 3),
    "t": lambda x: x[0, 0].t(),
    "mT": lambda x: x.mT,
    "unsqueeze": lambda x: x.unsqueeze(2),
    "squeeze": lambda x: x[:, :1].squeeze(1),
    "squeeze_all": lambda x: x[:1, :1].squeeze(),
    "cat": lambda x: torch.cat([x, x * 2], dim=1),
    "cat_negative_dim": lambda x: torch.cat([x, x[..., :2]], dim=-1),
    "stack": lambda x: torch.stack([x, -x], dim=2),
    "split": lambda x: x.split(2, dim=3),
    "split_sizes": lambda x: x.split([1, 3, 1], dim=-1),
    "chunk": lambda x: x.chunk(2, dim=2),
    "unbind": lambda x: x.unbind(1),
    "slice": lambda x: x[:, 1:3],
    "slice_step": lambda x: x[:, ::2, 1:4:2],
    "slice_negative": lambda x: x[..., -3:-1],
    "narrow": lambda x: x.narrow(3, 1, 3),
    "select": lambda x: x[:, 1],
    "select_negative": lambda x: x[..., -1],
    "expand": lambda x: x[:, :1].expand(2, 3, 4, 5),
    "expand_new_axes": lambda x: x[0, 0, 0].expand(3, 2, 5),
    "repeat": lambda x: x.repeat(1, 2, 1, 3),
    "repeat_new_axis": lambda x: x.repeat(2, 1, 1, 1, 1),
    "flip": lambda x: x.flip(1),
    "flip_two_axes": lambda x: x.flip(1, 3),
    "roll": lambda x: x.roll(2, 3),
    "roll_two_axes": lambda x: x.roll((1, -1), (1, 2)),
    "roll_flat": lambda x: x.roll(4),
    "to_int": lambda x: (x * 3).to(torch.int32),
    "to_long_back": lambda x: (x * 3).long().float(),
    "type_as": lambda x: (x > 0).type_as(x),
    "contiguous_clone_detach": lambda x: x.transpose(1, 2).contiguous().clone().detach(),
}


@pytest.mark.parametrize("name", list(SHAPE_OPS))
def test_shape_op(name):
    assert_converts(Fn(SHAPE_OPS[name]), (X,))


@pytest.mark.parametrize("factor, channels", [(2, 1), (2, 3), (3, 2)])
def test_pixel_shuffle(factor, channels):
    assert_converts(nn.PixelShuffle(factor), (torch.randn(1, channels * factor * factor, 3, 4),))


@pytest.mark.parametrize("factor, channels", [(2, 1), (2, 3), (3, 2)])
def test_pixel_unshuffle(factor, channels):
    assert_converts(nn.PixelUnshuffle(factor), (torch.randn(1, channels, 6, 6 * factor),))


def test_pixel_shuffle_single_channel_is_plain_depth_to_space():
    edge = assert_converts(nn.PixelShuffle(2), (torch.randn(1, 4, 3, 3),))
    assert "GATHER" not in [op.opcode for op in edge.ir_model.graphs[0].ops]
