"""A user's training loop on the device: parity with CPU, no leaks, tied weights."""

import pytest
import torch
import torch.nn.functional as F

import tpu_backend
from tests.tpu_backend.parity import TrainingRun, assert_runs_match, gradients, record_training


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
}


def _train(device: str, optimizer_name: str, steps: int = 20) -> TrainingRun:
    torch.manual_seed(0)
    model = _mlp().to(device)
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    data = torch.Generator().manual_seed(1)
    # four batches in turn: random labels can only be learnt by memorising them
    pool = [(torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)) for _ in range(4)]
    batches = [pool[i % len(pool)] for i in range(steps)]

    def step(x, y):
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    # zero_grad after the step: read the gradients of step 1 before it, in a hook
    first = {}

    def keep_first_gradients(optimizer, args, kwargs):
        if not first:
            first.update(gradients(model))

    handle = optimizer.register_step_pre_hook(keep_first_gradients)
    run = record_training(model, step, batches)
    handle.remove()
    run.first_gradients = first
    return run


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_mlp_losses_gradients_and_parameters_match_cpu(optimizer_name):
    on_cpu, on_tpu = _train("cpu", optimizer_name), _train("tpu", optimizer_name)
    assert_runs_match(on_tpu, on_cpu, optimizer_name)
    assert sum(on_tpu.losses[-4:]) < sum(on_tpu.losses[:4]), on_tpu.losses  # it actually trains


def test_payload_table_stays_flat_over_1000_steps():
    model = torch.nn.Linear(8, 2).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 2).to("tpu")

    def step():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    for _ in range(5):  # optimizer state and caches exist from here on
        step()
    storages, memory = tpu_backend.payload_count(), torch.tpu.memory_allocated()
    for _ in range(1000):
        step()
    assert tpu_backend.payload_count() == storages
    assert torch.tpu.memory_allocated() == memory


def test_tied_weights_stay_tied_after_to_tpu():
    class TiedLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = TiedLM().to("tpu")
    assert len(list(model.parameters())) == 1
    assert model.head.weight is model.embed.weight and model.head.weight.device.type == "tpu"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logits = model.head(model.embed(torch.tensor([1, 2]).to("tpu")))
    logits.sum().backward()
    optimizer.step()
    assert torch.equal(model.head.weight.cpu(), model.embed.weight.cpu())


def test_an_optimizer_built_before_to_tpu_trains_the_moved_model():
    """As on CUDA: `model.to("tpu")` keeps each Parameter object, so the optimizer sees the
    device weights (they were new Parameters: the optimizer stepped the CPU originals, silently)."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)
    reference.load_state_dict(model.state_dict())
    originals = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model.to("tpu")
    assert all(p is q for p, q in zip(model.parameters(), originals)) and originals[0].device.type == "tpu"
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    for _ in range(3):
        for net, opt, device in ((model, optimizer, "tpu"), (reference, reference_optimizer, "cpu")):
            opt.zero_grad()
            F.mse_loss(net(x.to(device)), y.to(device)).backward()
            opt.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    model.cpu()  # and back: still the same objects, with their gradients
    assert all(p is q for p, q in zip(model.parameters(), originals)) and originals[0].grad.device.type == "cpu"


def test_module_round_trip_to_cpu_keeps_values():
    model = _mlp()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("tpu").to("cpu")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0)
