"""Streams and events on "tpu", so CUDA-style benchmark and prefetch code runs unchanged.

    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record(); loss = step(batch); end.record()
    end.synchronize(); print(start.elapsed_time(end), "ms")

JAX runs a device's computations in the order they are issued: the device has ONE
queue, which `current_stream()`/`default_stream()` return (`torch.tpu.Stream` objects
are that queue too). Hence `wait_stream`/`wait_event` have nothing to order (work is
already in order) and `with torch.tpu.stream(s):` changes nothing about placement.

An event is a point in that queue. `record()` first runs what fused eager has recorded
(so the work before the event is issued), then takes the arrays still being computed:
the event is reached when they are all ready. Its timestamp is taken when that
happens: at once if nothing is pending (JAX's synchronous CPU runtime), else by a
helper thread that waits for them (asynchronous accelerators), so `elapsed_time`
measures device completion to device completion, as CUDA events do, without making
the host wait at `record()`. `query()` never blocks; `synchronize()` waits.
"""

from __future__ import annotations

import contextlib
import threading
import time

import jax
import torch

from tpu_backend import tensor as device_tensor
from tpu_backend._registration import DEVICE_NAME


def newest_pending() -> list:
    """The arrays to wait for so that everything issued so far has finished (fused work is
    issued first). A TPU runs its computations in issue order, so the newest array still
    being computed on each chip stands for all before it (`jax.live_arrays()` lists the
    newest first). Waiting for every pending array instead waits for the runtime to mark
    each one ready, ~7 us an array on a v5e host: 8 ms of a 374M training step's 1,100
    (`docs/tpu.md`). Elsewhere (XLA:CPU may run independent programs side by side): every
    pending array."""
    device_tensor.flush()
    arrays = jax.live_arrays()
    if jax.default_backend() != "tpu":
        return [a for a in arrays if not a.is_ready()]
    uncovered, newest = set(jax.local_devices()), []
    for array in arrays:
        if not array.is_ready() and not uncovered.isdisjoint(array.sharding.device_set):
            newest.append(array)
            uncovered -= array.sharding.device_set
            if not uncovered:
                break
    return newest


class Stream(torch.Stream):
    """The tpu device's one in-order queue (see the module docstring)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=DEVICE_NAME, priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def wait_event(self, event) -> None:
        """Nothing to wait for on the device: work already runs in issue order."""

    def wait_stream(self, stream) -> None:
        """Nothing to wait for on the device: there is one queue."""

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """True when every computation issued so far has finished (never blocks)."""
        return not newest_pending()

    def synchronize(self) -> None:
        jax.block_until_ready(newest_pending())

    def __repr__(self) -> str:
        return f"torch.tpu.Stream(device=tpu:0, stream_id={self.stream_id})"


_DEFAULT_STREAM: Stream | None = None


def default_stream(device=None) -> Stream:
    global _DEFAULT_STREAM
    if _DEFAULT_STREAM is None:
        _DEFAULT_STREAM = Stream()
    return _DEFAULT_STREAM


_current: list[Stream] = []


def current_stream(device=None) -> Stream:
    return _current[-1] if _current else default_stream()


def set_stream(stream: Stream) -> None:
    _check_stream(stream)
    _current[:] = [stream]


def _check_stream(stream) -> None:
    if not isinstance(stream, torch.Stream) or stream.device.type != DEVICE_NAME:
        raise ValueError(f"expected a tpu stream (torch.tpu.Stream()), got {stream!r}")


@contextlib.contextmanager
def stream(s: Stream | None):
    """`with torch.tpu.stream(s):` makes `s` the current stream (None: no change)."""
    if s is None:
        yield
        return
    _check_stream(s)
    _current.append(s)
    try:
        yield
    finally:
        _current.pop()


class Event(torch.Event):
    """A point in the device's queue; with `enable_timing=True`, when the device reached it."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs):
        if interprocess:
            raise NotImplementedError("tpu events cannot be shared between processes (interprocess=True)")
        return super().__new__(cls, device=DEVICE_NAME, enable_timing=enable_timing, blocking=blocking)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs):
        self.enable_timing = enable_timing
        self._recorded = False
        self._reached_at: float | None = None
        self._waiter: threading.Thread | None = None

    def record(self, stream: torch.Stream | None = None) -> "Event":
        pending = newest_pending()
        self._recorded, self._reached_at, self._waiter = True, None, None
        if not pending:
            self._reached_at = time.perf_counter()
            return self

        def wait_then_stamp():
            jax.block_until_ready(pending)
            self._reached_at = time.perf_counter()

        self._waiter = threading.Thread(target=wait_then_stamp, name="tpu-event", daemon=True)
        self._waiter.start()
        return self

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Nothing to wait for on the device: work already runs in issue order."""

    def query(self) -> bool:
        """True once the device has reached the event (an unrecorded event counts as reached, as on CUDA)."""
        return not self._recorded or self._reached_at is not None

    def synchronize(self) -> None:
        """Block the host until the device has reached the event."""
        waiter = self._waiter
        if waiter is not None:
            waiter.join()

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and `end_event` (both recorded with enable_timing=True)."""
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self._recorded and end_event._recorded):
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        self.synchronize()
        end_event.synchronize()
        return (end_event._reached_at - self._reached_at) * 1000.0

    def __repr__(self) -> str:
        state = "reached" if self.query() else "pending"
        return f"torch.tpu.Event(enable_timing={self.enable_timing}, {'recorded, ' + state if self._recorded else 'not recorded'})"


def install() -> None:
    from torch._ops import ops

    from tpu_backend import dispatch

    # `tensor.record_stream(s)` (prefetchers): nothing to do with one in-order queue
    dispatch.register_kernel(ops.aten.record_stream.default, lambda tensor, s: None)


__all__ = ["Event", "Stream", "current_stream", "default_stream", "set_stream", "stream"]
