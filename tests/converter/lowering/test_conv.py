"""Convolutions (1-D, 2-D, depthwise, grouped, dilated, padded, transposed) and padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(1, 4, 9, 10)


def opcodes(edge) -> list[str]:
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


CONV2D = {
    "plain": nn.Conv2d(4, 6, 3),
    "no_bias": nn.Conv2d(4, 6, 3, bias=False),
    "padding_same_size": nn.Conv2d(4, 6, 3, padding=1),
    "stride2_pad1": nn.Conv2d(4, 6, 3, stride=2, padding=1),
    "stride2_pad1_even": nn.Conv2d(4, 6, 4, stride=2, padding=1),
    "asymmetric_kernel": nn.Conv2d(4, 6, (3, 5), padding=(1, 2)),
    "big_padding": nn.Conv2d(4, 6, 3, padding=3),
    "mixed_padding": nn.Conv2d(4, 6, 3, padding=(1, 0)),
    "dilation": nn.Conv2d(4, 6, 3, dilation=2, padding=2),
    "string_same": nn.Conv2d(4, 6, 4, padding="same"),
    "string_valid": nn.Conv2d(4, 6, 3, padding="valid"),
    "depthwise": nn.Conv2d(4, 4, 3, padding=1, groups=4),
    "depthwise_multiplier": nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4),
    "depthwise_dilated": nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4),
    "grouped": nn.Conv2d(4, 6, 3, padding=1, groups=2),
    "pointwise": nn.Conv2d(4, 6, 1),
    "reflect": nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect"),
    "replicate": nn.Conv2d(4, 6, 3, padding=2, padding_mode="replicate"),
    "circular": nn.Conv2d(4, 6, 3, padding=1, padding_mode="circular"),
}


@pytest.mark.parametrize("name", list(CONV2D))
def test_conv2d(name):
    assert_converts(CONV2D[name], (X,))


def test_conv2d_same_padding_needs_no_pad_op():
    edge = assert_converts(nn.Conv2d(4, 6, 3, padding=1), (X,))
    assert "PAD" not in opcodes(edge)
    assert opcodes(edge).count("CONV_2D") == 1


def test_depthwise_uses_the_depthwise_builtin():
    edge = assert_converts(nn.Conv2d(4, 8, 3, groups=4), (X,))
    assert "DEPTHWISE_CONV_2D" in opcodes(edge)


def test_conv2d_weight_as_input():
    """A non-constant weight still converts (TRANSPOSE in the graph instead of in numpy)."""
    assert_converts(Fn(lambda x, w: F.conv2d(x, w, padding=1)), (X, torch.randn(6, 4, 3, 3)))


CONV1D = {
    "plain": nn.Conv1d(4, 6, 3),
    "padded_strided": nn.Conv1d(4, 6, 5, stride=2, padding=2),
    "dilated": nn.Conv1d(4, 6, 3, dilation=3),
    "depthwise": nn.Conv1d(4, 4, 3, groups=4, padding=1),
    "transposed": nn.ConvTranspose1d(4, 6, 4, stride=2, padding=1),
}


@pytest.mark.parametrize("name", list(CONV1D))
def test_conv1d(name):
    assert_converts(CONV1D[name], (torch.randn(2, 4, 17),))


TRANSPOSED = {
    "plain": nn.ConvTranspose2d(4, 6, 3),
    "stride2": nn.ConvTranspose2d(4, 6, 3, stride=2),
    "stride2_pad1": nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1),
    "output_padding": nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
    "kernel4_stride2": nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1),
    "no_bias": nn.ConvTranspose2d(4, 6, 2, stride=2, bias=False),
    "asymmetric": nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0)),
    "dilated": nn.ConvTranspose2d(4, 6, 3, dilation=2),
    "grouped": nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2),
}


@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_conv_transpose2d(name):
    assert_converts(TRANSPOSED[name], (X,))


PADS = {
    "constant_zero": lambda x: F.pad(x, (1, 2, 3, 0)),
    "constant_value": lambda x: F.pad(x, (1, 2, 3, 4), value=1.5),
    "constant_negative_crops": lambda x: F.pad(x, (-1, 2, 0, -2)),
    "constant_last_axis_only": lambda x: F.pad(x, (2, 2)),
    "reflect": lambda x: F.pad(x, (1, 2, 3, 2), mode="reflect"),
    "replicate": lambda x: F.pad(x, (1, 2, 3, 0), mode="replicate"),
    "circular": lambda x: F.pad(x, (1, 2, 3, 1), mode="circular"),
    "reflect_1d": lambda x: F.pad(x[0], (2, 1), mode="reflect"),
    "replicate_1d": lambda x: F.pad(x[0], (2, 3), mode="replicate"),
}


@pytest.mark.parametrize("name", list(PADS))
def test_pad(name):
    assert_converts(Fn(PADS[name]), (X,))


def test_grouped_conv_is_one_conv2d():
    edge = assert_converts(nn.Conv2d(8, 12, 3, padding=1, groups=4), (torch.randn(1, 8, 6, 6),))
    assert opcodes(edge).count("CONV_2D") == 1 and "SPLIT" not in opcodes(edge)
