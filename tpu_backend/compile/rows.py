"""Per-layer values kept as the rows of one stacked array between programs.

A scanned forward (`scan.py`) stacks the layers' weights into (layers, ...) arrays and
computes every layer's input as the scan's stacked output; the backward's scan needs the
same stacks again. Returned as per-layer arrays, each stack was sliced apart by the
forward and built again by the backward (at 374M on a v5e, ~5 ms of a 218 ms step:
docs/tpu.md). Kept as rows instead:

- While a program is traced, `note(value, base, k)` records that traced `value` is row
  `k` of traced `base` (`scan.Run.evaluate`: each stacked operand's inputs, each per-layer
  output of the scan). `run_of(values)` finds consecutive rows of one base, so the
  scan reads the base instead of stacking them.
- A forward program (`Program(rows_as_views=True)`) returns a noted row as its base
  once (`Row` at run time): `CompiledGraph` makes the per-layer tensors over one storage
  whose payload is the base.
- A program called with such tensors (`stacked_view`, `take_rows`) takes the base itself,
  in a variant traced for that layout (`RowLayout`), whose rows are noted again.

Nothing depends on a row being found: a value not noted is stacked or sliced as before.
"""

from __future__ import annotations

import threading

import jax
import torch

from tpu_backend import tensor as device_tensor

try:
    from jax._src.array import ArrayImpl
except ImportError:  # pragma: no cover
    ArrayImpl = ()

_traced = threading.local()  # programs are traced on compile-ahead threads too


def _notes() -> dict:
    notes = getattr(_traced, "notes", None)
    if notes is None:
        notes = _traced.notes = {}
    return notes


def forget() -> None:
    """Forget the rows noted on this thread (before and after each trace: the notes hold
    the traced values)."""
    _traced.notes = {}


def note(value, base, k: int) -> None:
    _notes()[id(value)] = (value, base, k)  # the value is held: its id stays its own


def row_of(value) -> tuple | None:
    """(base, k) when `value` was noted as row `k` of `base` in this trace."""
    found = _notes().get(id(value))
    return found[1:] if found is not None and found[0] is value else None


def run_of(values) -> tuple | None:
    """(base, first row, step) when `values` are rows first, first + step, ... (step 1 or
    -1) of one base; else None."""
    found = [row_of(v) for v in values]
    if any(f is None for f in found) or any(f[0] is not found[0][0] for f in found):
        return None
    base, first = found[0]
    step = found[1][1] - first if len(found) > 1 else 1
    if step not in (1, -1) or any(f[1] != first + step * i for i, f in enumerate(found)):
        return None
    return base, first, step


class Row:
    """A program output that is row `index` of the stacked array `base` (made a view of
    one storage shared by the rows: `CompiledGraph`)."""

    __slots__ = ("base", "index")

    def __init__(self, base, index: int):
        self.base, self.index = base, index


# --------------------------------------------------------------------- inputs that are rows


def stacked_view(arg) -> tuple | None:
    """(storage array, k) when tpu tensor `arg` is exactly row `k` of its storage's array
    (a contiguous view with one leading dimension more, as `Row` outputs are)."""
    payload = device_tensor.payload_if_tpu(arg) if isinstance(arg, torch.Tensor) else None
    if payload is None:
        return None
    base = payload.array
    if type(base) is not ArrayImpl or base.ndim != arg.dim() + 1 or payload.dtype is not arg.dtype:
        return None
    numel = arg.numel()
    offset = arg.storage_offset()
    if base.shape[1:] != arg.shape or numel == 0 or offset % numel or not arg.is_contiguous():
        return None
    if arg.is_neg() or arg.is_conj():
        return None
    return base, offset // numel


def take_rows(values: list, positions, args: list, read) -> tuple[tuple, list]:
    """(layout, bases) of the `Row`s among `values` (inputs read with `stacked_view`) at
    `positions`, which are removed from `values`; a `Row` elsewhere is read (`read(arg)`).
    layout is ((position, base ordinal, k), ...), bases the arrays in first-seen order."""
    layout, bases, ordinal = [], [], {}
    candidates = set(positions)
    for p, value in enumerate(values):
        if type(value) is not Row:
            continue
        if p not in candidates:
            values[p] = read(args[p])
            continue
        b = ordinal.setdefault(id(value.base), len(bases))
        if b == len(bases):
            bases.append(value.base)
        layout.append((p, b, value.index))
    if layout:
        taken = {p for p, _, _ in layout}
        values[:] = [v for p, v in enumerate(values) if p not in taken]
    return tuple(layout), bases


class RowLayout:
    """A graph function called with some of its inputs passed as rows of stacked arrays:
    `fn(*plain, *bases)` (after the random key, if any), `layout` as `take_rows` gives."""

    def __init__(self, fn, n_inputs: int, layout: tuple):
        self.fn, self.n_inputs, self.layout = fn, n_inputs, layout
        self.rows = {p: (b, k) for p, b, k in layout}
        self.n_plain = n_inputs - len(self.rows)
        self.needs_rng = fn.needs_rng

    def __call__(self, *args):
        key, args = (args[:1], args[1:]) if self.needs_rng else ((), args)
        plain, bases = iter(args[: self.n_plain]), args[self.n_plain :]
        inputs = []
        for p in range(self.n_inputs):
            if p in self.rows:
                b, k = self.rows[p]
                value = jax.lax.index_in_dim(bases[b], k, keepdims=False)
                note(value, bases[b], k)
                inputs.append(value)
            else:
                inputs.append(next(plain))
        return self.fn(*key, *inputs)


__all__ = ["Row", "RowLayout", "note", "row_of", "run_of", "forget", "stacked_view", "take_rows"]
