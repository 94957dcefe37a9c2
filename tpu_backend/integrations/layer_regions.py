"""generate()'s decoder layers traced once: each layer a nested compile region over tensors.

Dynamo traces a `torch.compiler.nested_compile_region` once and stamps the trace out for
every later call with the same inputs (torch's "subgraph reuse"), but only when those
inputs are tensors, constants and modules. A decoder layer is called with the cache
object (transformers' `StaticCache`), so marking the layer itself had every layer traced
again: on a v5e the first generate() of a 1B Llama spent 15.8 s in Dynamo against 8.2 s
unmarked (2026-12-06).

Here the marked layer's call hands the region its own static cache layer's tensors (keys,
values, length) instead of the cache, and the region wraps them in `_StaticLayerView`, a
`StaticLayer` whose `update` is transformers' own (the in-place writes at the cache's
length). Dynamo then traces one layer and stamps it out for the others (checking each
one's guards), AOTAutograd sees one subgraph, and the lowering inlines the calls: the
decode program is the one the unmarked layers give. The region's other tensors are copies
(a region refuses inputs that alias each other, as GPT-J's sin and cos do; XLA drops the
copies). A layer whose cache entry is anything else (a sliding window, a cache not yet
filled) or that is called another way runs as it is, traced in turn.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterable

import torch

_CACHE_ARGUMENTS = ("cache", "past_key_values")  # transformers 5's name, then 4's


def _static_layer_class() -> type:
    from transformers.cache_utils import StaticLayer

    return StaticLayer


@functools.cache
def _view_class() -> type:
    static_layer = _static_layer_class()

    class _StaticLayerView(static_layer):
        """A filled `StaticLayer` over the given tensors (made inside the region)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor):
            self.keys, self.values, self.cumulative_length = keys, values, length
            self.is_initialized, self.device = True, keys.device

    return _StaticLayerView


def _cache_index(block: torch.nn.Module) -> int | None:
    """The cache layer a block reads (its attention's `layer_idx`), or None."""
    return next((m.layer_idx for m in block.modules() if isinstance(getattr(m, "layer_idx", None), int)), None)


_LEAF_TYPES = (torch.Tensor, bool, int, float, str, type(None))


def _flat_layout(args: tuple, kwargs: dict) -> tuple[str, list] | None:
    """The call's arguments as flat leaves and a string that rebuilds them (Dynamo stamps a
    region out only for flat leaf arguments: a tensor, a number, a string, None): positional
    `#i` and keyword `name` entries, `/n` after those that are a tuple of n leaves. None when
    an argument is neither."""
    codes, flat = [], []
    for key, value in [(f"#{i}", v) for i, v in enumerate(args)] + list(kwargs.items()):
        if type(value) is tuple and all(isinstance(v, _LEAF_TYPES) for v in value):
            codes.append(f"{key}/{len(value)}")
            flat.extend(value)
        elif isinstance(value, _LEAF_TYPES):
            codes.append(key)
            flat.append(value)
        else:
            return None
    return "|".join(codes), flat


def _rebuilt(layout: str, flat: tuple) -> tuple[list, dict]:
    args, kwargs, at = [], {}, 0
    for code in layout.split("|") if layout else ():
        key, _, count = code.partition("/")
        if count:
            value, at = tuple(flat[at : at + int(count)]), at + int(count)
        else:
            value, at = flat[at], at + 1
        if key.startswith("#"):
            args.append(value)
        else:
            kwargs[key] = value
    return args, kwargs


@functools.cache
def _marked_class(cls: type) -> type:
    """`cls` whose calls with a filled static cache layer go through one region per class."""
    base_forward, static_layer, view = cls.forward, _static_layer_class(), _view_class()

    def body(layer, keys, values, length, cache_argument, layout, *flat):
        args, kwargs = _rebuilt(layout, flat)
        kwargs[cache_argument] = view(keys, values, length)
        return base_forward(layer, *args, **kwargs)

    region = torch.compiler.nested_compile_region(body)

    def forward(self, *args, **kwargs):
        name = next((n for n in _CACHE_ARGUMENTS if n in kwargs), None)
        layers = getattr(kwargs.get(name), "layers", None)
        entry = layers[self._cache_index] if layers is not None and self._cache_index < len(layers) else None
        if type(entry) is not static_layer or not entry.is_initialized or not torch.compiler.is_compiling():
            return base_forward(self, *args, **kwargs)
        flat = _flat_layout(args, {k: v for k, v in kwargs.items() if k != name})
        if flat is None:
            return base_forward(self, *args, **kwargs)
        layout, leaves = flat
        # A region refuses inputs that alias each other (GPT-J's sin and cos are views of one
        # tensor); the layer only reads them, and XLA drops the copies.
        leaves = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        return region(self, entry.keys, entry.values, entry.cumulative_length, name, layout, *leaves)

    # Named in this module's globals so that Dynamo's cached guards pickle it by reference
    # (as `scan._scanned_class` does; the name and qualified name must agree).
    name = "regions__" + f"{cls.__module__}__{cls.__qualname__}".replace(".", "_").replace("<", "_").replace(">", "_")
    marked = type(name, (cls,), {"forward": forward, "__module__": __name__, "_regions_base": cls})
    globals()[name] = marked
    return marked


@contextlib.contextmanager
def marked(blocks: Iterable[torch.nn.Module] | None):
    """The blocks (a model's decoder layers; None: nothing) as regions for the `with`."""
    changed = []
    try:
        _static_layer_class()
    except ImportError:  # a transformers without per-layer static caches: nothing to mark
        blocks = None
    for block in blocks or ():
        index = _cache_index(block)
        if index is None or "_regions_base" in type(block).__dict__:
            continue
        block._cache_index = index
        block.__class__ = _marked_class(type(block))
        changed.append(block)
    try:
        yield
    finally:
        for block in changed:
            block.__class__ = type(block)._regions_base
            del block._cache_index
