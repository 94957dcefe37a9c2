"""The shared sampling arithmetic agrees with PyTorch's own interpolation and pooling."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.resampling import adaptive_average_matrix, linear_weights, nearest_indices


@pytest.mark.parametrize("size, out, scale", [(5, 7, None), (7, 3, None), (4, 10, 2.5), (6, 4, 0.7)])
def test_nearest_indices_pick_pytorchs_rows(size, out, scale):
    x = torch.arange(float(size)).reshape(1, 1, size)
    for mode, exact in (("nearest", False), ("nearest-exact", True)):
        kwargs = {"scale_factor": scale} if scale else {"size": out}
        expected = F.interpolate(x, mode=mode, **kwargs)[0, 0].numpy()
        got = nearest_indices(size, expected.shape[0], scale, exact=exact).astype(np.float32)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size, out, scale", [(5, 9, None), (8, 3, None), (4, 10, 2.5)])
def test_linear_weights_reproduce_linear_interpolation(size, out, scale, align_corners):
    x = torch.randn(1, 1, size)
    kwargs = {"scale_factor": scale} if scale else {"size": out}
    expected = F.interpolate(x, mode="linear", align_corners=align_corners, **kwargs)[0, 0].numpy()
    weights = linear_weights(size, expected.shape[0], align_corners, None if align_corners else scale)
    np.testing.assert_allclose(weights @ x[0, 0].numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size, out", [(7, 3), (10, 4), (5, 5), (3, 6)])
def test_adaptive_average_matrix_is_adaptive_avg_pool(size, out):
    x = torch.randn(1, 1, size)
    expected = F.adaptive_avg_pool1d(x, out)[0, 0].numpy()
    np.testing.assert_allclose(adaptive_average_matrix(size, out) @ x[0, 0].numpy(), expected, rtol=1e-5, atol=1e-6)
