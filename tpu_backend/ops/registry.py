"""The ONE ATen -> JAX lowering table, shared by every execution mode.

Strict eager, debug eager, fused eager and `torch.compile(backend="tpu")` all look ops
up here; parity between modes is structural. Everything the device knows about an op is
in its `Lowering` record, written by one decorator in the op's family file:

    @lowers(aten.nonzero.default, data_dependent=True)
    def nonzero(x): ...

A lowering is a plain function of JAX values:
- tensor arguments arrive as `jax.Array`s (lists of tensors as lists of arrays);
  everything else (ints, floats, bools, `torch.dtype`, `torch.memory_format`, None)
  arrives as is; use `jax_dtype()` for dtypes;
- it returns a `jax.Array`, or a tuple of them for multi-output ops, with the shape and
  dtype that ATen's meta function gives;
- it must be traceable by `jax.jit` with the non-tensor arguments static (no Python
  control flow on array values).

The record's other fields (keyword arguments of `lowers`):
- `kind`: "op" (the default: an eager kernel is registered on the device), "view" (the
  functional meaning of a view op, used where views have value semantics: compiled and
  fused graphs; eager views are storage views, `tpu_backend/tensor.py`) or "graph"
  (prims and size queries that only reach compiled graphs, `compile/prims.py`);
- `needs_rng`: the lowering draws random numbers and receives a `key=` keyword argument
  holding a `jax.random` key;
- `data_dependent`: the output shape depends on tensor values (nonzero, unique): the
  lowering reads its inputs on the host, so eager mode calls it outside `jax.jit`;
  `data_dependent_when=predicate(args, kwargs)`: only for some arguments (a bool mask);
- `functionalized`: the op mutates an input besides `self`/`out` (batch norm's running
  statistics); a `Functionalized` names the functional op to run and what to write back.

Register the functional overload only: in-place (`add_`) and `.out` variants are
derived by the dispatcher, which computes the functional result and writes it back.
A lowering registered after `import tpu_backend` is connected to the device at once
(listeners in `_ON_REGISTER`), so there is no re-registration step.

`JAX_LOWERINGS`, `VIEW_LOWERINGS` and `GRAPH_LOWERINGS` are live views of `LOWERINGS`
filtered by kind (assigning to one registers a record of that kind); `DATA_DEPENDENT`,
`DATA_DEPENDENT_WHEN` and `FUNCTIONALIZED` are read-only views of the record fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping, Set
from dataclasses import dataclass, field
from typing import Callable, Iterator

import jax.numpy as jnp
import numpy as np
import torch

KINDS = ("op", "view", "graph")


@dataclass(frozen=True)
class Functionalized:
    """How to run a mutating ATen op through a functional lowering.

    Call `functional`'s lowering with the op's arguments; for each (arg_index,
    output_index) in `writes`, write that output into the argument (skip when the
    argument is None); return the first `outputs` outputs.

    `per_tensor`: the positions of tensor lists whose elements the lowering updates each
    on its own (the fused optimizers). Strict mode then runs one call per element, so the
    chip compiles one small program per distinct shape instead of one over the whole list
    (`tpu_backend/eager/registration.py`, `_functionalized_kernel`).
    """

    functional: object
    writes: dict = field(default_factory=dict)
    outputs: int = 1
    per_tensor: tuple = ()


@dataclass(frozen=True)
class Lowering:
    """Everything the device knows about one ATen overload (see the module docstring)."""

    fn: Callable
    needs_rng: bool = False
    kind: str = "op"
    data_dependent: bool = False
    data_dependent_when: Callable | None = None  # (args, kwargs) -> bool
    functionalized: Functionalized | None = None

    def runs_on_host(self, args, kwargs) -> bool:
        """Whether this call must run eagerly on host values (its output shape depends on them)."""
        return self.data_dependent or (self.data_dependent_when is not None and self.data_dependent_when(args, kwargs))


# The one table: ATen/prims overload -> its record.
LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}
# Called with (target, lowering) for every registration after they are appended (the
# eager dispatcher connects late registrations to the device this way).
_ON_REGISTER: list[Callable] = []
# Field updates for targets marked before their lowering is registered (`mark`).
_PENDING: dict = {}


def register(target, lowering: Lowering) -> None:
    """Add `lowering` for `target` to the table; a target is lowered once."""
    if lowering.kind not in KINDS:
        raise ValueError(f"{target}: kind must be one of {KINDS}, got {lowering.kind!r}")
    if target in LOWERINGS:
        raise ValueError(f"{target} is lowered twice: {LOWERINGS[target].fn.__name__} and {lowering.fn.__name__}")
    if target in _PENDING:
        lowering = dataclasses.replace(lowering, **_PENDING.pop(target))
    LOWERINGS[target] = lowering
    for listener in list(_ON_REGISTER):
        listener(target, lowering)


def on_register(listener: Callable) -> None:
    """Call `listener(target, lowering)` for every lowering registered from now on."""
    if listener not in _ON_REGISTER:
        _ON_REGISTER.append(listener)


def mark(target, **fields) -> None:
    """Set record fields (`data_dependent=True`...) of `target`, registered or not yet."""
    if target in LOWERINGS:
        LOWERINGS[target] = dataclasses.replace(LOWERINGS[target], **fields)
    else:
        _PENDING.setdefault(target, {}).update(fields)


def lowers(
    *targets: torch._ops.OpOverload,
    needs_rng: bool = False,
    kind: str = "op",
    data_dependent: bool = False,
    data_dependent_when: Callable | None = None,
    functionalized: Functionalized | None = None,
) -> Callable:
    """Register the decorated function as the JAX lowering of each ATen overload."""

    def decorate(fn: Callable) -> Callable:
        for target in targets:
            register(
                target,
                Lowering(fn, needs_rng, kind, data_dependent, data_dependent_when, functionalized),
            )
        return fn

    return decorate


def lowering_for(target) -> Lowering | None:
    """The record of an ATen/prims overload (any kind), or None."""
    return LOWERINGS.get(target)


class _KindView(MutableMapping):
    """`LOWERINGS` restricted to one kind, as a dict (assignment registers)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __getitem__(self, target) -> Lowering:
        lowering = LOWERINGS[target]
        if lowering.kind != self.kind:
            raise KeyError(target)
        return lowering

    def __setitem__(self, target, lowering: Lowering) -> None:
        register(target, dataclasses.replace(lowering, kind=self.kind))

    def __delitem__(self, target) -> None:
        self[target]  # KeyError unless it is of this kind
        del LOWERINGS[target]

    def __iter__(self) -> Iterator:
        return iter([t for t, lowering in LOWERINGS.items() if lowering.kind == self.kind])

    def __len__(self) -> int:
        return sum(1 for lowering in LOWERINGS.values() if lowering.kind == self.kind)

    def __contains__(self, target) -> bool:
        lowering = LOWERINGS.get(target)
        return lowering is not None and lowering.kind == self.kind

    def __repr__(self) -> str:
        return f"<{len(self)} {self.kind} lowerings>"


class _FieldView(Mapping):
    """Targets whose record has `field` set, mapped to its value (read-only)."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, target):
        value = getattr(LOWERINGS[target], self.name) if target in LOWERINGS else None
        if not value:
            raise KeyError(target)
        return value

    def __iter__(self) -> Iterator:
        return iter([t for t, lowering in LOWERINGS.items() if getattr(lowering, self.name)])

    def __len__(self) -> int:
        return sum(1 for lowering in LOWERINGS.values() if getattr(lowering, self.name))


class _MarkedSet(Set):
    """Targets whose record has the boolean field set (read-only)."""

    def __init__(self, name: str):
        self.name = name

    def __contains__(self, target) -> bool:
        lowering = LOWERINGS.get(target)
        return lowering is not None and bool(getattr(lowering, self.name))

    def __iter__(self) -> Iterator:
        return iter([t for t, lowering in LOWERINGS.items() if getattr(lowering, self.name)])

    def __len__(self) -> int:
        return sum(1 for lowering in LOWERINGS.values() if getattr(lowering, self.name))


JAX_LOWERINGS: MutableMapping = _KindView("op")
VIEW_LOWERINGS: MutableMapping = _KindView("view")
GRAPH_LOWERINGS: MutableMapping = _KindView("graph")
DATA_DEPENDENT: Set = _MarkedSet("data_dependent")
DATA_DEPENDENT_WHEN: Mapping = _FieldView("data_dependent_when")
FUNCTIONALIZED: Mapping = _FieldView("functionalized")


_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint64: jnp.uint64,  # hash_tensor's result
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}


def jax_dtype(dtype: torch.dtype | None):
    """The JAX dtype for a torch dtype (None stays None)."""
    if dtype is None:
        return None
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the tpu device") from None


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype for a JAX/numpy dtype."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"a {np.dtype(dtype).name} result cannot be held on the tpu device (complex64 is its widest "
            "complex dtype): compute in float32/complex64, or on CPU (x.cpu())"
        ) from None
