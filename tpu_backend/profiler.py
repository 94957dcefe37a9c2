"""`torch.tpu.profiler`: one trace of a tpu workload, host ops and device work together.

    with torch.tpu.profiler.profile("runs/step") as prof:
        for batch in batches:
            train_step(batch)
            prof.step()
    print(prof.key_averages().table(row_limit=10))
    prof.files   # {"host": ..., "device": [...], "combined": ...}

The folder then holds three views of the same run:
- `<host>_<pid>.pt.trace.json`: PyTorch's profiler (CPU activity): one event per ATen op
  as the dispatcher saw it (`aten::mm`, `aten::add_`, ...: in strict eager the op's
  dispatch and run, in fused eager its recording), `ProfilerStep#N` per `step()`, and one
  `tpu::<program>` event per launch of a fused-eager or `torch.compile` program
  (`tpu::fused`, `tpu::torch_compile_0_forward`, ...);
- `plugins/profile/<run>/`: JAX's trace (`jax.profiler`): the XLA executions on the device
  (kernels on a GPU or TPU), compiles and JAX's host events, as `<host>.xplane.pb`
  (TensorBoard's profile plugin: `tensorboard --logdir DIR`) and `*.trace.json.gz`;
- `combined.trace.json`: both on one timeline (Perfetto, `ui.perfetto.dev`, or
  `chrome://tracing`). The two profilers keep different clocks; a marker event recorded
  by both at start (`tpu::clock_sync`) aligns them.

No ATen op needs instrumenting: the dispatcher's own record-function hooks name every op
for PyTorch's profiler. Program launches are instrumented only while a profile is open
(`Program.__call__` is wrapped on entry and restored on exit), so code that is not being
profiled runs exactly the code it runs without this module.

`TpuProfilerConfig` (the name torch-tpu uses) holds JAX's tracer levels.
`torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])` is accepted by
PyTorch but records nothing for this device (a device activity needs a C++ Kineto plugin);
use this module instead.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import socket
import threading

import torch

CLOCK_SYNC = "tpu::clock_sync"
PROGRAM_EVENT_PREFIX = "tpu::"
_JAX_PID_OFFSET = 1 << 24  # JAX's process ids moved clear of the OS pid of the torch events
_lock = threading.Lock()
_active: "profile | None" = None


@dataclasses.dataclass(frozen=True)
class TpuProfilerConfig:
    """JAX tracer levels (`jax.profiler.ProfileOptions`). host: 1 = user annotations,
    2 = + XLA's runtime events, 3 = + low-level ones; python: 1 traces every Python call
    (large, slow); device: 1 = device activity (applied where JAX's options have it)."""

    host_tracer_level: int = 2
    device_tracer_level: int = 1
    python_tracer_level: int = 0


def _jax_options(config: TpuProfilerConfig):
    import jax

    options = jax.profiler.ProfileOptions()
    for field in dataclasses.fields(config):
        if hasattr(options, field.name):  # the option set differs across JAX versions
            setattr(options, field.name, getattr(config, field.name))
    return options


def _instrument_programs():
    """Wrap `Program.__call__` (fused-eager and compiled programs) in a host event named
    after the program, in both profilers; returns the function that undoes it."""
    import jax

    from tpu_backend.compile.program import Program

    original = Program.__call__

    def profiled_call(self, *args):
        name = PROGRAM_EVENT_PREFIX + self.name
        with torch.profiler.record_function(name), jax.profiler.TraceAnnotation(name):
            return original(self, *args)

    Program.__call__ = profiled_call

    def restore():
        Program.__call__ = original

    return restore


class profile:
    """Profile the tpu device into `log_dir` (see the module docstring). Use as a context
    manager or with `start()`/`stop()`; one profile at a time per process.

    record_shapes, with_stack, profile_memory: passed to `torch.profiler.profile`.
    device_trace: also record JAX's trace (False: only the host ATen events)."""

    def __init__(
        self,
        log_dir: str | os.PathLike,
        *,
        config: TpuProfilerConfig | None = None,
        record_shapes: bool = False,
        with_stack: bool = False,
        profile_memory: bool = False,
        device_trace: bool = True,
    ):
        self.log_dir = os.fspath(log_dir)
        self.config = config or TpuProfilerConfig()
        self.device_trace = device_trace
        self._torch = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            record_shapes=record_shapes,
            with_stack=with_stack,
            profile_memory=profile_memory,
        )
        self._restore = None
        self._step_events = None
        self._step_number = 0
        self.files: dict = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "profile":
        global _active
        import jax

        with _lock:
            if _active is not None:
                raise RuntimeError(
                    f"torch.tpu.profiler: a profile into {_active.log_dir!r} is already running; stop it first"
                )
            _active = self
        try:
            os.makedirs(self.log_dir, exist_ok=True)
            if self.device_trace:
                jax.profiler.start_trace(self.log_dir, profiler_options=_jax_options(self.config))
            self._torch.__enter__()
            self._restore = _instrument_programs()
            with torch.profiler.record_function(CLOCK_SYNC), jax.profiler.TraceAnnotation(CLOCK_SYNC):
                pass
            self._open_step()
        except BaseException:
            self._release()
            raise
        return self

    def stop(self) -> dict:
        """Finish the run (pending device work included), write the traces; returns `files`."""
        import jax

        if _active is not self:
            raise RuntimeError("torch.tpu.profiler: this profile is not running")
        try:
            torch.tpu.synchronize()  # the device trace should hold the work issued inside
            self._close_step()
            self._torch.__exit__(None, None, None)
            if self.device_trace:
                jax.profiler.stop_trace()
        finally:
            self._release()
        self.files = self._write()
        return self.files

    def _release(self) -> None:
        global _active
        if self._restore is not None:
            self._restore()
            self._restore = None
        with _lock:
            if _active is self:
                _active = None

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # ------------------------------------------------------------------ steps

    def _open_step(self) -> None:
        import jax

        # PyTorch's own `ProfilerStep#N` events exist only with a schedule: record them here.
        self._step_events = (
            torch.profiler.record_function(f"ProfilerStep#{self._step_number}"),
            jax.profiler.StepTraceAnnotation("train", step_num=self._step_number),
        )
        for event in self._step_events:
            event.__enter__()

    def _close_step(self) -> None:
        if self._step_events is not None:
            for event in reversed(self._step_events):
                event.__exit__(None, None, None)
            self._step_events = None

    def step(self) -> None:
        """End of a training step: `ProfilerStep#N` in PyTorch's trace, a step in JAX's
        (TensorBoard's step-time view reads these)."""
        self._close_step()
        self._step_number += 1
        self._open_step()

    # ------------------------------------------------------------------ results

    def key_averages(self, *args, **kwargs):
        """PyTorch's per-op table (`.table(sort_by="cpu_time_total")`)."""
        return self._torch.key_averages(*args, **kwargs)

    def events(self):
        return self._torch.events()

    def _write(self) -> dict:
        host = os.path.join(self.log_dir, f"{socket.gethostname()}_{os.getpid()}.pt.trace.json")
        self._torch.export_chrome_trace(host)
        files = {"host": host, "device": [], "combined": None}
        if not self.device_trace:
            return files
        run = _latest_jax_run(self.log_dir)
        if run is None:
            return files
        files["device"] = sorted(
            glob.glob(os.path.join(run, "*.xplane.pb")) + glob.glob(os.path.join(run, "*.json.gz"))
        )
        device_json = next((f for f in files["device"] if f.endswith(".trace.json.gz")), None)
        if device_json is not None:
            combined = os.path.join(self.log_dir, "combined.trace.json")
            combine_traces(host, device_json, combined)
            files["combined"] = combined
        return files


def _latest_jax_run(log_dir: str) -> str | None:
    runs = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*")), key=os.path.getmtime)
    return runs[-1] if runs else None


def _load_json(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _marker_ts(events: list) -> float | None:
    return next((e["ts"] for e in events if e.get("name") == CLOCK_SYNC and "ts" in e), None)


def combine_traces(host_path: str, device_path: str, out_path: str) -> None:
    """PyTorch's Chrome trace and JAX's on one timeline: JAX's events shifted so that the
    clock-sync marker both recorded coincides, its processes renamed "JAX ..." and given
    ids clear of PyTorch's."""
    host = _load_json(host_path)
    device = _load_json(device_path)
    device_events = device.get("traceEvents", [])
    host_marker, device_marker = _marker_ts(host["traceEvents"]), _marker_ts(device_events)
    shift = host_marker - device_marker if host_marker is not None and device_marker is not None else 0.0
    merged = []
    for event in device_events:
        event = dict(event)
        if "pid" in event and isinstance(event["pid"], int):
            event["pid"] += _JAX_PID_OFFSET
        if "ts" in event:
            event["ts"] = event["ts"] + shift
        if event.get("ph") == "M" and event.get("name") == "process_name":
            event["args"] = {"name": f"JAX {event.get('args', {}).get('name', '')}".strip()}
        merged.append(event)
    host["traceEvents"] = host["traceEvents"] + merged
    host["clockSyncShiftUs"] = shift if host_marker is not None and device_marker is not None else None
    with open(out_path, "w") as f:
        json.dump(host, f)


def is_profiling() -> bool:
    return _active is not None


def install(device_module) -> None:
    """Make this module `torch.tpu.profiler` (attribute and importable name)."""
    import sys

    device_module.profiler = sys.modules[__name__]
    sys.modules["torch.tpu.profiler"] = sys.modules[__name__]
