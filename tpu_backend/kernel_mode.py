"""The kernel mode: whether the device's attention, norms and cross-entropy take the
Pallas kernels (`TPU_KERNELS=auto|on|off|interpret`; `tpu_backend.kernels` documents the
modes and re-exports these names, its public home).

A process-wide switch kept below everything that reads it: the routers
(`tpu_backend/kernels.py`) pick an implementation by it, and the compilation cache keys
programs on it (`compile/program_cache.py`), so a program traced with the kernels is
never reused without them.
"""

from __future__ import annotations

import os

MODES = ("auto", "on", "off", "interpret")
_mode = os.environ.get("TPU_KERNELS", "auto")
if _mode not in MODES:
    raise ValueError(f"TPU_KERNELS={_mode!r}: expected one of {', '.join(MODES)}")


def mode() -> str:
    return _mode


def set_mode(new_mode: str) -> None:
    global _mode
    if new_mode not in MODES:
        raise ValueError(f"kernel mode {new_mode!r} is not one of {', '.join(MODES)}")
    _mode = new_mode


class use:
    """Set the kernel mode: `use("on")` sets it; `with use("on"):` restores the previous
    mode on exit."""

    def __init__(self, new_mode: str):
        self.previous = _mode
        set_mode(new_mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        set_mode(self.previous)
        return False


def implementation() -> str:
    """What the current mode means on this JAX backend: "pallas", "interpret" or "reference"."""
    from kernels._common import accelerator

    on_tpu = accelerator() == "tpu"
    if _mode == "off" or (_mode == "auto" and not on_tpu):
        return "reference"
    if _mode == "interpret":
        return "interpret"
    return "pallas" if on_tpu else "interpret"
