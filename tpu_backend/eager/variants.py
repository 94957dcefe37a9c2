"""The in-place (`add_`), out (`add.out`) and functional overloads of an op, matched by schema."""

from __future__ import annotations

import jax
import torch

from tpu_backend import tensor as tpu_tensor

_INPLACE_NAMES = {"normal_functional": "normal_"}


def _packet_and_overload(op) -> tuple[str, str]:
    return op._schema.name.split("::")[1], op._overloadname


def _namespace(op):
    return getattr(torch.ops, op._schema.name.split("::")[0])


def _argument_signature(schema, skip_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not (skip_out and a.is_out)]


def _same_arguments_overload(packet, op, preferred: str):
    """The overload of `packet` with `op`'s argument names and types (by name first)."""
    if packet is None:
        return None
    wanted = _argument_signature(op._schema, False)
    names = packet.overloads()
    for name in sorted(names, key=lambda n: n != preferred):
        candidate = getattr(packet, name)
        if _argument_signature(candidate._schema, False) == wanted:
            return candidate
    return None


def inplace_variant(op):
    """`aten.add_.Tensor` for `aten.add.Tensor` (None when ATen has none)."""
    name, overload = _packet_and_overload(op)
    packet = getattr(_namespace(op), _INPLACE_NAMES.get(name, name + "_"), None)
    return _same_arguments_overload(packet, op, overload)


def out_variant(op):
    """`aten.add.out` for `aten.add.Tensor`: same non-out arguments, plus `out=` tensors."""
    name, _ = _packet_and_overload(op)
    packet = getattr(_namespace(op), name)
    wanted = _argument_signature(op._schema, False)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _argument_signature(schema, True) == wanted:
            return candidate
    return None


def functional_variant(op):
    """The functional overload an in-place or out op is a variant of (None if not found)."""
    name, overload = _packet_and_overload(op)
    schema = op._schema
    if any(a.is_out for a in schema.arguments):
        wanted = _argument_signature(schema, True)
        packet = getattr(_namespace(op), name, None)
        for candidate_name in packet.overloads() if packet else ():
            candidate = getattr(packet, candidate_name)
            args = candidate._schema.arguments
            if not any(a.is_out for a in args) and _argument_signature(candidate._schema, False) == wanted:
                return candidate
        return None
    if name.endswith("_"):
        base = {v: k for k, v in _INPLACE_NAMES.items()}.get(name, name[:-1])
        return _same_arguments_overload(getattr(_namespace(op), base, None), op, overload)
    return None


def _out_names(op) -> list[str]:
    return [a.name for a in op._schema.arguments if a.is_out]


def write_result(dst: torch.Tensor, value: jax.Array) -> None:
    """Write `value` into `dst`, resizing `dst` first when its shape differs (out= semantics)."""
    if tuple(dst.shape) != tuple(value.shape):
        tpu_tensor.resize_(dst, value.shape)
    tpu_tensor.write(dst, value)
