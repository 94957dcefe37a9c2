"""bf16 autocast on the device: matmul family in bf16, precision-sensitive ops in float32."""

import copy

import pytest
import torch

import tpu_backend  # noqa: F401
from tests.tpu_backend.parity import norm_relative_error


def test_linear_and_matmul_run_in_bfloat16():
    x = torch.randn(4, 8).to("tpu")
    linear = torch.nn.Linear(8, 3).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = linear(x)
        z = x @ x.t()
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = linear.cpu()(x.cpu())
    torch.testing.assert_close(y.float().cpu(), expected.float(), rtol=2e-2, atol=2e-2)


def test_default_autocast_dtype_is_bfloat16():
    x = torch.randn(2, 2).to("tpu")
    with torch.autocast("tpu"):
        assert (x @ x).dtype == torch.bfloat16


def test_softmax_runs_in_float32_under_autocast():
    x = torch.randn(4, 8).to("tpu").to(torch.bfloat16)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = torch.softmax(x, dim=-1)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), torch.softmax(x.cpu().float(), dim=-1), rtol=1e-5, atol=1e-6)


def test_autocast_off_outside_context():
    x = torch.randn(2, 2).to("tpu")
    assert (x @ x).dtype == torch.float32


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bfloat16, kept in float32 (what an autocast cast does to values)."""
    return t.bfloat16().float()


def test_backward_through_autocast_gives_float32_grads_with_bf16_values():
    """linear autocasts to bf16, layer_norm runs in float32: the dtypes of each op, the
    loss and the gradients against the same casts written out on CPU."""
    torch.manual_seed(0)
    linear, x, weights = torch.nn.Linear(8, 4), torch.randn(16, 8), torch.randn(4)
    device_linear = copy.deepcopy(linear).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        hidden = device_linear(x.to("tpu"))
        normed = torch.nn.functional.layer_norm(hidden, (4,))
        probabilities = torch.softmax(hidden, dim=-1)
    loss = (normed * weights.to("tpu")).sum()
    loss.backward()
    assert (hidden.dtype, normed.dtype, probabilities.dtype, loss.dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.float32,
    )
    assert device_linear.weight.grad.dtype == torch.float32 and device_linear.bias.grad.dtype == torch.float32

    want_hidden = _bf16(torch.nn.functional.linear(_bf16(x), _bf16(linear.weight), _bf16(linear.bias)))
    want_loss = (torch.nn.functional.layer_norm(want_hidden, (4,)) * weights).sum()
    want_loss.backward()
    torch.testing.assert_close(hidden.cpu().float(), want_hidden, rtol=1e-2, atol=1e-2)
    # softmax in float32 of the bf16 values it was given (bf16 matmuls may round differently)
    torch.testing.assert_close(probabilities.cpu(), torch.softmax(hidden.cpu().float(), -1), rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-2)
    for name in ("weight", "bias"):
        error = norm_relative_error(getattr(device_linear, name).grad, getattr(linear, name).grad)
        assert error <= 2e-2, f"{name} gradient: relative error {error:.3g} (bf16 rounding allows 2e-2)"
