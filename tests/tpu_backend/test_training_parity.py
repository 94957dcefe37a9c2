"""Training on the "tpu" device follows PyTorch CPU step by step.

An MLP, a small CNN and a small transformer (`benchmarks/models.py`) are built once on
CPU from a fixed seed; one deep copy moves to the device. Both train 20 steps on the same
batches with SGD (momentum) and with AdamW; the losses must agree to 1e-4 relative at
EVERY step (a wrong gradient or optimizer update shows up within a step or two, long
before it would show in a final loss), and so must every gradient after step 1 and every
parameter after step 20 (norm-relative, `tests/tpu_backend/parity.py`): SGD passes a
gradient's scale straight into the parameters, which Adam would divide out.

`mode` is how the device executes: "strict" and "debug" eager; "compile" wraps the device
model in `torch.compile(backend="tpu")` (`tpu_backend.compile`; skipped if it fails to import).
`PARITY_DEVICE=cpu` runs the test CPU against CPU (a check of the test itself).
"""

from __future__ import annotations

import copy
import importlib
import os

import pytest
import torch

from benchmarks.models import MODEL_CASES, make_optimizer, train_step, training_batches
from tests.tpu_backend.parity import TrainingRun, assert_runs_match, record_training

DEVICE = os.environ.get("PARITY_DEVICE", "tpu")
STEPS = 20
DISTINCT_BATCHES = 4
# CPU against CPU checks "compile" cases with AOTAutograd's eager backend.
COMPILE_BACKEND = "aot_eager" if DEVICE == "cpu" else "tpu"

if DEVICE != "cpu":
    import tpu_backend


@pytest.fixture
def execution_mode(request):
    """Set the device's eager mode for one test and restore the previous one after it."""
    mode = request.param
    if DEVICE == "cpu":
        yield mode
        return
    if mode == "compile":
        import torch._dynamo

        importlib.import_module("tpu_backend.compile")  # registers the "tpu" Dynamo backend
        torch._dynamo.reset()  # graphs compiled for another test's model must not be reused
        yield mode
        return
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode(mode)
    yield mode
    tpu_backend.set_eager_mode(previous)


def train(model, case, optimizer_name: str, batches, device: str) -> TrainingRun:
    optimizer = make_optimizer(optimizer_name, model.parameters())
    device_batches = [(inputs.to(device), target.to(device)) for inputs, target in batches]
    return record_training(model, lambda x, y: train_step(model, optimizer, case, x, y), device_batches)


CASES = [
    pytest.param(model, optimizer, mode, id=f"{model}-{optimizer}-{mode}")
    for model in ("mlp", "cnn", "transformer")
    for optimizer in ("sgd", "adamw")
    for mode in ("strict",)
] + [
    # debug mode checks every op's result; one small model is enough to show it trains alike
    pytest.param("mlp", "adamw", "debug", id="mlp-adamw-debug"),
    pytest.param("mlp", "adamw", "compile", id="mlp-adamw-compile"),
    pytest.param("transformer", "adamw", "compile", id="transformer-adamw-compile", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("model_name, optimizer_name, execution_mode", CASES, indirect=["execution_mode"])
def test_losses_match_cpu_every_step(model_name, optimizer_name, execution_mode):
    case = MODEL_CASES[model_name]
    torch.manual_seed(0)
    cpu_model = case.build()
    device_model = copy.deepcopy(cpu_model).to(DEVICE)
    batches = training_batches(case, STEPS, DISTINCT_BATCHES)

    cpu_run = train(cpu_model, case, optimizer_name, batches, "cpu")
    run_model = torch.compile(device_model, backend=COMPILE_BACKEND) if execution_mode == "compile" else device_model
    device_run = train(run_model, case, optimizer_name, batches, DEVICE)

    same_batch_later = STEPS - DISTINCT_BATCHES
    assert cpu_run.losses[same_batch_later] < cpu_run.losses[0], f"the reference run did not train: {cpu_run.losses}"
    assert all(p.device.type == torch.device(DEVICE).type for p in device_model.parameters())
    assert_runs_match(device_run, cpu_run, f"{DEVICE} ({execution_mode})")
