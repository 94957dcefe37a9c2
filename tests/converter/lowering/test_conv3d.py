"""3-D convolution, pooling and upsampling (video models): CONV_3D / CONV_3D_TRANSPOSE and
separable 3-D pools on NDHWC; LiteRT vs PyTorch (float32, max rel err 1e-4)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(1, 3, 5, 9, 8)


def opcodes(edge) -> list[str]:
    return [op.opcode for op in edge.ir_model.graphs[0].ops]


LAYERS = {
    "conv": (nn.Conv3d(3, 4, 3), "CONV_3D"),
    "conv_padded_strided": (nn.Conv3d(3, 4, (3, 3, 1), stride=(1, 2, 2), padding=(1, 1, 0)), "CONV_3D"),
    "conv_dilated_no_bias": (nn.Conv3d(3, 2, 2, dilation=(1, 2, 2), bias=False), "CONV_3D"),
    "conv_transpose": (nn.ConvTranspose3d(3, 4, 2, stride=2), "CONV_3D_TRANSPOSE"),
    "conv_transpose_padded": (
        nn.ConvTranspose3d(3, 2, 3, stride=(1, 2, 2), padding=1, output_padding=(0, 1, 1)),
        "CONV_3D_TRANSPOSE",
    ),
    "max_pool": (nn.MaxPool3d(2), "MAX_POOL_2D"),
    "max_pool_padded_ceil": (nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True), "MAX_POOL_2D"),
    "max_pool_temporal": (nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)), "MAX_POOL_2D"),
    "avg_pool": (nn.AvgPool3d(2), "AVERAGE_POOL_2D"),
    "avg_pool_padded_exclude": (nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False), "AVERAGE_POOL_2D"),
    "avg_pool_padded_include_ceil": (nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True), "AVERAGE_POOL_2D"),
    "adaptive_avg_1": (nn.AdaptiveAvgPool3d(1), "MEAN"),
    "upsample_nearest": (nn.Upsample(scale_factor=2, mode="nearest"), "GATHER"),
    "upsample_trilinear": (nn.Upsample(scale_factor=(1, 2, 2), mode="trilinear"), None),
    "upsample_trilinear_align": (nn.Upsample(size=(6, 10, 12), mode="trilinear", align_corners=True), None),
}


# The default suite runs these; -m slow every layer above.
FAST = {"conv", "conv_transpose_padded", "max_pool_padded_ceil", "avg_pool_padded_exclude", "upsample_trilinear"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in LAYERS])
def test_3d_layer_matches_pytorch(name):
    layer, opcode = LAYERS[name]
    edge = assert_converts(layer, (X,), rtol=1e-4, atol=0.0)
    if opcode is not None:
        assert opcode in opcodes(edge)


class TinyVideoNet(nn.Module):
    """conv3d-bn-relu, pool, a residual 3-D block, transposed conv: the layout pass must
    leave NDHWC inside and transposes only at the boundary."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU())
        self.pool = nn.MaxPool3d((1, 2, 2))
        self.block = nn.Sequential(nn.Conv3d(8, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU(), nn.Conv3d(8, 8, 1))
        self.up = nn.ConvTranspose3d(8, 4, (1, 2, 2), stride=(1, 2, 2))

    def forward(self, x):
        y = self.pool(self.stem(x))
        return self.up(F.relu(y + self.block(y)))


def test_video_block_runs_in_ndhwc_between_boundary_transposes():
    model = TinyVideoNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    edge = assert_converts(model, (torch.randn(1, 3, 4, 8, 8),), rtol=1e-4, atol=0.0)
    ops = opcodes(edge)
    assert ops.count("CONV_3D") == 3 and "CONV_3D_TRANSPOSE" in ops
    assert ops.count("TRANSPOSE") <= 2, ops
    # Batch norm folded into the CONV_3D weights, the stem's ReLU fused into it.
    assert "MUL" not in ops, ops
    stem = next(op for op in edge.ir_model.graphs[0].ops if op.opcode == "CONV_3D")
    assert stem.options["fusedActivationFunction"] == "RELU"


def test_grouped_conv3d_is_refused_with_a_clear_error():
    from converter.errors import UnsupportedOpsError
    from litert_torch import convert

    with pytest.raises(UnsupportedOpsError, match="grouped 3-D convolution"):
        convert(nn.Conv3d(4, 4, 3, groups=2), (torch.randn(1, 4, 4, 6, 6),))
