"""bf16 autocast on the device: matmul family in bf16, precision-sensitive ops in float32."""

import torch

import tpu_backend  # noqa: F401


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
        assert torch.softmax(x, dim=-1).dtype == torch.float32


def test_autocast_off_outside_context():
    x = torch.randn(2, 2).to("tpu")
    assert (x @ x).dtype == torch.float32


def test_backward_through_autocast_gives_float32_grads():
    linear = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(16, 8).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.layer_norm(linear(x), (4,)).float().pow(2).mean()
    loss.backward()
    assert linear.weight.grad.dtype == torch.float32
    assert torch.isfinite(linear.weight.grad.cpu()).all()
