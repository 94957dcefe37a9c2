"""The eager mode and the CPU-fallback switch (process-wide, set by env or API)."""

from __future__ import annotations

import collections
import os

EAGER_MODES = ("strict", "debug", "fused")
_mode = os.environ.get("TPU_EAGER_MODE", "strict")
if _mode not in EAGER_MODES:
    raise ValueError(f"TPU_EAGER_MODE={_mode!r}: expected one of {', '.join(EAGER_MODES)}")


def set_eager_mode(mode: str) -> None:
    """Choose how ops run: "strict" (jit-cached, fast), "debug" (synchronous, checked) or
    "fused" (experimental: recorded lazily, one program per step; see tpu_backend/fused.py)."""
    global _mode
    if mode not in EAGER_MODES:
        raise ValueError(f"eager mode {mode!r} is not one of {', '.join(EAGER_MODES)}")
    from tpu_backend import fused

    if mode == "fused":
        fused.enable()
    elif _mode == "fused":
        fused.disable()
    _mode = mode


def get_eager_mode() -> str:
    return _mode


_cpu_fallback = os.environ.get("TPU_CPU_FALLBACK", "0").lower() in ("1", "true", "yes", "on")
CPU_FALLBACK_COUNTS: collections.Counter = collections.Counter()
DECOMPOSED_COUNTS: collections.Counter = collections.Counter()  # ops run via torch._decomp


def set_cpu_fallback(enabled: bool) -> None:
    """Run ops with no tpu lowering on CPU copies (with a warning) instead of raising."""
    global _cpu_fallback
    _cpu_fallback = bool(enabled)


def cpu_fallback_counts() -> dict[str, int]:
    """How many times each op fell back to CPU in this process."""
    return dict(CPU_FALLBACK_COUNTS)
