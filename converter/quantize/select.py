"""Mixed precision: which ops a config keeps in float.

`keep_float` entries are TFLite op types ("SOFTMAX") or nn.Module paths as
`named_modules()` spells them ("encoder.layers.0.attn"); a path covers the module's
children too. Ops learn their module path during lowering (`ir.Op.module`, from
torch.export's `nn_module_stack`).
"""

from __future__ import annotations

import difflib

import torch

from converter import ir


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
        return False
    return any(module == name or module.startswith(name + ".") for name in keep_float)


def check_keep_float(keep_float, modules: list[torch.nn.Module]) -> None:
    """Raise ValueError naming each entry that is neither a TFLite op type nor a layer
    of any of `modules`, with the closest names."""
    from converter.writer import BUILTIN_CODES

    layers = {name for m in modules for name, _ in m.named_modules() if name}
    for name in keep_float:
        if not isinstance(name, str):
            raise TypeError(f"keep_float entries must be strings (layer names or op types), got {name!r}")
        if name in BUILTIN_CODES or name in layers:
            continue
        close = difflib.get_close_matches(name, sorted(layers | set(BUILTIN_CODES)), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"keep_float: {name!r} is neither a layer of the model (a name from "
            f"model.named_modules(), e.g. {sorted(layers)[:3]}) nor a TFLite op type "
            f"(e.g. 'SOFTMAX', 'CONV_2D'){hint}"
        )
