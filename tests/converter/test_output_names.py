"""What a user sees on the converted signature: outputs named by forward()'s dict keys,
and a warning when a bfloat16 model is stored and computed in float32."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from litert_torch import convert


class DictOutputs(torch.nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "features": [x + 1, x - 1]}


def test_dict_outputs_are_named_by_their_keys():
    x = torch.randn(2, 3)
    edge = convert(DictOutputs(), (x,))
    assert "logits: float32[2, 3], features_0: float32[2, 3], features_1: float32[2, 3]" in str(edge)
    logits, plus, minus = edge(x)
    np.testing.assert_allclose(logits, (x * 2).numpy(), rtol=1e-6)
    np.testing.assert_allclose(minus, (x - 1).numpy(), rtol=1e-6)


def test_tuple_outputs_keep_positional_names():
    edge = convert(torch.nn.Sequential(torch.nn.Linear(3, 2)), (torch.randn(1, 3),))
    assert "-> (output_0: float32[1, 2])" in str(edge)


def test_bfloat16_model_warns_that_the_file_computes_in_float32():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).eval()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 8)
    with pytest.warns(UserWarning, match="bfloat16 .* float32"):
        edge = convert(model.to(torch.bfloat16), (x.to(torch.bfloat16),))
    # The float32 file computes with the bf16-rounded weights, in float32.
    reference.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in reference.state_dict().items()})
    expected = reference(x.to(torch.bfloat16).float()).detach().numpy()
    np.testing.assert_allclose(edge(x.to(torch.bfloat16).float().numpy()), expected, rtol=1e-5, atol=1e-6)
