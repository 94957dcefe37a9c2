"""The ATen -> TFLite lowering registry: one small function per ATen op.

A lowering function is registered with `@lowers(aten.op.overload, ...)` and called as
`fn(ctx, *args, **kwargs)` with the node's arguments where every fx Node became an IR
`Tensor` (lists of nodes became lists of Tensors) and everything else is left as is.
It emits TFLite ops through `ctx` (see `context.LoweringContext`) and returns the
Tensor (or tuple of Tensors) that stands for the node's value.

Family files (`pointwise.py`, `conv.py`, ...) hold the functions; importing
`converter.lowering` registers them all. Nothing else needs to know the table.
"""

from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict[object, Callable] = {}


def lowers(*targets) -> Callable:
    """Register the decorated function as the lowering of each ATen op in `targets`
    (an OpOverload such as `aten.add.Tensor`, or a packet such as `aten.add` for all
    overloads)."""

    def register(fn: Callable) -> Callable:
        for target in targets:
            if target in LOWERINGS:
                raise ValueError(f"{target} is lowered twice: {LOWERINGS[target].__name__} and {fn.__name__}")
            LOWERINGS[target] = fn
        return fn

    return register


def find_lowering(target) -> Callable | None:
    """The lowering for an OpOverload: its own entry, else its packet's."""
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn
