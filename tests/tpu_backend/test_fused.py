"""Fused eager mode: ops recorded lazily and run as one XLA program per sync point.

Checks what a user relies on: values through views and in-place writes equal CPU's,
seeded randomness repeats, every sync point runs the pending graph, and the three
training models give CPU's losses at every step, its gradients after step 1 and its
parameters after the last step, with no compile after the warm-up.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

import pytest
import torch

import tpu_backend
from benchmarks.models import MODEL_CASES, make_optimizer, train_step, training_batches
from tests.chip import child_env
from tests.tpu_backend.parity import TrainingRun, assert_runs_match, record_training
from tpu_backend import fused
from tpu_backend.compile import cache_only, compile_stats


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


@pytest.mark.skipif("TPU_EAGER_MODE" in os.environ, reason="the eager mode was chosen by the environment")
def test_fused_mode_is_opt_in():
    assert tpu_backend.get_eager_mode() == "strict"


# ----------------------------------------------------------------------------- views and in-place


def _slice_then_scale(x):
    y = x * 2 + 1
    y[:, 1].mul_(10)
    return y


def _write_through_transpose(x):
    y = x.clone()
    y.t()[0].copy_(torch.arange(3.0, device=x.device))
    return y


def _view_chain_and_alias(x):
    y = x.clone()
    flat = y.view(-1)
    flat[::2] += 100
    z = y.unsqueeze(0)
    z.add_(1)
    return y + flat.view(3, 4)


def _index_put_through_view(x):
    y = x.clone()
    index = torch.tensor([0, 2], device=x.device)
    y[:, 2:][index] = -1.0
    return y


def _diagonal_fill_and_expand(x):
    y = torch.zeros(4, 4, device=x.device)
    y.diagonal().fill_(3.0)
    row = x[0:1, :]  # (1, 4)
    return y + row.expand(4, 4)


VIEW_PROGRAMS = [
    _slice_then_scale,
    _write_through_transpose,
    _view_chain_and_alias,
    _index_put_through_view,
    _diagonal_fill_and_expand,
]


@pytest.mark.parametrize("program", VIEW_PROGRAMS)
def test_views_and_inplace_match_cpu(fused_mode, program):
    side = 4 if program is _diagonal_fill_and_expand else 3
    x = torch.arange(side * 4.0).reshape(side, 4)
    expected = program(x.clone())
    got = program(x.to("tpu"))
    assert fused.pending_nodes() > 0, "fused mode ran ops eagerly"
    torch.testing.assert_close(_cpu(got), expected)


def test_inplace_on_input_updates_every_alias(fused_mode):
    base = torch.ones(2, 3).to("tpu")
    alias = base.view(3, 2)
    base[1].mul_(5)
    torch.testing.assert_close(_cpu(alias), torch.tensor([[1.0, 1.0], [1.0, 5.0], [5.0, 5.0]]))


# ----------------------------------------------------------------------------- randomness


def _random_draws():
    torch.manual_seed(123)
    a = torch.randn(5, device="tpu")
    b = torch.nn.functional.dropout(torch.ones(8, device="tpu"), 0.5)
    return _cpu(a), _cpu(b)


def test_seeded_randomness_repeats_and_matches_strict(fused_mode):
    first = _random_draws()
    second = _random_draws()
    tpu_backend.set_eager_mode("strict")
    strict = _random_draws()
    for got, again, want in zip(first, second, strict):
        torch.testing.assert_close(got, again)
        torch.testing.assert_close(got, want)


def test_rng_keys_are_inputs_not_constants(fused_mode):
    draws = [_cpu(torch.rand(4, device="tpu")) for _ in range(3)]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


# ----------------------------------------------------------------------------- sync points


def _pending_after(sync) -> int:
    x = torch.ones(4, device="tpu") * 3
    y = x + 1
    assert fused.pending_nodes() > 0
    sync(y)
    return fused.pending_nodes()


@pytest.mark.parametrize(
    "sync",
    [
        lambda y: y.sum().item(),
        lambda y: y.cpu(),
        lambda y: y.cpu().numpy(),
        lambda y: repr(y),
        lambda y: torch.tpu.synchronize(),
        lambda y: tpu_backend.mark_step(),
        lambda y: torch.nonzero(y),
        lambda y: y[y > 3],
    ],
    ids=["item", "cpu", "numpy", "print", "synchronize", "mark_step", "nonzero", "bool_mask"],
)
def test_sync_points_run_the_pending_graph(fused_mode, sync):
    assert _pending_after(sync) == 0


def test_data_dependent_ops_see_pending_values(fused_mode):
    x = torch.tensor([1.0, -2.0, 3.0, -4.0]).to("tpu")
    y = x * -1  # pending
    torch.testing.assert_close(_cpu(y[y > 0]), torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(_cpu(torch.nonzero(y > 0)), torch.tensor([[1], [3]]))


def test_node_limit_runs_the_graph(fused_mode):
    previous = fused.max_nodes()
    fused.set_max_nodes(5)
    try:
        x = torch.zeros(3, device="tpu")
        for _ in range(12):
            x = x + 1
            assert fused.pending_nodes() < 5
        assert x.sum().item() == 36.0
    finally:
        fused.set_max_nodes(previous)


def test_leaving_fused_mode_runs_pending_ops(fused_mode):
    y = torch.ones(3, device="tpu") * 7
    tpu_backend.set_eager_mode("strict")
    assert fused.pending_nodes() == 0
    assert y.sum().item() == 21.0


def test_python_floats_are_values_not_constants(fused_mode):
    weight = torch.ones(4, device="tpu")
    tpu_backend.mark_step()  # the creation of `weight` is not part of the repeated step

    def step(lr: float) -> float:
        weight.sub_(lr * torch.ones(4, device="tpu"))
        return weight.sum().item()

    step(0.5)
    with cache_only():  # a new learning rate is a new input value, not a new program
        assert step(0.25) == pytest.approx(4 * (1 - 0.5 - 0.25))
        assert step(0.125) == pytest.approx(4 * (1 - 0.5 - 0.25 - 0.125))


def test_fused_program_can_be_dumped(fused_mode):
    x = torch.ones(2, 2, device="tpu")
    (x @ x + 1).sum().item()
    ops, stablehlo = fused.last_program_text()
    assert "aten.mm" in ops and "aten.add" in ops
    assert "stablehlo" in stablehlo and "func.func public @main" in stablehlo


# ----------------------------------------------------------------------------- training parity

STEPS = 20
WARMUP_STEPS = 2  # step 1 creates optimizer state, step 2 is the steady-state graph
DISTINCT_BATCHES = 4


def _train(model, case, optimizer_name, batches, device, cache_only_after=None) -> tuple[TrainingRun, int]:
    """The run and the number of programs its steps asked for (reading gradients and
    parameters back for the comparison is not part of a step)."""
    optimizer = make_optimizer(optimizer_name, model.parameters())
    guard, entered, requests = cache_only(), [], []

    def enter_cache_only(step: int) -> None:
        if step == cache_only_after:
            guard.__enter__()
            entered.append(step)

    def step(inputs, target) -> float:
        before = compile_stats().total().requests
        loss = train_step(model, optimizer, case, inputs, target).item()  # the sync point that ends the step
        requests.append(compile_stats().total().requests - before)
        return loss

    device_batches = [(inputs.to(device), target.to(device)) for inputs, target in batches]
    try:
        return record_training(model, step, device_batches, on_step=enter_cache_only), sum(requests)
    finally:
        if entered:
            guard.__exit__(None, None, None)


# Each case compiles two step programs (6-20 s on CPU): two of the six run with -m slow.
TRAINING_CASES = [
    pytest.param(model, optimizer, id=f"{model}-{optimizer}", marks=[pytest.mark.slow] if slow else [])
    for model, optimizer, slow in [
        ("mlp", "sgd", False),
        ("mlp", "adamw", False),
        ("cnn", "sgd", False),
        ("cnn", "adamw", True),
        ("transformer", "sgd", True),
        ("transformer", "adamw", True),
    ]
]


@pytest.mark.parametrize("model_name, optimizer_name", TRAINING_CASES)
def test_training_matches_cpu_with_one_program_per_step(fused_mode, model_name, optimizer_name):
    case = MODEL_CASES[model_name]
    torch.manual_seed(0)
    cpu_model = case.build()
    device_model = copy.deepcopy(cpu_model).to("tpu")
    batches = training_batches(case, STEPS, DISTINCT_BATCHES)

    cpu_run, _ = _train(cpu_model, case, optimizer_name, batches, "cpu")
    device_run, requests = _train(device_model, case, optimizer_name, batches, "tpu", cache_only_after=WARMUP_STEPS)

    assert requests == STEPS, "expected one fused program per step"
    assert_runs_match(device_run, cpu_run, "fused")


# ----------------------------------------------------------------------------- graph shape


def test_dead_intermediates_are_not_outputs(fused_mode):
    tpu_backend.mark_step()
    x = torch.ones(3, device="tpu")
    y = ((x + 1) * 2).exp()  # `x + 1` and `* 2` die here: XLA may fuse them away
    assert y.sum().item() == pytest.approx(3 * math.exp(4), rel=1e-6)
    ops, _ = fused.last_program_text()
    assert ops.splitlines()[0].endswith("3 outputs"), ops  # x, y and the sum; not the intermediates


def test_environment_variable_selects_fused_mode():
    code = (
        "import torch, tpu_backend\n"
        "from tpu_backend import fused\n"
        "y = torch.ones(2, device='tpu') * 3\n"
        "assert fused.pending_nodes() > 0\n"
        "print(tpu_backend.get_eager_mode(), y.sum().item())\n"
    )
    env = child_env(TPU_EAGER_MODE="fused")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fused", "6.0"]


# ----------------------------------------------------------------------------- donation and stats


def _sgd_step(model, optimizer, inputs):
    optimizer.zero_grad(set_to_none=True)
    model(inputs).square().mean().backward()
    optimizer.step()
    tpu_backend.mark_step()


def test_step_updates_parameters_and_state_in_place(fused_mode):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = torch.randn(5, 4).to("tpu")
    for _ in range(2):  # the second step has momentum buffers: the steady-state graph
        _sgd_step(model, optimizer, inputs)

    def buffers(tensors) -> set[int]:  # addresses only: holding the arrays would forbid donating them
        return {tpu_backend.tensor.payload_of(t).array.unsafe_buffer_pointer() for t in tensors}

    state = [*model.parameters(), *(optimizer.state[p]["momentum_buffer"] for p in model.parameters())]
    old_buffers = buffers(state)
    fused.reset_stats()
    _sgd_step(model, optimizer, inputs)
    # XLA wrote the step's outputs (new parameters, momentum, gradients) into the old buffers.
    assert old_buffers <= buffers(state + [p.grad for p in model.parameters()])
    assert fused.stats()["donated_inputs"] == 4  # weight, bias and their momentum buffers
    ops, _ = fused.last_program_text()
    assert "# donated inputs: [" in ops


def test_mark_step_enqueues_the_step_and_does_not_wait(fused_mode, monkeypatch):
    """The host records step n+1 while the device runs step n: `mark_step` hands the
    step's program to JAX (asynchronous on an accelerator) and returns; nothing waits for
    its results until a value is read. A repeated step reuses its program, not re-lowered."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = torch.randn(5, 4).to("tpu")
    for _ in range(2):
        _sgd_step(model, optimizer, inputs)
    waits = []
    real_wait = fused.jax.block_until_ready
    monkeypatch.setattr(fused.jax, "block_until_ready", lambda x: waits.append(x) or real_wait(x))
    compiled_before = compile_stats().total().misses
    fused.reset_stats()
    for _ in range(3):
        _sgd_step(model, optimizer, inputs)
    assert waits == [] and fused.stats()["syncs"]["read"] == 0
    assert fused.stats()["programs_run"] == 3 and compile_stats().total().misses == compiled_before
    assert all(isinstance(tpu_backend.tensor.payload_of(p).array, fused.jax.Array) for p in model.parameters())


def test_buffers_still_readable_are_not_donated(fused_mode):
    x = torch.ones(3, device="tpu")
    y = torch.empty(3, device="tpu")
    y.copy_(x)  # y's storage may hold x's very array
    tpu_backend.mark_step()
    x.add_(1)  # x's old array is overwritten but y can still read it
    tpu_backend.mark_step()
    assert y.cpu().tolist() == [1.0, 1.0, 1.0]
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_stats_name_the_read_that_splits_a_step(fused_mode):
    tpu_backend.mark_step()
    fused.reset_stats()
    x = torch.ones(4, device="tpu")
    y = (x * 2).sum()
    y.item()  # a read in the middle of the "step": runs a graph here
    (x + y).sum()
    tpu_backend.mark_step()
    stats = fused.stats()
    assert stats["programs_run"] == 2
    assert stats["syncs"]["read"] == 1 and stats["syncs"]["mark_step"] == 1
    (site,) = stats["read_sites"]
    assert site.startswith(__file__) and stats["read_sites"][site] == 1


def test_a_small_integer_read_is_computed_alone_and_the_step_stays_one_program(fused_mode):
    """transformers' mask code reads a value of the step's inputs mid-forward (are the
    positions one packed sequence?), and the labels' shift is checked for its range at that
    read. Both are integer computations of concrete arrays: they are computed alone, as on
    CPU, and the step's graph stays pending, one program at `mark_step`. A float read still
    runs the graph."""

    def step(weight, positions, labels):
        loss = (weight * 2).sum()  # the step's float work
        first = positions[:, :1] - 1
        packed = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
        one_sequence = bool((packed[:, -1] == 0).all())
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        return one_sequence, shifted, shifted.max().item(), loss

    weight, labels = torch.randn(4), torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    want = step(weight, torch.arange(16).unsqueeze(0), labels)
    on_device = weight.to("tpu")
    tpu_backend.mark_step()
    fused.reset_stats()
    got = step(on_device, torch.arange(16, device="tpu").unsqueeze(0), labels.to("tpu"))
    assert fused.stats()["reads_alone"] == 2 and fused.stats()["programs_run"] == 0
    assert fused.pending_nodes() > 0
    assert got[0] is want[0] is True and got[2] == want[2]
    torch.testing.assert_close(_cpu(got[1]), want[1], rtol=0, atol=0)
    assert got[3].item() == pytest.approx(want[3].item())
    assert fused.stats()["syncs"]["read"] == 1  # the float read ran the graph
    two_sequences = torch.tensor([[0, 1, 2, 0, 1]], device="tpu") * 1  # (pending)
    assert not bool(((torch.diff(two_sequences, dim=-1) != 1).cumsum(-1)[:, -1] == 0).all())
