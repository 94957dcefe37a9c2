"""Max/average/adaptive pooling and interpolation: LiteRT vs PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(1, 3, 9, 10)


def opcodes(edge) -> list[str]:
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


POOLS = {
    "max_2": nn.MaxPool2d(2),
    "max_3_s2_p1": nn.MaxPool2d(3, 2, 1),
    "max_3_s1_p1": nn.MaxPool2d(3, 1, 1),
    "max_ceil": nn.MaxPool2d(3, 2, ceil_mode=True),
    "max_ceil_padded": nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    "max_rect": nn.MaxPool2d((2, 3), (1, 2)),
    "max_1d": Fn(lambda x: F.max_pool1d(x[0], 3, 2, 1)),
    "avg_2": nn.AvgPool2d(2),
    "avg_pad_include": nn.AvgPool2d(3, 2, 1),
    "avg_pad_exclude": nn.AvgPool2d(3, 2, 1, count_include_pad=False),
    "avg_pad_exclude_s1": nn.AvgPool2d(3, 1, 1, count_include_pad=False),
    "avg_ceil": nn.AvgPool2d(3, 2, ceil_mode=True),
    "avg_ceil_padded": nn.AvgPool2d(3, 2, 1, ceil_mode=True),
    "avg_ceil_padded_exclude": nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg_divisor_override": nn.AvgPool2d(2, divisor_override=3),
    "avg_1d": Fn(lambda x: F.avg_pool1d(x[0], 3, 2, 1)),
    "adaptive_avg_1x1": nn.AdaptiveAvgPool2d(1),
    "adaptive_avg_divisible": nn.AdaptiveAvgPool2d((3, 5)),
    "adaptive_avg_uneven": nn.AdaptiveAvgPool2d((4, 3)),
    "adaptive_avg_none": nn.AdaptiveAvgPool2d((None, 2)),
    "adaptive_max_1x1": nn.AdaptiveMaxPool2d(1),
    "adaptive_max_divisible": nn.AdaptiveMaxPool2d((3, 5)),
    "adaptive_max_uneven": nn.AdaptiveMaxPool2d((4, 3)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool(name):
    assert_converts(POOLS[name], (X,))


def test_adaptive_avg_to_1x1_is_one_mean():
    edge = assert_converts(nn.AdaptiveAvgPool2d(1), (X,))
    assert opcodes(edge) == ["MEAN"]


def test_maxpool_padding_is_same_when_the_windows_agree():
    # odd input: PyTorch's pad of 1 on each side reads exactly TFLite's SAME windows
    edge = assert_converts(nn.MaxPool2d(3, 2, 1), (torch.randn(1, 3, 15, 15),))
    assert "PADV2" not in opcodes(edge) and "MAX_POOL_2D" in opcodes(edge)
    # even input: SAME would pad only at the end, so an explicit -inf pad is needed
    edge = assert_converts(nn.MaxPool2d(3, 2, 1), (torch.randn(1, 3, 16, 16),))
    assert "PADV2" in opcodes(edge)


def test_ceil_mode_maxpool_is_same_when_the_windows_agree():
    """GoogLeNet's MaxPool2d(3, 2, ceil_mode=True): ceil_mode's extra last window is SAME's
    on an even input, so no PADV2 (which XNNPACK does not take)."""
    pool = nn.MaxPool2d(3, 2, ceil_mode=True)
    for x in (torch.randn(1, 3, 16, 16), torch.randn(1, 3, 16, 20)):
        assert opcodes(assert_converts(pool, (x,))) == ["TRANSPOSE", "MAX_POOL_2D", "TRANSPOSE"]
    # padded and ceil: SAME's windows along H (9: 5 windows from -1), not along W (10: 6 windows)
    edge = assert_converts(nn.MaxPool2d(3, 2, 1, ceil_mode=True), (torch.randn(1, 3, 9, 10),))
    assert "PADV2" in opcodes(edge)
    edge = assert_converts(nn.MaxPool2d(3, 2, 1, ceil_mode=True), (torch.randn(1, 3, 9, 9),))
    assert "PADV2" not in opcodes(edge)


INTERPOLATIONS = {
    "nearest_x2": lambda x: F.interpolate(x, scale_factor=2),
    "nearest_size": lambda x: F.interpolate(x, size=(5, 7)),
    "nearest_upsize_odd": lambda x: F.interpolate(x, size=(14, 23)),
    "nearest_fractional_scale": lambda x: F.interpolate(x, scale_factor=1.7),
    "nearest_exact": lambda x: F.interpolate(x, size=(13, 7), mode="nearest-exact"),
    "bilinear_x2": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear_size": lambda x: F.interpolate(x, size=(5, 13), mode="bilinear"),
    "bilinear_align_corners": lambda x: F.interpolate(x, size=(17, 6), mode="bilinear", align_corners=True),
    "bilinear_fractional_scale": lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear"),
    "upsample_module": nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
    "bicubic_x2": lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
    "bicubic_size_down": lambda x: F.interpolate(x, size=(4, 13), mode="bicubic"),
    "bicubic_align_corners": lambda x: F.interpolate(x, size=(17, 6), mode="bicubic", align_corners=True),
    "bicubic_fractional_scale": lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic"),
}


@pytest.mark.parametrize("name", list(INTERPOLATIONS))
def test_interpolate(name):
    fn = INTERPOLATIONS[name]
    assert_converts(fn if isinstance(fn, nn.Module) else Fn(fn), (X,))


def test_bicubic_is_two_matmuls():
    edge = assert_converts(Fn(lambda x: F.interpolate(x, size=(14, 23), mode="bicubic")), (X,))
    assert opcodes(edge) == ["BATCH_MATMUL", "BATCH_MATMUL"]


def test_bilinear_x2_is_one_resize():
    edge = assert_converts(Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), (X,))
    assert opcodes(edge).count("RESIZE_BILINEAR") == 1


class _PoolWithIndices(nn.Module):
    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def forward(self, x):
        values, indices = self.pool(x)
        return values, indices, values + indices.float() * 1e-3  # the indices also feed an op


@pytest.mark.parametrize(
    "pool, shape",
    [
        (nn.MaxPool2d(3, 2, 1, return_indices=True), (1, 3, 9, 10)),
        (nn.MaxPool2d(2, return_indices=True), (2, 4, 8, 8)),
        (nn.MaxPool2d(3, 2, ceil_mode=True, return_indices=True), (1, 2, 8, 9)),
        (nn.MaxPool3d(2, return_indices=True), (1, 2, 4, 6, 6)),
        (nn.MaxPool3d(3, 2, 1, ceil_mode=True, return_indices=True), (2, 3, 5, 7, 6)),
        (nn.MaxPool3d((1, 2, 2), return_indices=True), (1, 2, 3, 4, 4)),
        (nn.MaxPool1d(3, 2, 1, return_indices=True), (2, 3, 11)),
        (nn.MaxPool1d(2, ceil_mode=True, return_indices=True), (1, 4, 9)),
        (nn.AdaptiveMaxPool2d((3, 5), return_indices=True), (1, 3, 9, 10)),
        (nn.AdaptiveMaxPool2d((4, 3), return_indices=True), (2, 3, 9, 10)),
        (nn.AdaptiveMaxPool2d(1, return_indices=True), (1, 3, 5, 7)),
        (nn.AdaptiveMaxPool1d(4, return_indices=True), (2, 3, 11)),
    ],
    ids=[
        "2d_k3_s2_p1",
        "2d_k2",
        "2d_ceil",
        "3d_k2",
        "3d_k3_s2_p1_ceil",
        "3d_1x2x2",
        "1d_k3_s2_p1",
        "1d_ceil",
        "adaptive_2d_divisible",
        "adaptive_2d_uneven",
        "adaptive_2d_1x1",
        "adaptive_1d_uneven",
    ],  # fmt: skip
)
def test_max_pool_indices_equal_pytorchs(pool, shape):
    import litert_torch

    x = torch.randn(*shape)
    x[:, :, 1] = 0.5  # a plane of ties: PyTorch picks the first maximum in each window
    module = _PoolWithIndices(pool).eval()
    values, indices, mixed = litert_torch.convert(module, (x,))(x)
    ref_values, ref_indices, ref_mixed = module(x)
    assert indices.dtype == np.int64
    assert (indices == ref_indices.numpy()).all()
    assert (values == ref_values.numpy()).all()
    assert abs(mixed - ref_mixed.numpy()).max() <= 1e-5 * abs(ref_mixed.numpy()).max()


class _PoolUnpool(nn.Module):
    """SegNet's decoder step: max pooling's indices place the values back (zeros elsewhere)."""

    def __init__(self, kernel, stride, padding=0, output_size=None):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel, stride, padding, return_indices=True)
        self.unpool = nn.MaxUnpool2d(kernel, stride, padding)
        self.output_size = output_size

    def forward(self, x):
        values, indices = self.pool(x)
        return self.unpool(values * 2.0, indices, output_size=self.output_size)


@pytest.mark.parametrize(
    "kernel, stride, padding, shape, output_size",
    [(2, 2, 0, (2, 3, 8, 8), None), (3, 2, 1, (1, 4, 9, 9), None), (2, 2, 0, (1, 2, 9, 7), (9, 7))],
    ids=["k2", "k3_s2_p1", "odd_output_size"],
)
def test_max_unpool2d_places_the_values_as_pytorch(kernel, stride, padding, shape, output_size):
    assert_converts(_PoolUnpool(kernel, stride, padding, output_size), (torch.randn(*shape),))
