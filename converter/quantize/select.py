"""Mixed precision: which ops a config keeps in float.

`keep_float` entries are TFLite op types ("SOFTMAX") or nn.Module paths as
`named_modules()` spells them ("encoder.layers.0.attn"); a path covers the module's
children too. "=path" names the module's own ops only (not its children's), and
"(model)" the ops of the top-level forward: the units `quantize.auto` chooses, so that
its reported list pins exactly what it measured. Ops learn their module path during
lowering (`ir.Op.module`, from torch.export's `nn_module_stack`).
"""

from __future__ import annotations

import difflib

import torch

from converter import ir

ROOT = "(model)"  # ops of the top-level forward (no submodule)
OWN = "="  # prefix: a layer's own ops, without its children's


def layer_of(op: ir.Op) -> str:
    """The innermost layer an op belongs to (ROOT for the top-level forward)."""
    return op.module or ROOT


def pinned(layer: str, modules_with_ops: set[str]) -> str:
    """The keep_float entry that keeps exactly `layer`'s own ops: the bare name where no
    child of the layer has ops of its own, "=name" otherwise."""
    if layer == ROOT or not any(m.startswith(layer + ".") for m in modules_with_ops):
        return layer
    return OWN + layer


def keeps_float(op: ir.Op, keep_float) -> bool:
    """True when `op` must stay in float32 under `keep_float` (names and op types, or a
    predicate op -> bool, which the sensitivity analysis uses)."""
    if callable(keep_float):
        return bool(keep_float(op))
    if not keep_float:
        return False
    if op.opcode in keep_float:
        return True
    module = op.module
    if module is None:
        return ROOT in keep_float
    return OWN + module in keep_float or any(module == name or module.startswith(name + ".") for name in keep_float)


def check_keep_float(keep_float, modules: list[torch.nn.Module]) -> None:
    """Raise ValueError naming each entry that is neither a TFLite op type nor a layer
    of any of `modules`, with the closest names."""
    from converter.writer import BUILTIN_CODES

    layers = {name for m in modules for name, _ in m.named_modules() if name}
    for name in keep_float:
        if not isinstance(name, str):
            raise TypeError(f"keep_float entries must be strings (layer names or op types), got {name!r}")
        if name in BUILTIN_CODES or name == ROOT or name.removeprefix(OWN) in layers:
            continue
        close = difflib.get_close_matches(name, sorted(layers | set(BUILTIN_CODES)), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"keep_float: {name!r} is neither a layer of the model (a name from "
            f"model.named_modules(), e.g. {sorted(layers)[:3]}; '=name' for its own ops only, "
            f"'{ROOT}' for the top-level forward's) nor a TFLite op type (e.g. 'SOFTMAX', 'CONV_2D'){hint}"
        )
