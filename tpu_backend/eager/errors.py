"""Where a user's call came from, and the device's error types."""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import NoReturn

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


# ------------------------------------------------------------- errors as PyTorch raises them

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
# libtpu / PJRT phrasings of a failed allocation: (bytes asked, bytes free or the capacity)
_OOM_PATTERNS = (
    rf"Attempting to (?:allocate|reserve) {_SIZE}.*?There (?:are|is) {_SIZE} free",  # runtime
    rf"Used {_SIZE} of {_SIZE} hbm",  # compile time
    rf"required for HLO temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)",
    rf"allocate request for {_SIZE}",  # asked only
)


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def _mib(count: int | None) -> str:
    return "an unknown amount" if count is None else f"{count / 2**20:.2f} MiB"


def out_of_memory(error: BaseException) -> torch.OutOfMemoryError | None:
    """JAX's RESOURCE_EXHAUSTED as PyTorch's `torch.OutOfMemoryError` (what CUDA raises),
    naming the bytes asked and free (`requested_bytes`, `free_bytes`: None when XLA's
    message does not say); None for any other error."""
    if not isinstance(error, jax.errors.JaxRuntimeError) or "RESOURCE_EXHAUSTED" not in str(error):
        return None
    text = str(error)
    asked = free = None
    for pattern in _OOM_PATTERNS:
        found = re.search(pattern, text, re.DOTALL)
        if found:
            sizes = found.groups()
            asked = _bytes(*sizes[:2])
            free = _bytes(*sizes[2:4]) if len(sizes) > 2 else None
            break
    oom = torch.OutOfMemoryError(
        f"tpu out of memory. Tried to allocate {_mib(asked)}; the chip has {_mib(free)} free. Free tensors you "
        "no longer need (del them, or keep fewer activations: a smaller batch, torch.utils.checkpoint); "
        f"torch.tpu.memory_allocated() says what live tensors hold (called from {user_frame()}). XLA: "
        + text.splitlines()[0]
    )
    oom.requested_bytes, oom.free_bytes = asked, free
    oom.__cause__ = error
    return oom


def reraise_as_torch(error: BaseException) -> NoReturn:
    """Raise `error` as PyTorch would: out of memory as `torch.OutOfMemoryError`, else itself.
    Where programs run or data moves: `except jax.errors.JaxRuntimeError as error: reraise_as_torch(error)`."""
    oom = out_of_memory(error)
    if oom is None:
        raise error
    raise oom


def to_meta(value):
    """Tensors (nested in lists) as meta tensors of the same shape, strides and dtype."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta(v) for v in value)
    return value


# What a meta kernel raises about the meta device itself, not about the user's call.
_ABOUT_META = re.compile(r"\bmeta\b", re.IGNORECASE)
_USER_ERRORS = (RuntimeError, IndexError, ValueError, TypeError)


def cpu_stand_in(value):
    """Tensors as CPU tensors of the same shape and dtype that hold one element (stride 0)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros((), dtype=value.dtype).expand(value.shape)
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_stand_in(v) for v in value)
    return value


def _raised(op, convert, device: str, args, kwargs) -> Exception | None:
    kwargs = {k: (None if k == "generator" else v) for k, v in kwargs.items() if k != "key"}
    if kwargs.get("device") is not None:
        kwargs["device"] = device
    try:
        op(*convert(args), **convert(kwargs))
    except NotImplementedError:  # no kernel there: nothing to say
        return None
    except _USER_ERRORS as error:
        return None if _ABOUT_META.search(str(error)) else error
    return None


def refused_by_torch(op, args, kwargs) -> Exception | None:
    """The error PyTorch raises for these arguments of `op` whatever their values (shapes,
    dtypes, argument checks), or None when it accepts them. Asked of the meta kernel, and
    when that refuses, of the CPU kernel on one-element stride-0 stand-ins (its checks fail
    before it computes anything), whose message is the one users know: several meta
    kernels are Python references that word it differently (`add`: "Attempting to
    broadcast a dimension...", CPU and CUDA: "The size of tensor a (3) must match...")."""
    refused = _raised(op, to_meta, "meta", args, kwargs)
    if refused is None:
        return None
    return _raised(op, cpu_stand_in, "cpu", args, kwargs) or refused


def refused_by_both(op, args, kwargs) -> Exception | None:
    """The error PyTorch's CPU kernel raises for these arguments of `op` when its meta kernel
    refuses them too, else None. Asked when an op's program is traced for new shapes or static
    arguments (once per signature): JAX broadcasts, clamps and drops where ATen refuses, so a
    lowering alone would compute something for a call PyTorch rejects. Two refusals are
    needed, so that a stand-in's values (zeros) or a meta kernel's quirk alone never refuses
    a call PyTorch accepts; a TypeError is not one (the dispatcher checked the arguments'
    types before the device saw them: it would be about the rebuilt arguments)."""
    if not _fits_schema(op, args, kwargs):
        return None
    refused = _raised(op, to_meta, "meta", args, kwargs)
    if refused is None or isinstance(refused, TypeError):
        return None
    refused = _raised(op, cpu_stand_in, "cpu", args, kwargs)
    return None if refused is None else refused.with_traceback(None)


def _fits_schema(op, args, kwargs) -> bool:
    """Whether `args` and `kwargs` name every argument of `op`'s schema that has no default:
    an in-place kernel hands its functional op the in-place call's arguments, whose defaults
    may differ (`bernoulli_(p=0.5)`, `bernoulli.p` without one), and a check of those would
    be the rebuilt call's error, not the user's."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional) or not set(kwargs) <= {a.name for a in schema.arguments}:
        return False
    given = {a.name for a in positional[: len(args)]} | set(kwargs)
    return all(a.name in given or a.has_default_value() for a in schema.arguments)


def like_torch(op, args, kwargs, error: Exception) -> Exception:
    """What to raise when running `op` on the tpu failed with `error` (the failure path only:
    nothing here runs for a call that succeeds). Out of memory: `torch.OutOfMemoryError`. A
    call PyTorch itself refuses (shapes that do not broadcast, matmul inner dimensions):
    PyTorch's own error (`refused_by_torch`). Else the lowering failed on a call PyTorch
    accepts: `error` itself, except that a JAX TypeError becomes a RuntimeError naming the op
    (a TypeError from `a + b` would turn into Python's "unsupported operand type(s)")."""
    oom = out_of_memory(error)
    if oom is not None:
        return oom
    refused = refused_by_torch(op, args, kwargs)
    if refused is not None:
        refused.__suppress_context__ = True  # the user's error, not the lowering's: JAX's is noise
        return refused.with_traceback(None)
    if isinstance(error, TypeError):
        wrapped = RuntimeError(f"tpu lowering of {op} failed: {error} (called from {user_frame()})")
        wrapped.__cause__ = error
        return wrapped
    return error


def torch_dtype_name(dtype: torch.dtype) -> str:
    """PyTorch's name of a dtype in its messages (torch.float32 -> "Float", torch.int64 -> "Long")."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
