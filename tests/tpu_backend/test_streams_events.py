"""Events, streams, pinned loaders and non-blocking copies on "tpu", as CUDA code uses them."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch
from torch import nn

import tpu_backend  # noqa: F401
from tests.chip import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def time_per_step(accelerator, step, steps: int) -> float:
    """Benchmark code as written for CUDA (`accelerator` = torch.cuda there)."""
    start = accelerator.Event(enable_timing=True)
    end = accelerator.Event(enable_timing=True)
    accelerator.synchronize()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def test_cuda_style_benchmark_code_runs_unchanged():
    x = torch.randn(64, 64).to("tpu")

    def step():
        torch.relu(x @ x).sum()

    ms = time_per_step(torch.tpu, step, steps=3)
    assert ms > 0


def test_events_follow_cudas_rules():
    timed, untimed = torch.tpu.Event(enable_timing=True), torch.tpu.Event()
    assert timed.query() and untimed.query()  # never recorded: nothing to wait for
    with pytest.raises(ValueError, match="must be recorded"):
        timed.elapsed_time(torch.tpu.Event(enable_timing=True))
    timed.record()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        timed.elapsed_time(untimed)
    later = torch.tpu.current_stream().record_event(torch.tpu.Event(enable_timing=True))
    later.synchronize()
    assert later.query() and timed.elapsed_time(later) >= 0
    with pytest.raises(NotImplementedError, match="interprocess"):
        torch.tpu.Event(interprocess=True)


def test_one_in_order_stream():
    default = torch.tpu.current_stream()
    assert default is torch.tpu.default_stream() and default.device == torch.device("tpu", 0)
    side = torch.tpu.Stream()
    x = torch.randn(8, 8).to("tpu")
    with torch.tpu.stream(side):
        assert torch.tpu.current_stream() is side
        y = x @ x  # a prefetch/side-stream pattern from CUDA code
    assert torch.tpu.current_stream() is default
    default.wait_stream(side)
    default.wait_event(side.record_event())
    y.record_stream(default)
    side.synchronize()
    assert side.query() and default.query()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())
    with pytest.raises(ValueError, match="tpu stream"):
        torch.tpu.set_stream(torch.Stream(device="cpu"))


def test_pinned_loader_and_non_blocking_copies_never_make_the_host_wait(monkeypatch):
    """The overlap, structurally: nothing in a training step waits for the device (no
    device -> host transfer, no block_until_ready) until the loss is read, and each batch
    reaches the device as one explicit asynchronous `device_put`. On an accelerator (JAX
    dispatches asynchronously there) the host therefore runs ahead: loading and pinning the
    next batch overlap the device's work on this one."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, pin_memory=True)
    model = nn.Linear(8, 1)
    reference = nn.Linear(8, 1)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    waits = []
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waits.append(x) or x)
    losses = []
    for x, y in loader:
        with jax.transfer_guard_host_to_device("disallow"):  # only explicit transfers allowed
            x_tpu, y_tpu = x.to("tpu", non_blocking=True), y.to("tpu", non_blocking=True)
        with jax.transfer_guard_device_to_host("disallow"):  # the host never reads a device value
            loss = nn.functional.mse_loss(model(x_tpu), y_tpu)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append(loss)
        reference_loss = nn.functional.mse_loss(reference(x), y)
        reference_optimizer.zero_grad()
        reference_loss.backward()
        reference_optimizer.step()
    assert waits == []
    torch.testing.assert_close(losses[-1].cpu(), reference_loss.detach())
    torch.testing.assert_close(model.weight.cpu(), reference.weight.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_non_blocking_copies_carry_the_values(dtype):
    x = (torch.arange(12) - 4).to(dtype).reshape(3, 4)
    torch.testing.assert_close(x.to("tpu", non_blocking=True).cpu(), x, rtol=0, atol=0)
    target = torch.empty(4, 3, dtype=dtype, device="tpu")
    target.copy_(x.t(), non_blocking=True)
    torch.testing.assert_close(target.cpu(), x.t(), rtol=0, atol=0)


ASYNC_CHILD = textwrap.dedent(
    """
    import time
    import jax
    import tpu_backend, torch
    jax.config.update("jax_cpu_enable_async_dispatch", True)  # as on an accelerator (before JAX starts)
    x = torch.randn(1500, 1500).to("tpu")
    chain = lambda: (x @ x @ x @ x @ x @ x).sum()
    chain().cpu()  # compile
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    total = chain()
    end.record()
    pending_at_record = not end.query()  # record() returned while the device still works
    host_work = sum(range(10_000))  # the host runs ahead meanwhile
    end.synchronize()
    print("RESULT", pending_at_record, end.query(), start.elapsed_time(end) > 0, torch.isfinite(total.cpu()).item())
    """
)


@pytest.mark.slow
def test_events_do_not_block_the_host_when_dispatch_is_asynchronous():
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", ASYNC_CHILD], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")][0]
    assert result == "RESULT True True True True", result


class _FakeArray:
    """What `newest_pending` reads of a jax.Array: readiness and the devices it lives on."""

    def __init__(self, name: str, ready: bool, devices: set):
        self.name, self.ready = name, ready
        self.sharding = type("Sharding", (), {"device_set": devices})()

    def is_ready(self) -> bool:
        return self.ready


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        # newest first, as jax.live_arrays() lists them: the first pending one stands for the rest
        ([("a", True, {0}), ("b", False, {0}), ("c", False, {0})], ["b"]),
        ([("a", True, {0}), ("b", True, {0})], []),
        # each chip has its own queue: the newest pending array of each, one covering both
        ([("a", False, {1}), ("b", False, {1}), ("c", False, {0})], ["a", "c"]),
        ([("a", False, {0, 1}), ("b", False, {0}), ("c", False, {1})], ["a"]),
    ],
)
def test_synchronize_on_a_tpu_waits_for_the_newest_pending_array_of_each_chip(monkeypatch, arrays, expected):
    from tpu_backend import streams

    live = [_FakeArray(*a) for a in arrays]
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "local_devices", lambda: [0, 1])
    monkeypatch.setattr(jax, "live_arrays", lambda: live)
    assert [a.name for a in streams.newest_pending()] == expected
