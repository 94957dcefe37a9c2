"""drop_zero_terms: a branch scaled by zero (Swin-V2's zero-initialised res-post-norm) is
dropped, the model still matches PyTorch, and nothing else is dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from converter.passes import folding_summary
from tests.helpers import assert_converts


def opcodes(edge):
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


class PostNormResidual(nn.Module):
    """x + LayerNorm(attention-like branch(x)), then x + LayerNorm(MLP(x)), as in Swin-V2,
    with the norms' weight and bias set to `scale` (timm initialises them to 0)."""

    def __init__(self, dim=16, scale=0.0):
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.norm2 = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)
        for norm in (self.norm1, self.norm2):
            nn.init.constant_(norm.weight, scale)
            nn.init.constant_(norm.bias, scale)

    def forward(self, x):
        x = x + self.norm1(torch.softmax(self.attn(x), dim=-1))
        x = x + self.norm2(self.mlp(x))
        return self.head(x)


def test_zero_scaled_branches_are_dropped():
    edge = assert_converts(PostNormResidual(scale=0.0), (torch.randn(2, 5, 16),))
    assert opcodes(edge) == ["FULLY_CONNECTED"]  # only the head is left
    # and the user is told: two branches, and every op of theirs among what folding removed
    assert edge.ir_model.graphs[0].folded["zero branches"] == 2
    summary = folding_summary(edge.ir_model)
    removed = int(summary.split()[3])
    assert "among them 2 residual branches whose output is always zero" in summary
    assert removed >= 10, summary  # softmax, layer norms, the MLP's GELU and matmuls


def test_adding_a_constant_zero_is_no_branch():
    class PlusZero(nn.Module):
        def forward(self, x):
            return torch.relu(x + torch.zeros(8))

    edge = assert_converts(PlusZero(), (torch.randn(2, 8),))
    assert "zero branches" not in edge.ir_model.graphs[0].folded
    assert "residual" not in (folding_summary(edge.ir_model) or "")


def test_nonzero_scale_keeps_the_branches():
    module = PostNormResidual(scale=0.0)
    with torch.no_grad():
        module.norm2.weight[3] = 0.5  # one nonzero element: the MLP branch is live
    edge = assert_converts(module, (torch.randn(2, 5, 16),))
    assert opcodes(edge).count("FULLY_CONNECTED") == 3  # MLP's two and the head
    assert "SOFTMAX" not in opcodes(edge)  # the attention-like branch is still zero


class BroadcastingZero(nn.Module):
    """x (1, 8) + zeros (4, 8): the sum is (4, 8), so x alone is not the result."""

    def __init__(self):
        super().__init__()
        self.register_buffer("zero", torch.zeros(4, 8))

    def forward(self, x, y):
        return x + y * self.zero, x - self.zero


def test_a_zero_that_broadcasts_keeps_the_op():
    edge = assert_converts(BroadcastingZero(), (torch.randn(1, 8), torch.randn(4, 8)))
    shapes = [tuple(t.shape) for t in edge.ir_model.graphs[0].outputs]
    assert shapes == [(4, 8), (4, 8)]


def test_non_finite_branch_gives_the_residual():
    """The documented NaN/inf rule: `branch * 0` is 0 even where the branch is inf or NaN
    (PyTorch: NaN). Finite inputs match exactly (the tests above)."""
    module = PostNormResidual(scale=0.0).eval()
    x = torch.randn(1, 3, 16)
    edge = assert_converts(module, (x,))
    x[0, 1, 4] = float("inf")
    with torch.no_grad():
        residual_only = module.head(x)
        torch_out = module(x)
    assert torch.isnan(torch_out[0, 1]).all()  # PyTorch: LayerNorm of inf is NaN, and NaN * 0 is NaN
    out = np.asarray(edge(x))
    assert np.isinf(out[0, 1]).all()  # here: the inf of the residual, through the head
    np.testing.assert_allclose(out, residual_only.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_timm_swinv2_matches_and_keeps_only_the_trunk():
    import litert_torch
    from benchmarks.anchors.zoo_loader import load_zoo
    from benchmarks.converter.litert_measure import LoadedModel, max_relative_error, op_histogram

    model, args = load_zoo().build("timm_swinv2", seed=0)
    content = litert_torch.convert(model, args, progress=False).model_content()
    with torch.no_grad():
        expected = model(*args).numpy()
    assert max_relative_error(LoadedModel(content).run([a.numpy() for a in args]), [expected]) <= 1e-4
    histogram = op_histogram(content)
    # The branches' attention (BATCH_MATMUL, SOFTMAX) and MLPs are gone; the anchor's file has 46 ops.
    assert "SOFTMAX" not in histogram and "BATCH_MATMUL" not in histogram
    assert sum(histogram.values()) <= 46
