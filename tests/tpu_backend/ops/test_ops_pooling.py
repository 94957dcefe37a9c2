"""Pooling and upsampling lowerings (forward and backward) agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-5, rtol=1e-4)

MAX_POOLS = [
    # kernel, stride, padding, dilation, ceil_mode
    ([2, 2], [2, 2], [0, 0], [1, 1], False),
    ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([3, 2], [2, 1], [1, 0], [2, 1], True),
    ([3, 3], [], [1, 1], [1, 1], True),
]


@pytest.mark.parametrize("params", MAX_POOLS, ids=str)
def test_max_pool2d_with_indices_and_backward(params):
    x = torch.randn(2, 3, 9, 8)
    out, indices = check(aten.max_pool2d_with_indices.default, x, *params, **TOL)
    check(
        aten.max_pool2d_with_indices_backward.default,
        torch.randn(out.shape),
        x,
        *[p or params[0] for p in params[:4]],
        params[4],
        indices,
        **TOL,
    )


def test_max_pool3d_and_unbatched_2d():
    x = torch.randn(2, 2, 5, 6, 7)
    out, indices = check(aten.max_pool3d_with_indices.default, x, [2, 3, 2], [2, 2, 1], [1, 1, 0], [1, 1, 1], True)
    check(
        aten.max_pool3d_with_indices_backward.default,
        torch.randn(out.shape),
        x,
        [2, 3, 2],
        [2, 2, 1],
        [1, 1, 0],
        [1, 1, 1],
        True,
        indices,
    )
    check(aten.max_pool2d_with_indices.default, torch.randn(3, 6, 6), [2, 2], [2, 2])
    check(aten.max_pool2d_with_indices.default, torch.randint(-9, 9, (1, 2, 6, 6)), [3, 3], [1, 1], [1, 1])


AVG_POOLS = [
    # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ([2, 2], [2, 2], [0, 0], False, True, None),
    ([3, 3], [2, 2], [1, 1], False, True, None),
    ([3, 3], [2, 2], [1, 1], True, False, None),
    ([3, 2], [2, 2], [1, 1], True, True, None),
    ([2, 2], [1, 1], [1, 0], False, True, 3),
]


@pytest.mark.parametrize("params", AVG_POOLS, ids=str)
def test_avg_pool2d_and_backward(params):
    x = torch.randn(2, 3, 9, 8)
    out = check(aten.avg_pool2d.default, x, *params, **TOL)
    check(aten.avg_pool2d_backward.default, torch.randn(out.shape), x, *params, **TOL)


def test_avg_pool3d_and_backward():
    x = torch.randn(1, 2, 5, 6, 7)
    params = ([2, 3, 2], [2, 2, 1], [1, 1, 0], True, False, None)
    out = check(aten.avg_pool3d.default, x, *params, **TOL)
    check(aten.avg_pool3d_backward.default, torch.randn(out.shape), x, *params, **TOL)


@pytest.mark.parametrize("output_size", [[1, 1], [3, 4], [5, 7], [9, 8]])
def test_adaptive_pools(output_size):
    x = torch.randn(2, 3, 9, 8)
    out = check(aten._adaptive_avg_pool2d.default, x, output_size, **TOL)
    check(aten._adaptive_avg_pool2d_backward.default, torch.randn(out.shape), x, **TOL)
    out, indices = check(aten.adaptive_max_pool2d.default, x, output_size, **TOL)
    check(aten.adaptive_max_pool2d_backward.default, torch.randn(out.shape), x, indices, **TOL)


def test_adaptive_avg_pool3d():
    x = torch.randn(1, 2, 5, 6, 7)
    out = check(aten._adaptive_avg_pool3d.default, x, [2, 3, 4], **TOL)
    check(aten._adaptive_avg_pool3d_backward.default, torch.randn(out.shape), x, **TOL)


@pytest.mark.parametrize("align_corners", [True, False])
def test_linear_upsampling(align_corners):
    x = torch.randn(2, 3, 5, 4)
    out = check(aten.upsample_bilinear2d.default, x, [10, 7], align_corners, **TOL)
    check(aten.upsample_bilinear2d.default, x, [10, 8], align_corners, 2.0, 2.0, **TOL)
    check(aten.upsample_bilinear2d.default, x, [3, 3], align_corners, **TOL)
    check(
        aten.upsample_bilinear2d_backward.default, torch.randn(out.shape), [10, 7], [2, 3, 5, 4], align_corners, **TOL
    )
    check(aten.upsample_linear1d.default, torch.randn(2, 3, 5), [11], align_corners, **TOL)
    check(aten.upsample_trilinear3d.default, torch.randn(1, 2, 3, 4, 5), [5, 6, 7], align_corners, **TOL)


def test_nearest_upsampling():
    x = torch.randn(2, 3, 5, 4)
    out = check(aten.upsample_nearest2d.default, x, [10, 7])
    check(aten.upsample_nearest2d.default, x, [3, 3])
    check(aten.upsample_nearest2d.default, x, [10, 8], 2.0, 2.0)
    check(aten._upsample_nearest_exact2d.default, x, [7, 9])
    check(aten.upsample_nearest2d_backward.default, torch.randn(out.shape), [10, 7], [2, 3, 5, 4])
    check(aten.upsample_nearest1d.default, torch.randn(2, 3, 5), [12])
    check(aten.upsample_nearest3d.default, torch.randn(1, 2, 3, 4, 5), [6, 4, 9])


@pytest.mark.parametrize("align_corners", [True, False])
def test_bicubic_upsampling(align_corners):
    x = torch.randn(1, 2, 5, 4)
    check(aten.upsample_bicubic2d.default, x, [9, 7], align_corners, **TOL)
    check(aten.upsample_bicubic2d.default, x, [3, 2], align_corners, **TOL)


GRID_SAMPLES = [
    # (mode, padding_mode, align_corners): the default run covers each mode and padding once
    (0, 0, False),
    (0, 2, True),
    (1, 1, False),
    (2, 0, False),
    (2, 2, True),
    *[pytest.param(m, p, a, marks=pytest.mark.slow) for m in (0, 1, 2) for p in (0, 1, 2) for a in (True, False)],
]


@pytest.mark.parametrize("mode,padding_mode,align_corners", GRID_SAMPLES)
def test_grid_sampler_2d(mode, padding_mode, align_corners):
    x = torch.randn(2, 3, 5, 6)
    grid = torch.rand(2, 4, 7, 2) * 2.6 - 1.3  # includes points outside the image
    out = check(aten.grid_sampler_2d.default, x, grid, mode, padding_mode, align_corners, **TOL)
    if mode == 2:  # bicubic: its own tap folding, checked for a TPU too
        assert_lowers_for_tpu(aten.grid_sampler_2d.default, x, grid, mode, padding_mode, align_corners)
    if mode in (0, 2):
        g = torch.randn(out.shape)
        check(
            aten.grid_sampler_2d_backward.default,
            g,
            x,
            grid,
            mode,
            padding_mode,
            align_corners,
            [True, True],
            atol=1e-4,
            rtol=1e-4,
        )


def test_upsampling_backward_family():
    cases = [
        (aten.upsample_nearest1d_backward.default, [2, 3, 5], [11], ()),
        (aten._upsample_nearest_exact2d_backward.default, [1, 2, 3, 4], [7, 9], ()),
        (aten.upsample_nearest3d_backward.default, [1, 1, 2, 3, 4], [4, 5, 9], ()),
        (aten.upsample_linear1d_backward.default, [2, 3, 5], [11], (False,)),
        (aten.upsample_trilinear3d_backward.default, [1, 1, 2, 3, 4], [4, 5, 9], (True,)),
        (aten.upsample_bicubic2d_backward.default, [1, 2, 3, 4], [7, 9], (False,)),
    ]
    for op, input_size, output_size, extra in cases:
        grad = torch.randn(*input_size[:2], *output_size)
        check(op, grad, output_size, input_size, *extra, **TOL)


def test_nearest_exact_1d_3d():
    check(aten._upsample_nearest_exact1d.default, torch.randn(2, 3, 5), [8])
    check(aten._upsample_nearest_exact3d.default, torch.randn(1, 2, 3, 4, 5), [5, 7, 3])
