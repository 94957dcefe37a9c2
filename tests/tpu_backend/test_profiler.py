"""`torch.tpu.profiler`: profile a few ops and training steps as a user would, then read
the files it wrote: PyTorch's host trace (ATen op names, program launches, steps), JAX's
device trace (XPlane for TensorBoard, Chrome JSON) and the combined timeline."""

from __future__ import annotations

import contextlib
import gzip
import json

import pytest
import torch
from torch import nn

import tpu_backend
from tpu_backend import profiler as tpu_profiler
from tpu_backend.compile.program import Program


def _names(trace: dict) -> set[str]:
    return {e.get("name") for e in trace["traceEvents"]}


def _load(path: str) -> dict:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def _device_json(files: dict) -> dict:
    return _load(next(f for f in files["device"] if f.endswith(".trace.json.gz")))


def _train(model, optimizer, x, y, prof, steps=2):
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        prof.step()


def test_ops_are_named_after_aten_and_the_device_trace_is_written(tmp_path):
    a, b = torch.randn(16, 16).to("tpu"), torch.randn(16, 16).to("tpu")
    with torch.tpu.profiler.profile(tmp_path) as prof:
        out = torch.relu(torch.mm(a, b) + 1.0).sum()
        out.item()

    host = _load(prof.files["host"])
    assert {"aten::mm", "aten::add", "aten::relu", "aten::sum"} <= _names(host)
    assert any(e.key == "aten::mm" for e in prof.key_averages())

    assert any(f.endswith(".xplane.pb") for f in prof.files["device"])  # TensorBoard's profile plugin
    device_names = _names(_device_json(prof.files))
    assert tpu_profiler.CLOCK_SYNC in device_names
    assert any("Execute" in str(n) or "PjitFunction" in str(n) for n in device_names), "no XLA execution event"


def test_fused_training_steps_show_program_launches_and_steps(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 1).to("tpu")
    tpu_backend.set_eager_mode("fused")
    try:
        with torch.tpu.profiler.profile(tmp_path) as prof:
            _train(model, optimizer, x, y, prof)
    finally:
        tpu_backend.set_eager_mode("strict")

    host_events = _load(prof.files["host"])["traceEvents"]
    names = {e.get("name") for e in host_events}
    assert {"aten::addmm", "aten::relu", "aten::mse_loss", "ProfilerStep#0", "ProfilerStep#1"} <= names
    launches = [e for e in host_events if e.get("name") == "tpu::fused"]
    assert len(launches) >= 2  # at least one program per step

    combined = _load(prof.files["combined"])
    markers = [e["ts"] for e in combined["traceEvents"] if e.get("name") == tpu_profiler.CLOCK_SYNC]
    assert len(markers) == 2 and abs(markers[0] - markers[1]) < 1.0  # both clocks aligned on the marker
    assert "tpu::fused" in _names(_device_json(prof.files))  # the launch is marked in JAX's trace too
    processes = {e["args"]["name"] for e in combined["traceEvents"] if e.get("name") == "process_name"}
    assert "tpu::fused" in _names(combined) and any(p.startswith("JAX /host") for p in processes), processes


def test_compiled_training_step_shows_forward_and_backward_programs(tmp_path):
    import tpu_backend.compile  # noqa: F401 - the "tpu" torch.compile backend

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 1).to("tpu")
    with torch.tpu.profiler.profile(tmp_path, device_trace=False) as prof:
        _train(compiled, optimizer, x, y, prof)

    names = _names(_load(prof.files["host"]))
    programs = {n for n in names if n.startswith("tpu::torch_compile_")}
    assert any(n.endswith("_forward") for n in programs) and any(n.endswith("_backward") for n in programs), names
    assert prof.files["device"] == [] and prof.files["combined"] is None


def test_torch_tpu_profiler_is_importable_like_torch_cuda_submodules():
    import importlib

    assert importlib.import_module("torch.tpu.profiler") is torch.tpu.profiler is tpu_profiler
    assert torch.tpu.profiler.TpuProfilerConfig().host_tracer_level == 2


def test_profiling_leaves_nothing_behind_and_does_not_nest(tmp_path):
    original = Program.__call__
    with torch.tpu.profiler.profile(tmp_path / "outer", device_trace=False):
        assert Program.__call__ is not original and tpu_profiler.is_profiling()
        with pytest.raises(RuntimeError, match="already running"):
            torch.tpu.profiler.profile(tmp_path / "inner").start()
    assert Program.__call__ is original and not tpu_profiler.is_profiling()


def test_scanned_layers_compile_and_train_alike_under_the_profiler(tmp_path):
    """A scanned block traced while a profiler runs carries `record_function` enters and
    exits in its graph (which no lowering has): they are dropped, and the profiled steps
    equal unprofiled ones, loss and gradients."""
    from tpu_backend.compile import scan_layers

    def run(profiled: bool):
        torch._dynamo.reset()
        torch.manual_seed(0)
        blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
        scan_layers(blocks)
        model = blocks.to("tpu")
        compiled = torch.compile(model, backend="tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 8).to("tpu")
        losses = []
        profile = torch.tpu.profiler.profile(tmp_path, device_trace=False) if profiled else contextlib.nullcontext()
        with profile:
            for _ in range(2):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(compiled(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return losses, [p.grad.cpu() for p in model.parameters()]

    plain, profiled = run(False), run(True)
    assert profiled[0] == pytest.approx(plain[0], rel=1e-6)
    for got, expected in zip(profiled[1], plain[1]):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
