"""Where a user's call came from, and the device's error types."""

from __future__ import annotations

import os
import sys
import threading

import jax
import torch

_INTERNAL_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, jax, sys.modules["tpu_backend"]) if m.__file__
) + (os.path.dirname(os.__file__) + os.sep,)


def user_frame() -> str:
    """'file:line' of the innermost caller outside torch, jax, tpu_backend and the stdlib."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_INTERNAL_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    if threading.current_thread() is not threading.main_thread():
        # Backward runs on autograd's device thread, which has no user frames.
        return "the backward pass; torch.autograd.set_detect_anomaly(True) shows the forward line"
    return "<unknown>"


class TpuLoweringError(NotImplementedError):
    """An ATen op reached the tpu device and nothing could run it."""


class TpuDebugError(FloatingPointError):
    """Debug mode found a NaN/Inf or a shape/dtype that disagrees with PyTorch's meta."""
