"""Runtime checks (`torch._check*`, transformers' `torch_compilable_check`) in an exported
graph: dropped when the sample satisfies them, refused naming the check otherwise
(converter/lowering/runtime_checks.py)."""

from __future__ import annotations

import pytest
import torch

import litert_torch
from converter.errors import ConversionError, UnsupportedOpsError
from converter.lowering.runtime_checks import RuntimeCheckWarning
from tests.helpers import assert_converts


class CheckedScale(torch.nn.Module):
    """Checks its own buffer (a constant) and, optionally, its input's values."""

    def __init__(self, scale: float, check_input: bool):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), scale))
        self.check_input = check_input

    def forward(self, x):
        torch._check_tensor_all(self.scale > 0)
        if self.check_input:
            torch._check_tensor_all(x.abs() < 100)
        return x * self.scale


def test_a_check_on_constants_that_holds_is_dropped_silently(recwarn):
    assert_converts(CheckedScale(2.0, check_input=False), (torch.randn(3, 4),))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeCheckWarning)]


def test_a_check_on_constants_that_fails_is_refused_naming_it():
    with pytest.raises(ConversionError, match=r"(?s)fails 1 runtime check.*gt\(scale, 0\) at .*test_runtime_checks.py"):
        litert_torch.convert(CheckedScale(-1.0, check_input=False), (torch.randn(3, 4),))


def test_a_check_on_input_values_is_dropped_with_a_warning_naming_it():
    with pytest.warns(RuntimeCheckWarning, match=r"lt\(abs\(x\), 100\)"):
        assert_converts(CheckedScale(2.0, check_input=True), (torch.randn(3, 4),))


def test_a_sample_breaking_an_input_check_is_refused():
    with pytest.raises(ConversionError, match=r"lt\(abs\(x\), 100\)"):
        litert_torch.convert(CheckedScale(2.0, check_input=True), (torch.full((3, 4), 1000.0),))


class DataDependentLength(torch.nn.Module):
    def forward(self, x, n):
        return x[: n.item()]


def test_a_scalar_that_feeds_the_computation_is_not_a_check():
    with pytest.raises(UnsupportedOpsError, match="_local_scalar_dense"):
        litert_torch.convert(DataDependentLength(), (torch.randn(8, 4), torch.tensor(3)))


def test_siglip2_naflex_image_embedder_converts_and_matches():
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    torch.manual_seed(0)
    config = Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=4, num_patches=16
    )
    model = Siglip2VisionModel(config).eval()
    patches = 16  # NaFlex: a 3 x 4 patch image padded to 16 patches, then an 2 x 8 one
    mask = torch.tensor([[1] * 12 + [0] * 4])
    other = (torch.randn(1, patches, 48), torch.ones(1, patches, dtype=torch.long), torch.tensor([[2, 8]]))
    with pytest.warns(RuntimeCheckWarning, match=r"spatial_shapes"):
        assert_converts(
            model,
            (torch.randn(1, patches, 48), mask, torch.tensor([[3, 4]])),
            rtol=1e-5,
            atol=1e-5,
            check_inputs=[other],
        )
