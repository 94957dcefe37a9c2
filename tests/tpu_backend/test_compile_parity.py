"""`torch.compile(backend="tpu")` trains like PyTorch CPU eager, and from step 3 on it runs
entirely from its compilation cache.

The three models of `benchmarks/models.py` (MLP, small CNN, small transformer) are
built once on CPU from a fixed seed; one deep copy moves to the device. Both train 20
steps on the same batches with SGD (momentum) and with AdamW. Two things are compiled:

- "model": `torch.compile(model, backend="tpu")`; the optimizer step runs in strict eager;
- "step": `torch.compile(train_step, backend="tpu")`, the whole step (zero_grad, forward,
  loss, backward, optimizer step): Dynamo compiles the forward/backward and the optimizer
  update as separate graphs (`loss.backward()` is a graph break).

Checked, as a user would:
- the losses agree with CPU eager to 1e-4 relative at EVERY step, and so do the gradients
  after step 1 and the parameters after step 20 (norm-relative, `tests/tpu_backend/parity.py`);
- steps 3 to 20 run inside `tpu_backend.compile.cache_only()` (any compile would raise
  `CacheMissError`) and, counted explicitly, compile nothing: no compiled-program miss,
  no strict-eager jit miss; the compiled programs are hit at every one of those steps.
  Only the first step compiles in practice (cache-only from step 2 passes too, tried on
  the MLP); starting at step 3 leaves room for a Dynamo recompile once the optimizer's
  state exists, which is legitimate and not what this test is about.

The compilation cache goes to a private temporary folder (not the user's `~/.cache`),
so the counts do not depend on what ran before. Two MLP cases run by default (AdamW with
the model compiled, SGD with the whole step compiled); the other ten are `slow` (each
takes 20-70 s on a loaded 2-core machine): `pytest -m slow tests/tpu_backend/test_compile_parity.py`.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import tpu_backend
import tpu_backend.compile as tpu_compile
from benchmarks.models import MODEL_CASES, make_optimizer, train_step, training_batches
from tests.tpu_backend.parity import assert_runs_match, record_training

STEPS = 20
CACHE_ONLY_FROM = 2  # 0-based: the third step and every later one run under cache_only()
DISTINCT_BATCHES = 4
# Compiled programs every step runs at least: forward and backward; the whole step adds
# the optimizer update.
PROGRAMS_PER_STEP = {"model": 2, "step": 3}
# The default suite runs the MLP, each optimizer once; the rest is `slow`.
DEFAULT_CASES = {("mlp", "adamw", "model"), ("mlp", "sgd", "step")}


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory):
    with tpu_compile.using_cache_dir(tmp_path_factory.mktemp("xla_cache")) as folder:
        yield folder


@pytest.fixture(autouse=True)
def fresh_compile_state():
    """Strict eager for the eager parts; no graph compiled for another test's model is reused."""
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("strict")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    tpu_backend.set_eager_mode(previous)


def compiled_runner(what: str, model, optimizer, case):
    """A `(inputs, target) -> loss` function with `what` ("model" or "step") compiled."""
    if what == "model":
        compiled_model = torch.compile(model, backend="tpu")
        return lambda inputs, target: train_step(compiled_model, optimizer, case, inputs, target)
    if what == "step":
        compiled_step = torch.compile(train_step, backend="tpu")
        return lambda inputs, target: compiled_step(model, optimizer, case, inputs, target)
    raise ValueError(f"unknown compile target {what!r}: use 'model' or 'step'")


def compile_misses() -> tuple[int, int]:
    """(compiled-program misses, strict-eager jit misses) so far in this process."""
    return tpu_compile.compile_stats().total().misses, torch.tpu.cache_stats()["misses"]


def program_hits() -> int:
    return tpu_compile.compile_stats().total().hits


def _param(model: str, optimizer: str, what: str):
    marks = [] if (model, optimizer, what) in DEFAULT_CASES else [pytest.mark.slow]
    return pytest.param(model, optimizer, what, id=f"{model}-{optimizer}-{what}", marks=marks)


CASES = [
    _param(model, optimizer, what)
    for model in ("mlp", "cnn", "transformer")
    for optimizer in ("sgd", "adamw")
    for what in ("model", "step")
]


@pytest.mark.parametrize("model_name, optimizer_name, what", CASES)
def test_compiled_training_matches_cpu_and_runs_from_cache(model_name, optimizer_name, what):
    case = MODEL_CASES[model_name]
    torch.manual_seed(0)
    cpu_model = case.build()
    device_model = copy.deepcopy(cpu_model).to("tpu")
    batches = training_batches(case, STEPS, DISTINCT_BATCHES)

    cpu_optimizer = make_optimizer(optimizer_name, cpu_model.parameters())
    cpu_run = record_training(cpu_model, lambda x, y: train_step(cpu_model, cpu_optimizer, case, x, y), batches)

    device_optimizer = make_optimizer(optimizer_name, device_model.parameters())
    run = compiled_runner(what, device_model, device_optimizer, case)
    device_batches = [(x.to("tpu"), y.to("tpu")) for x, y in batches]
    guard, counts_before = tpu_compile.cache_only(), []

    def enter_cache_only(step: int) -> None:
        if step == CACHE_ONLY_FROM:
            counts_before.extend((compile_misses(), program_hits()))
            guard.__enter__()

    try:
        device_run = record_training(device_model, run, device_batches, on_step=enter_cache_only)
    finally:
        if counts_before:
            guard.__exit__(None, None, None)
    (misses_before, hits_before) = counts_before
    program_misses, eager_misses = (after - before for after, before in zip(compile_misses(), misses_before))

    cpu_losses = cpu_run.losses
    assert cpu_losses[STEPS - DISTINCT_BATCHES] < cpu_losses[0], f"the reference run did not train: {cpu_losses}"
    assert all(p.device.type == "tpu" for p in device_model.parameters())
    assert_runs_match(device_run, cpu_run, f"compiled {what}")
    cached_steps = STEPS - CACHE_ONLY_FROM
    assert (program_misses, eager_misses) == (0, 0), (
        f"steps {CACHE_ONLY_FROM + 1}-{STEPS} compiled {program_misses} program(s) and {eager_misses} eager op(s) "
        f"inside cache_only():\n{tpu_compile.compile_stats().summary()}"
    )
    assert program_hits() - hits_before >= PROGRAMS_PER_STEP[what] * cached_steps, tpu_compile.compile_stats().summary()
