"""`module.to("tpu")` keeps tied weights tied.

`nn.Module._apply` moves a parameter by `param.data = moved` only when the two tensors
have "compatible shallow-copy types"; PyTorch's C++ check says a CPU and a PrivateUse1
tensor are not, so each module gets a *new* Parameter and a weight shared by two modules
(embedding and LM head) silently becomes two (seen: 26 -> 28 parameters, losses drifting
from step 2). We wrap the outermost `_apply`: parameters that were one object before the
move are made one object again after it (the first moved copy is shared).
"""

from __future__ import annotations

import threading

import torch

_original_apply = torch.nn.Module._apply
_depth = threading.local()


def _parameter_slots(module: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(parameter) -> every (module, name) that holds it."""
    slots: dict[int, list] = {}
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None:
                slots.setdefault(id(param), []).append((owner, name))
    return slots


def _apply(self, fn, recurse=True):
    outermost = getattr(_depth, "value", 0) == 0
    shared = {}
    if outermost:
        shared = {k: v for k, v in _parameter_slots(self).items() if len(v) > 1}
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        result = _original_apply(self, fn, recurse)
    finally:
        _depth.value -= 1
    for slots in shared.values():
        first_owner, first_name = slots[0]
        moved = first_owner._parameters[first_name]
        for owner, name in slots[1:]:
            owner._parameters[name] = moved
    return result


def install() -> None:
    torch.nn.Module._apply = _apply
