"""`torch.compile(model.to("tpu"), backend="tpu")`: training on the device matches PyTorch CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import tpu_backend  # noqa: F401  (registers the device)
import tpu_backend.compile as tpu_compile
from tests.tpu_backend.compile.shared import ChattyModel

RELATIVE_TOLERANCE = 1e-4
STEPS = 5


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test here starts from a fresh Dynamo (see conftest.py)."""


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def train(model: nn.Module, device: str, batches) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for x, target in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_compiled_mlp_on_the_device_trains_like_cpu():
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator))] * STEPS
    cpu_model = mlp()
    device_model = copy.deepcopy(cpu_model).to("tpu")

    cpu_losses = train(cpu_model, "cpu", batches)
    device_losses = train(torch.compile(device_model, backend="tpu"), "tpu", batches)

    assert cpu_losses[-1] < cpu_losses[0]
    for step, (got, want) in enumerate(zip(device_losses, cpu_losses)):
        assert abs(got - want) <= RELATIVE_TOLERANCE * abs(want), f"step {step}: {device_losses} vs {cpu_losses}"
    assert all(p.device.type == "tpu" for p in device_model.parameters())
    stats = tpu_compile.compile_stats()
    forward = [s for name, s in stats.programs.items() if name.endswith("_forward")]
    assert len(forward) == 1 and forward[0].hits == STEPS - 1  # compiled once, reused every step


def test_compiled_dropout_on_the_device_follows_torch_manual_seed():
    """Same seed, same mask; the dropped fraction is p within a binomial tolerance and the
    kept values are the linear layer's output scaled by 1 / (1 - p)."""
    p = 0.5
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(p)).to("tpu").train()
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(3)).to("tpu")

    torch.manual_seed(7)
    first, second = compiled(x).cpu(), compiled(x).cpu()
    torch.manual_seed(7)
    again = compiled(x).cpu()

    assert not torch.equal(first == 0, second == 0)
    assert torch.equal(first, again)

    with torch.no_grad():
        undropped = model[0](x).cpu()
    assert (undropped != 0).all()  # a zero below could then only be a dropped element
    for out in (first, second):
        kept = out != 0
        dropped, count = (~kept).sum().item(), out.numel()
        spread = 5 * (count * p * (1 - p)) ** 0.5  # 5 standard deviations of Binomial(count, p)
        assert abs(dropped - p * count) <= spread, (
            f"dropped {dropped} of {count}, expected {p * count:.0f} +- {spread:.0f}"
        )
        torch.testing.assert_close(out[kept], undropped[kept] / (1 - p), rtol=1e-5, atol=1e-6)


def test_graph_breaks_on_the_device_run_eagerly_and_match_cpu():
    torch.manual_seed(0)
    cpu_model = ChattyModel()
    device_model = copy.deepcopy(cpu_model).to("tpu")
    x = torch.randn(4, 6)
    want = cpu_model(x)
    got = torch.compile(device_model, backend="tpu")(x.to("tpu"))
    assert got.device.type == "tpu"
    assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-6)
