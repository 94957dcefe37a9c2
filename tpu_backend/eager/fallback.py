"""The catch-all PrivateUse1 fallback for ops without a kernel.

It tries, in order: the functional form of an in-place/out op, PyTorch's own
decomposition (`torch._decomp`), the opt-in CPU fallback, and otherwise raises
"no tpu lowering for aten.X (called from <file:line>)".
"""

from __future__ import annotations

import threading
import warnings

import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager import modes
from tpu_backend.eager.errors import TpuLoweringError, user_frame
from tpu_backend.eager.registration import _opaque_to_dynamo
from tpu_backend.eager.variants import _out_names, functional_variant, write_result

_active = threading.local()


def _active_ops() -> set:
    if not hasattr(_active, "ops"):
        _active.ops = set()
    return _active.ops


def _mutated_args(op, args, kwargs) -> list[tuple[torch.Tensor, str | int]]:
    mutated = []
    for index, argument in enumerate(op._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name) if argument.kwarg_only or index >= len(args) else args[index]
            if isinstance(value, torch.Tensor):
                mutated.append(value)
    return mutated


def _via_functional(op, args, kwargs):
    """An in-place/out op whose functional form runs on tpu: compute it, then copy back."""
    functional = functional_variant(op)
    if functional is None:
        return NotImplemented
    outs = [kwargs.pop(name) for name in _out_names(op)]
    result = functional(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if outs:
        for dst, value in zip(outs, results):
            write_result(dst, tpu_tensor.read(value))
        return outs[0] if len(outs) == 1 else tuple(outs)
    self = args[0]
    tpu_tensor.write(self, tpu_tensor.read(results[0]))
    return self


def _via_decomposition(op, args, kwargs):
    decomposition = torch._decomp.decomposition_table.get(op)
    if decomposition is None:
        return NotImplemented
    modes.DECOMPOSED_COUNTS[str(op)] += 1
    return decomposition(*args, **kwargs)


def _to_cpu(value):
    if tpu_tensor.is_tpu(value):
        return tpu_tensor.to_cpu_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    return value


def _on_cpu(op, args, kwargs):
    """Run `op` on CPU copies, write mutated arguments back, move results to tpu."""
    modes.CPU_FALLBACK_COUNTS[str(op)] += 1
    if modes.CPU_FALLBACK_COUNTS[str(op)] == 1:
        warnings.warn(
            f"{op} has no tpu lowering and ran on CPU (called from {user_frame()}); "
            "see tpu_backend.cpu_fallback_counts()",
            stacklevel=2,
        )
    cpu_args, cpu_kwargs = _to_cpu(args), {k: _to_cpu(v) for k, v in kwargs.items()}
    if "device" in kwargs and kwargs["device"] is not None:
        cpu_kwargs["device"] = torch.device("cpu")
    result = op(*cpu_args, **cpu_kwargs)
    originals = _mutated_args(op, args, kwargs)
    for original, cpu_value in zip(originals, _mutated_args(op, cpu_args, cpu_kwargs)):
        write_result(original, tpu_tensor.cpu_to_jax(cpu_value))
    by_identity = {id(c): o for o, c in zip(originals, _mutated_args(op, cpu_args, cpu_kwargs))}

    def back(value):
        if isinstance(value, torch.Tensor):
            if id(value) in by_identity:
                return by_identity[id(value)]
            return tpu_tensor.wrap(tpu_tensor.cpu_to_jax(value))
        if isinstance(value, (list, tuple)):
            return type(value)(back(v) for v in value)
        return value

    return back(result)


def _fallback(op, *args, **kwargs):
    active = _active_ops()
    if op not in active:
        active.add(op)
        try:
            for attempt in (_via_functional, _via_decomposition):
                result = attempt(op, args, dict(kwargs))
                if result is not NotImplemented:
                    return result
        finally:
            active.discard(op)
    if modes._cpu_fallback:
        return _on_cpu(op, args, kwargs)
    raise TpuLoweringError(
        f"no tpu lowering for {op} (called from {user_frame()}). Add a JAX lowering in "
        "tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) "
        "(or TPU_CPU_FALLBACK=1)."
    )


_FALLBACK_LIB = None


def register_fallback() -> None:
    global _FALLBACK_LIB
    if _FALLBACK_LIB is None:
        _FALLBACK_LIB = torch.library.Library("_", "IMPL")
        _FALLBACK_LIB.fallback(_opaque_to_dynamo(_fallback), "PrivateUse1")
