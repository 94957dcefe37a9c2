"""Small graph-editing helpers shared by the passes (not a pass themselves).

Passes never mutate a `Tensor` that may be shared (constant data, shapes): they create
new tensors and rewire ops, so an op list snapshot is enough to undo a rewrite.
"""

from __future__ import annotations

import itertools

import numpy as np

from common.tflite_schema import ACTIVATION_NAMES, SIDE_EFFECT_OPS  # noqa: F401 (re-exported to passes)
from converter.ir import Graph, Op, Tensor

_fresh = itertools.count()

# SIDE_EFFECT_OPS (never removed, folded or merged): common.tflite_schema.


def fresh_name(base: str) -> str:
    """A tensor name not produced by lowering (the writer keeps names unique anyway)."""
    return f"{base}__{next(_fresh)}"


def const(value, name: str, dtype=None) -> Tensor:
    """A new constant tensor holding `value`."""
    data = np.array(value, dtype=dtype, order="C")  # ascontiguousarray would make 0-d arrays 1-d
    return Tensor(fresh_name(name), data.shape, data.dtype, data=data)


def int32_const(values, name: str) -> Tensor:
    return const(np.asarray(values, dtype=np.int32), name)


def activation(op: Op) -> str:
    """The op's fused activation as a schema name ("NONE" when absent). Lowering may
    write the enum's name or its integer; both are accepted."""
    value = op.options.get("fusedActivationFunction", "NONE")
    if value is None:
        return "NONE"
    if isinstance(value, str):
        return value
    return ACTIVATION_NAMES.get(int(value), str(value))


def shape_signature(t: Tensor) -> tuple[int, ...]:
    """The tensor's shape with -1 for dynamic dimensions."""
    return t.shape_signature if t.shape_signature is not None else t.shape


def static_dims(t: Tensor) -> tuple[int | None, ...]:
    """Per dimension: its size when static, None when dynamic."""
    return tuple(None if s == -1 else d for d, s in zip(t.shape, shape_signature(t)))


def transpose_perm(op: Op) -> list[int] | None:
    """The constant permutation of a TRANSPOSE op (None if it is computed at run time)."""
    p = op.inputs[1] if len(op.inputs) > 1 else None
    if p is None or not p.is_const:
        return None
    return np.asarray(p.data).reshape(-1).tolist()


class Uses:
    """Producer/reader index of a graph.

    Passes that edit through `set_input`, `set_output`, `add`, `remove` and `bypass`
    keep it exact without rebuilding it (`refresh`) after every edit; rebuilding costs
    a walk over the whole graph, which made rewrite-heavy passes quadratic. The readers
    of a tensor, one entry per input slot in the order they were indexed, are kept as
    its first reader plus a list of the others (most tensors have one reader: no list).
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.removed: set[Op] = set()  # (the ops, not their ids: a freed op's id is reused)
        self.refresh()

    def refresh(self) -> None:
        self.producer = self.graph.producers()
        self.first_reader: dict[int, Op] = {}
        self.more_readers: dict[int, list[Op]] = {}
        for op in self.graph.ops:
            self._add_reader(op)
        self.output_ids = {t.id for t in self.graph.outputs}

    def resync(self) -> None:
        """Put each tensor's readers back in graph order, as `refresh` lists them (edits
        append a new reader last): passes visiting readers in that order stay
        deterministic, at the cost of sorting only the tensors with several readers."""
        position = {op: i for i, op in enumerate(self.graph.ops)}
        for key, more in self.more_readers.items():
            readers = sorted([self.first_reader[key], *more], key=position.__getitem__)
            self.first_reader[key] = readers[0]
            more[:] = readers[1:]

    # ---- queries ---------------------------------------------------------------------
    def consumers(self, t: Tensor) -> list[Op]:
        """Distinct ops reading `t`."""
        first = self.first_reader.get(t.id)
        if first is None:
            return []
        out = [first]
        for op in self.more_readers.get(t.id, ()):
            if not any(op is seen for seen in out):
                out.append(op)
        return out

    def is_output(self, t: Tensor) -> bool:
        return t.id in self.output_ids

    def only_consumer(self, t: Tensor) -> Op | None:
        """The single op reading `t`, if `t` has exactly one reader and is no graph output."""
        ops = self.consumers(t)
        if len(ops) != 1 or self.is_output(t):
            return None
        return ops[0]

    def produced_by(self, t: Tensor | None, opcode: str) -> Op | None:
        if t is None:
            return None
        op = self.producer.get(t.id)
        return op if op is not None and op.opcode == opcode else None

    def is_live(self, op: Op) -> bool:
        """False once `remove`d (or bypassed) through this index."""
        return op not in self.removed

    # ---- edits that keep the index exact ---------------------------------------------------
    def set_input(self, op: Op, index: int, t: Tensor | None) -> None:
        old = op.inputs[index]
        if old is not None:
            self._drop_reader(old, op)
        op.inputs[index] = t
        if t is not None:
            self._append_reader(t.id, op)

    def set_output(self, op: Op, index: int, t: Tensor) -> None:
        old = op.outputs[index]
        if self.producer.get(old.id) is op:
            del self.producer[old.id]
        op.outputs[index] = t
        self.producer[t.id] = op

    def add(self, op: Op) -> None:
        """Index a new op (the caller puts it into `graph.ops`)."""
        self._add_reader(op)
        for t in op.outputs:
            self.producer[t.id] = op

    def remove(self, op: Op) -> None:
        """Take `op` out of the graph and the index."""
        for t in op.inputs:
            if t is not None:
                self._drop_reader(t, op)
        for t in op.outputs:
            if self.producer.get(t.id) is op:
                del self.producer[t.id]
        self.removed.add(op)
        try:
            self.graph.ops.remove(op)  # by identity (Op has eq=False): a C-level scan, not a rebuilt list
        except ValueError:
            pass

    def replace_reads(self, old: Tensor, new: Tensor) -> None:
        """Make every op reading `old` read `new` instead (graph outputs stay)."""
        for reader in self.consumers(old):
            for i, t in enumerate(reader.inputs):
                if t is old:
                    self.set_input(reader, i, new)

    def bypass(self, op: Op, replacement: Tensor) -> bool:
        """Remove the single-output `op`, making its readers read `replacement` instead.

        A graph output is re-pointed too, unless that would make a graph input (or another
        graph output) a graph output a second time: then the op stays and False is returned.
        """
        out = op.outputs[0]
        if not _may_replace_output(self.graph, out, replacement):
            return False
        self.replace_reads(out, replacement)
        if self.is_output(out):
            self.graph.outputs = [replacement if t is out else t for t in self.graph.outputs]
            self.output_ids = {t.id for t in self.graph.outputs}
        self.remove(op)
        return True

    # ---- the reader lists ------------------------------------------------------------------
    def _add_reader(self, op: Op) -> None:
        first = self.first_reader
        for t in op.inputs:
            if t is not None:
                if t.id in first:
                    self._append_reader(t.id, op)
                else:
                    first[t.id] = op

    def _append_reader(self, key: int, op: Op) -> None:
        if key not in self.first_reader:
            self.first_reader[key] = op
        elif key in self.more_readers:
            self.more_readers[key].append(op)
        else:
            self.more_readers[key] = [op]

    def _drop_reader(self, t: Tensor, op: Op) -> None:
        """Forget one of `op`'s reads of `t` (the first in reader order)."""
        key = t.id
        more = self.more_readers.get(key)
        if self.first_reader.get(key) is op:
            if more:
                self.first_reader[key] = more.pop(0)
            else:
                del self.first_reader[key]
        elif more:
            for k, r in enumerate(more):
                if r is op:
                    del more[k]
                    break
        if more is not None and not more:
            del self.more_readers[key]


def _may_replace_output(graph: Graph, out: Tensor, replacement: Tensor) -> bool:
    """A graph output may be re-pointed unless that makes a graph input, a constant or
    another graph output a graph output (again)."""
    if not any(t is out for t in graph.outputs):
        return True
    taken = {t.id for t in graph.inputs} | {t.id for t in graph.outputs if t is not out}
    return replacement.id not in taken and not replacement.is_const


def insert_after(graph: Graph, anchor: Op, new_ops: list[Op]) -> None:
    """Insert `new_ops` right after `anchor` (keeps the op list topological)."""
    i = graph.ops.index(anchor)  # by identity (Op has eq=False)
    graph.ops[i + 1 : i + 1] = new_ops


def remove_ops(graph: Graph, dead: list[Op]) -> None:
    ids = {id(op) for op in dead}
    graph.ops = [op for op in graph.ops if id(op) not in ids]


def snapshot(graph: Graph):
    """Everything a pass may change, to undo it with `restore` (tensors are never mutated).
    The opcode too: a pass may turn an op into another kind in place (TRANSPOSE ->
    RESHAPE); restoring its inputs without its opcode made a RESHAPE read a perm."""
    return (
        list(graph.ops),
        list(graph.outputs),
        [(op, op.opcode, list(op.inputs), list(op.outputs), dict(op.options)) for op in graph.ops],
    )


def restore(graph: Graph, state) -> None:
    ops, outputs, op_states = state
    graph.ops, graph.outputs = ops, outputs
    for op, opcode, inputs, outs, options in op_states:
        op.opcode, op.inputs, op.outputs, op.options = opcode, inputs, outs, options


def inverse_perm(perm) -> list[int]:
    """The permutation that undoes `perm`."""
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def opcode_histogram(graph: Graph) -> dict[str, int]:
    """{opcode: count}, most frequent first (for reports and tests)."""
    counts: dict[str, int] = {}
    for op in graph.ops:
        counts[op.opcode] = counts.get(op.opcode, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
