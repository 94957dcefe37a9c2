"""torch arguments -> (dynamic JAX values, hashable static template), and back.

`flatten_args` is defined here; on the compiled dispatch path (`tpu_backend/native`) the
name is bound to its C++ twin, which handles the common cases itself and calls `_tensor`
and `_flatten` below for the rest (`python_flatten_args` keeps the definition; the tests
compare the two)."""

from __future__ import annotations

import jax
import torch

from tpu_backend import native
from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager.errors import user_frame


class _Slot:
    """Placeholder for the i-th dynamic value (array or float) in a static template."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<dynamic {self.index}>"


class _ViewSlot:
    """Placeholder for a view of the i-th dynamic value (a storage array): the op's program
    gathers it (`tensor.read_deferred`). One instance per (index, geometry), so templates
    hash and compare by identity."""

    __slots__ = ("index", "geometry", "gather")

    def __init__(self, index: int, geometry: tuple):
        self.index, self.geometry = index, geometry
        self.gather = tpu_tensor.gather_fn(*geometry)

    def __repr__(self) -> str:
        return f"<view {self.geometry} of dynamic {self.index}>"


_SLOTS: list[_Slot] = [_Slot(i) for i in range(256)]
_VIEW_SLOTS: dict[tuple, _ViewSlot] = {}
_PAYLOADS = tpu_tensor._PAYLOADS
_read_deferred = tpu_tensor.read_deferred


def _view_slot(index: int, geometry: tuple) -> _ViewSlot:
    key = (index, geometry)
    found = _VIEW_SLOTS.get(key)
    if found is None:
        found = _VIEW_SLOTS[key] = _ViewSlot(index, geometry)
    return found


def _tensor(value: torch.Tensor, dynamic: list, defer_views: bool):
    """A tensor argument: its array appended to `dynamic`; its slot in the template."""
    payload = _PAYLOADS.get(value.untyped_storage()._cdata)
    if payload is None:
        dynamic.append(_non_tpu_tensor(value))
        return _slot(len(dynamic) - 1)
    if not defer_views:
        dynamic.append(tpu_tensor.read(value, payload))
        return _slot(len(dynamic) - 1)
    array, geometry = _read_deferred(value, payload)
    dynamic.append(array)
    return _slot(len(dynamic) - 1) if geometry is None else _view_slot(len(dynamic) - 1, geometry)


def _slot(index: int) -> _Slot:
    try:
        return _SLOTS[index]
    except IndexError:
        while len(_SLOTS) <= index:
            _SLOTS.append(_Slot(len(_SLOTS)))
        return _SLOTS[index]


def _non_tpu_tensor(value: torch.Tensor):
    if value.dim() == 0:  # CPU scalar tensors mix with device tensors, as on CUDA
        return tpu_tensor.cpu_to_jax(value)
    raise RuntimeError(  # PyTorch's words (CUDA's), then where and what to do
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and "
        f"{value.device}! (a {value.device} tensor of shape {tuple(value.shape)}, called from {user_frame()}; "
        "move it with .to('tpu'))"
    )


def _flatten(value, dynamic: list, dynamic_floats: bool, defer_views: bool):
    # Checked in order of frequency: this runs for every argument of every op.
    if isinstance(value, torch.Tensor):
        return _tensor(value, dynamic, defer_views)
    kind = type(value)
    if kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not dynamic_floats:
            return value
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if kind is list or kind is tuple or isinstance(value, (list, tuple)):  # lists of tensors, torch.Size
        return tuple([_flatten(v, dynamic, dynamic_floats, defer_views) for v in value])
    if isinstance(value, jax.Array):  # e.g. the rng key
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if isinstance(value, torch.Generator):
        return None  # device randomness comes from tpu_backend.random's key stream
    return value


def flatten_args(args, kwargs, dynamic_floats: bool = True, defer_views: bool = True):
    """Split torch arguments into (dynamic values, hashable static template of args, kwargs).

    `defer_views`: a tensor that is a view of its storage enters as the storage's array
    and a `_ViewSlot` (the op's program gathers it); otherwise as the view's own value."""
    dynamic: list = []
    template = []
    for value in args:  # the common arguments inline (tensors, ints): no call per argument
        if isinstance(value, torch.Tensor):
            template.append(_tensor(value, dynamic, defer_views))
        elif type(value) is int or value is None:
            template.append(value)
        else:
            template.append(_flatten(value, dynamic, dynamic_floats, defer_views))
    template_kwargs = (
        tuple([(k, _flatten(v, dynamic, dynamic_floats, defer_views)) for k, v in kwargs.items()]) if kwargs else ()
    )
    return dynamic, tuple(template), template_kwargs


python_flatten_args = flatten_args  # the definition; the compiled path must agree with it
_native = native.load()
if _native is not None:  # the same function in C++: the common cases there, the rest calls the above
    _native.configure(_PAYLOADS, _SLOTS, _slot, _tensor, _flatten)
    flatten_args = _native.flatten_args  # noqa: F811


def _fill(template, dynamic):
    if type(template) is _Slot:
        return dynamic[template.index]
    if type(template) is _ViewSlot:
        return template.gather(dynamic[template.index])
    if type(template) is tuple:
        return [_fill(t, dynamic) for t in template]
    return template


def fill_template(template_args, template_kwargs, dynamic):
    """Inverse of `flatten_args`: the lowering's arguments with dynamic values put back."""
    args = [_fill(t, dynamic) for t in template_args]
    kwargs = {k: _fill(t, dynamic) for k, t in template_kwargs}
    return args, kwargs
