"""torch arguments -> (dynamic JAX values, hashable static template), and back."""

from __future__ import annotations

import jax
import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager.errors import user_frame


class _Slot:
    """Placeholder for the i-th dynamic value (array or float) in a static template."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<dynamic {self.index}>"


_SLOTS: list[_Slot] = [_Slot(i) for i in range(256)]
_PAYLOADS = tpu_tensor._PAYLOADS
_read = tpu_tensor.read


def _slot(index: int) -> _Slot:
    while len(_SLOTS) <= index:
        _SLOTS.append(_Slot(len(_SLOTS)))
    return _SLOTS[index]


def _non_tpu_tensor(value: torch.Tensor):
    if value.dim() == 0:  # CPU scalar tensors mix with device tensors, as on CUDA
        return tpu_tensor.cpu_to_jax(value)
    raise RuntimeError(
        f"expected all tensors on tpu, got a {value.device} tensor of shape {tuple(value.shape)} "
        f"(called from {user_frame()}); move it with .to('tpu')"
    )


def _flatten(value, dynamic: list, dynamic_floats: bool):
    # Checked in order of frequency: this runs for every argument of every op.
    if isinstance(value, torch.Tensor):
        payload = _PAYLOADS.get(value.untyped_storage()._cdata)
        dynamic.append(_non_tpu_tensor(value) if payload is None else _read(value, payload))
        return _slot(len(dynamic) - 1)
    kind = type(value)
    if kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not dynamic_floats:
            return value
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if kind is list or kind is tuple:
        return tuple([_flatten(v, dynamic, dynamic_floats) for v in value])
    if isinstance(value, jax.Array):  # e.g. the rng key
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if isinstance(value, (list, tuple)):  # e.g. torch.Size
        return tuple([_flatten(v, dynamic, dynamic_floats) for v in value])
    if isinstance(value, torch.Generator):
        return None  # device randomness comes from tpu_backend.random's key stream
    return value


def flatten_args(args, kwargs, dynamic_floats: bool = True):
    """Split torch arguments into (dynamic values, hashable static template of args, kwargs)."""
    dynamic: list = []
    template = []
    for value in args:  # the common arguments inline (tensors, ints): no call per argument
        if isinstance(value, torch.Tensor):
            payload = _PAYLOADS.get(value.untyped_storage()._cdata)
            dynamic.append(_non_tpu_tensor(value) if payload is None else _read(value, payload))
            template.append(_SLOTS[len(dynamic) - 1] if len(dynamic) <= 256 else _slot(len(dynamic) - 1))
        elif type(value) is int or value is None:
            template.append(value)
        else:
            template.append(_flatten(value, dynamic, dynamic_floats))
    template_kwargs = tuple([(k, _flatten(v, dynamic, dynamic_floats)) for k, v in kwargs.items()]) if kwargs else ()
    return dynamic, tuple(template), template_kwargs


def _fill(template, dynamic):
    if type(template) is _Slot:
        return dynamic[template.index]
    if type(template) is tuple:
        return [_fill(t, dynamic) for t in template]
    return template


def fill_template(template_args, template_kwargs, dynamic):
    """Inverse of `flatten_args`: the lowering's arguments with dynamic values put back."""
    args = [_fill(t, dynamic) for t in template_args]
    kwargs = {k: _fill(t, dynamic) for k, t in template_kwargs}
    return args, kwargs
