"""grid_sample (bilinear and nearest; zeros, border and reflection padding; align_corners
both ways) and affine_grid: LiteRT vs PyTorch, float32 max rel err 1e-4."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(2, 3, 7, 9)
# Sampling points inside and outside [-1, 1] (padding matters), avoiding exact ties.
GRID = torch.rand(2, 5, 6, 2) * 2.6 - 1.3

CASES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True]))
# The default suite runs one case per mode, padding and align_corners value; -m slow all 12.
FAST = {
    ("bilinear", "zeros", False),
    ("nearest", "border", True),
    ("bilinear", "reflection", True),
    ("nearest", "reflection", False),
}
PARAMS = [pytest.param(*c, id="-".join(map(str, c)), marks=() if c in FAST else pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("mode,padding,align", PARAMS)
def test_grid_sample_matches_pytorch(mode, padding, align):
    fn = Fn(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align))
    edge = assert_converts(fn, (X, GRID), rtol=1e-4, atol=0.0)
    assert "GATHER" in {op.opcode for op in edge.ir_model.graphs[0].ops}


def test_spatial_transformer_with_affine_grid_from_the_input():
    """A spatial transformer: a small head predicts the affine matrix, affine_grid builds
    the grid, grid_sample warps the image."""
    head = torch.nn.Linear(3 * 7 * 9, 6)
    torch.nn.init.normal_(head.weight, std=0.01)

    def warp(x):
        theta = head(x.flatten(1)).view(-1, 2, 3) + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)

    assert_converts(Fn(warp), (X,), rtol=1e-4, atol=0.0)


def test_flow_warp_with_a_constant_base_grid():
    """Optical-flow style backward warp: base grid from meshgrid (folded) plus the flow."""

    def warp(image, flow):
        n, _, h, w = image.shape
        ys, xs = torch.meshgrid(
            torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
        )
        gx = (xs + flow[:, 0]) / (w - 1) * 2 - 1
        gy = (ys + flow[:, 1]) / (h - 1) * 2 - 1
        return F.grid_sample(image, torch.stack([gx, gy], dim=-1), align_corners=True, padding_mode="border")

    assert_converts(Fn(warp), (X, torch.randn(2, 2, 7, 9) * 2), rtol=1e-4, atol=0.0)
