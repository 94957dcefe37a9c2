"""One program per training step: `torch.compile(step, backend="tpu")` of a step written with
`torch.func` gradients and PyTorch's functional foreach optimizer update
(`functional_train_step`, the form docs/design/device.md documents) runs forward, backward and
the SGD / AdamW update as ONE program, parameters and optimizer state updated in place, and
matches PyTorch CPU eager with `torch.optim` step by step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import tpu_backend  # noqa: F401  (registers the device)
import tpu_backend.compile as tpu_compile
from benchmarks.models import MODEL_CASES, functional_train_step, make_optimizer, train_step, training_batches
from tpu_backend import tensor as device_tensor
from tpu_backend.eager.runner import CACHE_STATS
from tpu_backend.jax_interop import to_jax

STEPS = 6
# float32, summed in another order: losses and moments to 1e-5 relative; AdamW parameters move
# by about lr = 1e-3 per step, so 1e-6 absolute is a thousandth of a step.
RTOL, ATOL = 1e-5, 1e-6
STATE = {"sgd": ("momentum_buffer",), "adamw": ("exp_avg", "exp_avg_sq")}


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test here starts from a fresh Dynamo (see conftest.py)."""


def programs_launched() -> int:
    """Device programs run so far: compiled programs, strict per-op calls, storage accesses."""
    return (
        tpu_compile.compile_stats().total().requests
        + CACHE_STATS.requests
        + sum(device_tensor.EAGER_STORAGE_CALLS.values())
    )


def setup(optimizer: str):
    case = MODEL_CASES["mlp"]
    torch.manual_seed(0)
    reference = case.build()
    model = copy.deepcopy(reference).to("tpu")
    step = torch.compile(functional_train_step(model, case, optimizer), backend="tpu")
    batches = [(x, t, x.to("tpu"), t.to("tpu")) for x, t in training_batches(case, STEPS)]
    return case, reference, model, step, batches


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_compiled_step_is_one_program_and_matches_cpu(optimizer):
    case, reference, model, step, batches = setup(optimizer)
    cpu_optimizer = make_optimizer(optimizer, reference.parameters())
    for index, (x, target, device_x, device_target) in enumerate(batches):
        launched, compiled = programs_launched(), tpu_compile.compile_stats().total().misses
        with torch._dynamo.config.patch(error_on_recompile=index > 0):  # no recompilation after warm-up
            loss = step(device_x, device_target)
        if index > 0:
            assert programs_launched() - launched == 1, "forward, backward and update: one program"
            assert tpu_compile.compile_stats().total().misses == compiled
        expected = train_step(reference, cpu_optimizer, case, x, target)
        torch.testing.assert_close(loss.cpu(), expected, rtol=RTOL, atol=ATOL)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.cpu(), q.detach(), rtol=RTOL, atol=ATOL, msg=f"step {index}: {name}")
        # SGD's momentum buffer is the running sum of the gradients: the gradients themselves.
        for key in STATE[optimizer]:
            for state, q in zip(step._torchdynamo_orig_callable.state[key], reference.parameters()):
                torch.testing.assert_close(state.cpu(), cpu_optimizer.state[q][key], rtol=RTOL, atol=ATOL)


def test_compiled_step_updates_parameters_in_place():
    """The parameters' old buffers are donated: XLA writes the new values into them (also
    after a failed compilation earlier in the process: test_backend.py's missing-lowering
    test, and test_one_program_step.py)."""
    _, _, model, step, batches = setup("adamw")
    for _, _, x, target in batches[:2]:
        step(x, target)  # warm-up: compiles
    weight = next(model.parameters())
    address = to_jax(weight).unsafe_buffer_pointer()
    step(*batches[2][2:])
    assert to_jax(weight).unsafe_buffer_pointer() == address


def test_an_array_held_elsewhere_is_not_donated():
    """A JAX array the user still holds keeps its values (that input is not donated)."""
    _, _, model, step, batches = setup("adamw")
    step(*batches[0][2:])
    weight = next(model.parameters())
    held = to_jax(weight)
    before = weight.cpu().clone()
    step(*batches[1][2:])
    assert not held.is_deleted()
    torch.testing.assert_close(torch.from_numpy(held.__array__().copy()), before)
    assert not torch.equal(weight.cpu(), before)


def test_compiled_optimizer_step_keeps_step_counts_on_the_device(monkeypatch):
    """`torch.compile(optimizer.step)` with a default AdamW: the step counts live on the
    device (capturable, as Dynamo makes them on CUDA), so a step copies nothing back to the
    host (a CPU count written back made every step wait for the device: 400 ms a step on a
    TPU v5e), and the update matches CPU eager."""
    from tpu_backend.compile import compiled_graph

    written_to_host = []
    store = compiled_graph._store
    monkeypatch.setattr(compiled_graph, "_store", lambda t, v: (written_to_host.append(t.device), store(t, v)))
    case = MODEL_CASES["mlp"]
    torch.manual_seed(0)
    reference = case.build()
    model = copy.deepcopy(reference).to("tpu")
    optimizer, cpu_optimizer = (
        make_optimizer("adamw", model.parameters()),
        make_optimizer("adamw", reference.parameters()),
    )
    compiled_step = torch.compile(optimizer.step, backend="tpu")
    for x, target in training_batches(case, 3):
        optimizer.zero_grad(set_to_none=True)
        case.loss(model(x.to("tpu")), target.to("tpu")).backward()
        compiled_step()
        train_step(reference, cpu_optimizer, case, x, target)
    assert {state["step"].device.type for state in optimizer.state.values()} == {"tpu"}
    assert not [d for d in written_to_host if d.type == "cpu"]
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=RTOL, atol=ATOL, msg=name)


def test_batch_norm_running_stats_under_dynamic_shapes():
    """Any inference graph that writes its inputs (here batch norm's running statistics,
    train mode under no_grad) stores them, also with symbolic sizes (run at exact shapes)."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6))
    model = copy.deepcopy(reference).to("tpu")
    compiled = torch.compile(model, backend="tpu", dynamic=True)
    with torch.no_grad():
        for rows in (5, 7, 3):
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), reference(x), rtol=RTOL, atol=1e-5)
    for name, buffer in reference[1].named_buffers():
        torch.testing.assert_close(model[1].get_buffer(name).cpu(), buffer, rtol=RTOL, atol=ATOL, msg=name)


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_one_program_step_with_kernels_on_takes_the_xla_path_and_trains():
    """Under `torch.func.grad` (the one-program step) the kernels' custom-op autograd cannot
    run (torch 2.13); the routers send those calls to XLA, so the step with kernels on
    computes what it computes with them off (it crashed on the chip before)."""
    from benchmarks.models import LlamaConfig, LlamaLM, ModelCase, _token_batch, sequence_loss

    config = LlamaConfig(context=128, width=64, heads=2, layers=1, ffn=128)
    case = ModelCase("llama", lambda: LlamaLM(config), _token_batch(config, 2), sequence_loss)
    losses = {}
    for mode in ("off", "interpret"):
        torch._dynamo.reset()  # a compiled step keeps the kernel choice it was traced with
        tpu_backend.kernels.reset_stats()
        with tpu_backend.kernels.use(mode):
            torch.manual_seed(0)
            model = case.build().to("tpu")
            inputs, target = (t.to("tpu") for t in case.batch(torch.Generator().manual_seed(0)))
            step = torch.compile(functional_train_step(model, case, "adamw"), backend="tpu")
            losses[mode] = [float(step(inputs, target)) for _ in range(3)]
            stats = tpu_backend.kernels.stats()
    torch._dynamo.reset()
    assert losses["interpret"] == pytest.approx(losses["off"], rel=1e-6)
    assert losses["off"][-1] < losses["off"][0]
    assert stats and all(tpu_backend.kernels.UNDER_TORCH_FUNC in key for key in stats), stats
