"""`module.to("tpu")` keeps each Parameter the object it was (and tied weights tied).

`nn.Module._apply` moves a parameter by `param.data = moved` only when the two tensors
have "compatible shallow-copy types"; PyTorch's C++ check says a CPU and a PrivateUse1
tensor are not, so each module gets a *new* Parameter. Two things then went silently
wrong: an optimizer built before `model.to("tpu")` kept stepping the CPU originals (the
model trained nothing), and a weight shared by two modules (embedding and LM head) became
two (seen: 26 -> 28 parameters, losses drifting from step 2). We wrap the outermost
`_apply`: each moved parameter is swapped back into the original Parameter object
(`torch.utils.swap_tensors`, as `torch.__future__.set_swap_module_params_on_conversion`
does on other devices), and every slot that held it holds it again. Where a swap is
refused (another reference holds the tensor's C++ object, e.g. an autograd graph still
alive), the moved copy stays a new Parameter, shared by every slot of the old one.
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
    before = {}
    if outermost:
        before = {k: (slots[0][0]._parameters[slots[0][1]], slots) for k, slots in _parameter_slots(self).items()}
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        result = _original_apply(self, fn, recurse)
    finally:
        _depth.value -= 1
    for original, slots in before.values():
        first_owner, first_name = slots[0]
        kept = _keep_identity(original, first_owner._parameters[first_name])
        for owner, name in slots:
            owner._parameters[name] = kept
    return result


def _keep_identity(original: torch.nn.Parameter, moved: torch.nn.Parameter) -> torch.nn.Parameter:
    """`original` now holding `moved`'s tensor when PyTorch made a new Parameter, else `moved`."""
    if moved is original or type(moved) is not type(original):
        return moved
    try:
        torch.utils.swap_tensors(original, moved)
    except RuntimeError:
        return moved
    return original


def install() -> None:
    torch.nn.Module._apply = _apply
