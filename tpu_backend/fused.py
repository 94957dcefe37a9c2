"""Fused eager mode (EXPERIMENTAL): record ops lazily, run each step as one XLA program.

`tpu_backend.set_eager_mode("fused")` (or `TPU_EAGER_MODE=fused`). Every op on a tpu
tensor, and every read or write of a storage through a view (`tensor.read`/`write`),
becomes a *node* of one recorded graph instead of running: its results are `LazyArray`
placeholders whose shape and dtype come from `jax.eval_shape` of the same lowering
strict mode runs (cached per op, static arguments and input shapes). Nothing executes
until a sync point:

- `.item()`, `.cpu()`, `.numpy()`, printing (anything that needs host values: `force`);
- data-dependent ops (`nonzero`, boolean masks), which need concrete inputs;
- `torch.tpu.synchronize()` and `tpu_backend.mark_step()`;
- the graph reaching `max_nodes()` nodes (`set_max_nodes`, `TPU_FUSED_MAX_NODES`).

At a sync point the graph becomes one function of its *external inputs* (arrays that
were already concrete: parameters, data, optimizer state, rng keys) plus one float64
vector of the Python floats it used (learning rates, AdamW's bias corrections: values,
so that changing them does not recompile). Its *outputs* are the placeholders still
alive (weak references tell): new parameter values, gradients, optimizer state, the
loss. Dead intermediates are not outputs, so XLA fuses them away. External inputs that
nothing outside the graph can read again (the old values of parameters and optimizer
state that the step overwrote: only the graph still references them) are *donated*:
XLA writes the new values into their buffers, so a step updates its state in place.

Recording costs bookkeeping only. Each op follows an edge of a trie of recorded op
sequences (`_TraceState`), keyed by (op key, wiring, shapes of external inputs): the
edge caches the op's output shapes (found once by `jax.eval_shape`), and the state
reached at a sync point *is* the graph's structural key, so nothing per op grows with
the trace. A node is one tuple and each result one placeholder, held by the graph until
the sync point, which tells the live ones by reference count (no weak reference per
output). The state keeps what a sync point there needs per set of live outputs
(`_Ending`), so a repeated step's sync is a dict lookup on a tuple of ints. With the
compiled path, `record` is the same steps in C++ (`tpu_backend/native`: no Python frame
per op; `python_record` stays the definition, and runs with `TPU_NATIVE=0`).

The program is a `tpu_backend.compile.Program` (name "fused") per (state,
live outputs, donated inputs): fused programs count in `compile_stats()`, use the
persistent disk cache, are refused by `cache_only()`, and are written by
`tpu_backend.compile.dump(folder)`. `last_program_text()` returns the last graph's op
list and StableHLO; `stats()` counts programs run, sync points by reason and the
user's lines whose reads split a step into several programs.

Views and in-place writes keep strict mode's semantics because the same gather/scatter
functions run, recorded: a storage's payload is an SSA value that each write replaces.

Ops recorded on autograd's device thread (the backward pass) join the same graph; a
lock keeps recording and syncing from interleaving.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import sys
import threading
from typing import Any, Callable

import jax
import numpy as np
from jax._src.array import ArrayImpl as _ARRAY_IMPL  # JAX's concrete array class (an exact type test is cheap)

from tpu_backend import native
from tpu_backend import tensor as tpu_tensor

_lock = threading.RLock()
_max_nodes = int(os.environ.get("TPU_FUSED_MAX_NODES", "10000"))


def set_max_nodes(limit: int) -> None:
    """Run the recorded graph once it holds `limit` nodes (bounds trace and compile time)."""
    global _max_nodes
    if limit < 1:
        raise ValueError(f"fused mode's node limit must be at least 1, got {limit}")
    _max_nodes = int(limit)


def max_nodes() -> int:
    return _max_nodes


class LazyArray(tpu_tensor.LazyValue):
    """Output `ref[2]` of recorded node `ref[1]`, not yet computed; `value` once synced.
    (It keeps no link to its node: a placeholder the user dropped is garbage at once.)"""

    __slots__ = ("shape", "dtype", "weak_type", "ref", "value", "__weakref__")

    def __init__(self, aval: tuple, ref: tuple):
        self.shape, self.dtype, self.weak_type = aval
        self.ref, self.value = ref, None  # ref: how later nodes of its graph wire it in

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def force(self) -> jax.Array:
        """The concrete array: runs the recorded graph if this value is still pending."""
        if self.value is None:
            sync("read")
        if self.value is None:  # only a bug can get here: a live placeholder is always an output
            raise RuntimeError("fused mode lost a pending value; please report with the recorded op list")
        return self.value

    def read_alone(self) -> np.ndarray | None:
        return _read_alone(self) if self.value is None else None

    def astype(self, dtype) -> "LazyArray":
        return record(("astype", np.dtype(dtype)), lambda x: x.astype(dtype), [self])

    def reshape(self, *shape) -> "LazyArray":
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return record(("reshape", shape), lambda x: x.reshape(shape), [self])

    def item(self):
        return tpu_tensor.for_host(self).item()

    def __repr__(self) -> str:
        state = "pending" if self.value is None else "computed"
        return f"LazyArray({self.dtype}{list(self.shape)}, {state})"


# One recorded call, `fn(*inputs)`, is the tuple (key, fn, input refs): a node costs one
# tuple (its results' placeholders are in `_Graph.placeholders`).
_Node = tuple


class _TraceState:
    """A point in the trie of every op sequence recorded so far. Recording an op follows
    (or adds) the edge for its (key, wiring, external input shapes), so the graph's
    structural key is known at every op at the cost of one dict lookup, and each edge
    caches its op's output structure and shapes: no shape inference after warm-up and
    nothing at a sync point that grows with the trace. A state reached at a sync point
    keeps the programs of the graphs that ended there."""

    __slots__ = ("children", "endings")

    def __init__(self):
        self.children: dict[tuple, tuple] = {}  # edge -> (next state, output avals, pack)
        self.endings: dict[tuple, _Ending] = {}  # live outputs -> what runs that graph


_root = _TraceState()
_trie_edges = 0
_MAX_TRIE_EDGES = 200_000  # a program whose structure changes every step would grow it forever


class _Graph:
    """The graph being recorded: nodes in program order and their external inputs."""

    def __init__(self):
        self.nodes: list[_Node] = []  # (key, fn, input refs) per call, in program order
        # every node's outputs, in order, held until the sync point, which tells the live
        # ones by their reference counts (no weak reference per output)
        self.placeholders: list[LazyArray] = []
        self.state = _root
        self.external: list[Any] = []  # concrete arrays
        # id(array) -> its ref (an array used twice is one input; its shape is read once)
        self.external_index: dict[int, tuple] = {}
        self.floats: list[float] = []  # Python floats (learning rates...), passed as one float64 vector

    def input_ref(self, value) -> tuple:
        """How a node reaches `value`: ("n", node, output), ("f", i) or ("x", i, shape, dtype, weak)."""
        if type(value) is LazyArray:
            if value.value is None:
                return value.ref
            value = value.value
        if type(value) is float:
            self.floats.append(value)
            return ("f", len(self.floats) - 1)
        found = self.external_index.get(id(value))
        if found is None:
            found = ("x", len(self.external), value.shape, value.dtype, getattr(value, "weak_type", False))
            self.external_index[id(value)] = found
            self.external.append(value)
        return found


_graph = _Graph()
_native = native.load()
_native_input_refs = getattr(_native, "input_refs", None)
_shape_cache: dict[tuple, tuple] = {}  # (node key, input avals) -> (treedef, output avals)


def _input_aval(value, ref: tuple):
    """What `jax.eval_shape` traces the input with."""
    if ref[0] == "f":
        return value
    if ref[0] == "x":
        return jax.ShapeDtypeStruct(ref[2], ref[3], weak_type=ref[4])
    return jax.ShapeDtypeStruct(value.shape, value.dtype, weak_type=value.weak_type)


def _output_shapes(key, fn: Callable, inputs: list, refs: tuple) -> tuple:
    avals = [_input_aval(v, r) for v, r in zip(inputs, refs)]
    cache_key = (
        key,
        tuple(("float",) if r[0] == "f" else (a.shape, a.dtype, a.weak_type) for a, r in zip(avals, refs)),
    )
    found = _shape_cache.get(cache_key)
    if found is None:
        out = jax.eval_shape(fn, *avals)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        found = _shape_cache[cache_key] = (treedef, tuple((tuple(a.shape), a.dtype, bool(a.weak_type)) for a in leaves))
    return found


def _packer(treedef) -> Callable | None:
    """How a node's list of placeholders becomes the structure its function returns: None
    for a bare array, `tuple` or `list` for a flat sequence (no pytree call per op)."""
    leaves = treedef.num_leaves
    if leaves == 1 and treedef.num_nodes == 1:
        return None
    if treedef == jax.tree_util.tree_structure((0,) * leaves):
        return tuple
    if treedef == jax.tree_util.tree_structure([0] * leaves):
        return list
    return treedef.unflatten


def _follow(graph: _Graph, key, fn: Callable, inputs: list, refs: tuple) -> tuple:
    """The trie edge for this op from the graph's state, added on first sight (the hit is
    inlined in `record`)."""
    global _root, _trie_edges
    edge = (key, refs)
    found = graph.state.children.get(edge)
    if found is None:
        if _trie_edges >= _MAX_TRIE_EDGES:  # start over rather than grow without bound
            _root, _trie_edges = _TraceState(), 0
        treedef, avals = _output_shapes(key, fn, inputs, refs)
        found = graph.state.children[edge] = (_TraceState(), avals, _packer(treedef))
        _trie_edges += 1
    return found


def record(key, fn: Callable, inputs: list):
    """Record `fn(*inputs)` (JAX arrays, placeholders or Python floats) and return
    placeholders shaped like its result. `key` must identify `fn` exactly (op and static
    arguments): graphs with equal keys and wiring share one compiled program."""
    with _lock:
        graph = _graph
        if _native_input_refs is None:
            refs = tuple([graph.input_ref(v) for v in inputs])
        else:  # the same, in C++ (tpu_backend/native)
            refs = _native_input_refs(inputs, graph.floats, graph.external, graph.external_index, LazyArray)
        found = graph.state.children.get((key, refs))
        state, avals, pack = found if found is not None else _follow(graph, key, fn, inputs, refs)
        graph.state = state
        nodes = graph.nodes
        position = len(nodes)
        if pack is None:
            out = LazyArray(avals[0], ("n", position, 0))
            results = [out]
        else:
            results = [LazyArray(aval, ("n", position, i)) for i, aval in enumerate(avals)]
            out = pack(results)
        nodes.append((key, fn, refs))
        graph.placeholders += results
        full = position + 1 >= _max_nodes
    if full:
        sync("node_limit")
    return out


python_record = record  # the definition; `record` may be the same steps in C++:
if hasattr(_native, "fused_record"):  # no Python frame per op (the op kernels call it directly)
    _native.configure_fused(globals())
    record = _native.fused_record


# ----------------------------------------------------------------------------- running


class _Compiled:
    """The `Program` of one graph structure and the op list it came from."""

    def __init__(self, program, ops_text: str):
        self.program, self.ops_text = program, ops_text


class _Ending:
    """A recorded op sequence (a trie state) ended with these outputs live: what a sync
    point there needs, found once, so that a repeated step costs one dict lookup."""

    __slots__ = ("outputs", "external_kinds", "reusable", "programs")

    def __init__(self, graph: _Graph, live: tuple):
        self.outputs = [graph.placeholders[i].ref[1:] for i in live]  # (node, output) pairs
        # (shape, dtype) of each external input, fixed by the trie state (shapes are in its
        # edges), and of each output, numbered: a sync point counts by number, hashing nothing
        external = [(ref[2], ref[3]) for ref in graph.external_index.values()]
        outputs = [(p.shape, p.dtype) for p in (graph.placeholders[i] for i in live)]
        kinds: dict[tuple, int] = {}
        for aval in external + outputs:
            kinds.setdefault(aval, len(kinds))
        self.external_kinds = [kinds[aval] for aval in external]
        # outputs per kind: how many external buffers of that kind a step may donate to them
        self.reusable = [0] * len(kinds)
        for aval in outputs:
            self.reusable[kinds[aval]] += 1
        self.programs: dict[tuple, _Compiled] = {}  # donated inputs -> program


_last: dict[str, Any] = {}


def _weak_type_converter() -> Callable:
    """JAX's private `_convert_element_type`, the only way to re-weaken a traced float.
    Imported on first use (never at `import tpu_backend`), with a message naming the JAX
    version when a JAX upgrade moves it."""
    try:
        from jax._src.lax.lax import _convert_element_type
    except ImportError as e:
        raise ImportError(
            f"fused eager mode needs jax._src.lax.lax._convert_element_type, which JAX {jax.__version__} "
            "no longer has (tested with jax 0.10); use set_eager_mode('strict') or the pinned JAX "
            "(constraints.txt)"
        ) from e
    return _convert_element_type


def _external_avals(nodes: list[_Node], floats: int) -> list[jax.ShapeDtypeStruct]:
    """The graph's inputs as shapes, from its wiring (keeping the last step's arrays
    would hold a second copy of the parameters)."""
    found = {}
    for node in nodes:
        for ref in node[2]:
            if ref[0] == "x":
                found[ref[1]] = jax.ShapeDtypeStruct(ref[2], ref[3], weak_type=ref[4])
    avals = [found[i] for i in range(len(found))]
    return avals + ([jax.ShapeDtypeStruct((floats,), np.float64)] if floats else [])


def _graph_function(
    nodes: list[_Node], outputs: list[tuple[int, int]], has_floats: bool, check: Callable | None = None
) -> Callable:
    """The recorded graph as one function of its external inputs (and, last, the vector
    of Python floats when there are any), returning the live outputs; `check(leaves)` sees
    each node's results as they are traced."""
    steps = [(fn, refs) for _, fn, refs in nodes]
    convert_element_type = _weak_type_converter()

    def run(*external):
        floats = external[-1] if has_floats else None
        values: list[list] = []
        for fn, refs in steps:
            args = []
            for r in refs:
                if r[0] == "n":
                    args.append(values[r[1]][r[2]])
                elif r[0] == "x":
                    args.append(external[r[1]])
                else:  # a Python float: weakly typed again, as in strict mode (float32 * lr stays float32)
                    args.append(convert_element_type(floats[r[1]], weak_type=True))
            values.append(jax.tree_util.tree_leaves(fn(*args)))
            if check is not None:
                check(values[-1])
        return [values[p][i] for p, i in outputs]

    return run


class OpKey:
    """The key of one ATen op with one static-argument template (`OpRunner` makes one per
    template): hashed by identity, so following a trie edge never re-hashes the op."""

    __slots__ = ("op", "args", "kwargs")

    def __init__(self, op, args: tuple, kwargs: tuple):
        self.op, self.args, self.kwargs = op, args, kwargs


def _render(template, refs: list[str]) -> str:
    """A static argument template with its dynamic slots shown as the values wired in."""
    if type(template).__name__ == "_Slot":  # dispatch's placeholder for the i-th dynamic value
        return refs[template.index]
    if type(template).__name__ == "_ViewSlot":  # ... and for a view of it, gathered in the program
        return f"{refs[template.index]}.view{template.geometry}"
    if type(template) is tuple:
        return "[" + ", ".join(_render(t, refs) for t in template) + "]"
    return repr(template)


def _describe_ref(r: tuple) -> str:
    return f"%{r[1]}.{r[2]}" if r[0] == "n" else f"in{r[1]}" if r[0] == "x" else f"float{r[1]}"


def _describe_node(node: _Node) -> str:
    key, _, inputs = node
    refs = [_describe_ref(r) for r in inputs]
    if not isinstance(key, OpKey):  # a storage access: ("gather", shape, strides, offset)...
        return f"{key[0]}{tuple(key[1:])}({', '.join(refs)})"
    args = [_render(t, refs) for t in key.args] + [f"{k}={_render(t, refs)}" for k, t in key.kwargs]
    return f"{key.op}({', '.join(args)})"


def _describe_ops(nodes: list[_Node], outputs: list[tuple[int, int]], donated: tuple) -> str:
    lines = [f"# fused graph: {len(nodes)} nodes, {len(outputs)} outputs", f"# donated inputs: {list(donated)}"]
    for position, node in enumerate(nodes):
        lines.append(f"%{position} = {_describe_node(node)}")
    lines.append("return " + ", ".join(f"%{p}.{i}" for p, i in outputs))
    return "\n".join(lines)


def _compiled_for(ending: _Ending, nodes: list[_Node], has_floats: bool, donated: tuple) -> _Compiled:
    found = ending.programs.get(donated)
    if found is None:
        from tpu_backend.compile.program import Program

        ops_text = _describe_ops(nodes, ending.outputs, donated)
        program = Program(
            "fused",
            _graph_function(nodes, ending.outputs, has_floats),
            source=ops_text,
            donate=donated,
            identity=ops_text,
        )
        found = ending.programs[donated] = _Compiled(program, ops_text)
    return found


_HELD_ONLY_BY_THE_GRAPH = 3  # the graph's list, the loop variable and getrefcount's argument
_HELD_ONLY_BY_THE_LIST = 2  # the list and getrefcount's argument (no variable in between)


def _live_outputs(placeholders: list) -> tuple:
    """The positions of the placeholders something outside the graph still holds (a
    tensor's payload, the user's variable): the graph's outputs. The rest are dead
    intermediates, which XLA fuses away."""
    getrefcount = sys.getrefcount
    return tuple([i for i in range(len(placeholders)) if getrefcount(placeholders[i]) > _HELD_ONLY_BY_THE_LIST])


def _donated(external: list, external_kinds: list[int], reusable: list[int]) -> tuple:
    """The external inputs nothing outside the graph can read again (their tensors were
    overwritten, e.g. parameters and optimizer state updated in place), as many per
    shape and dtype as outputs can reuse (an `_Ending`'s `external_kinds` and `reusable`):
    XLA writes the new values into their buffers."""
    left = None
    donated = []
    getrefcount = sys.getrefcount
    for index in range(len(external)):
        value = external[index]
        if getrefcount(value) > _HELD_ONLY_BY_THE_GRAPH:
            continue
        if type(value) is not _ARRAY_IMPL and not isinstance(value, jax.Array):
            continue
        if left is None:
            left = reusable.copy()  # counted down: the ending's stays whole
        kind = external_kinds[index]
        if left[kind] > 0:
            left[kind] -= 1
            donated.append(index)
    return tuple(donated)


python_live_outputs, python_donated = _live_outputs, _donated  # the definitions; in C++:
if hasattr(_native, "donated"):  # the same loops without a Python call per array
    _live_outputs = _native.live_outputs
    _donated = functools.partial(_native.donated, _ARRAY_IMPL, jax.Array)


SYNC_REASONS = ("mark_step", "read", "node_limit", "synchronize", "mode_change")
_STATS: collections.Counter = collections.Counter()
_READ_SITES: collections.Counter = collections.Counter()


def stats() -> dict[str, Any]:
    """What fused mode did since the last `reset_stats()`: `programs_run` (graphs run, one
    per sync point with pending ops), `nodes` (ops those graphs held), `syncs` per reason
    ("mark_step", "read": a host read such as `.item()` or a data-dependent op,
    "node_limit", "synchronize", "mode_change"), `donated_inputs` (buffers updated in
    place), `reads_alone` (host reads computed without running the graph: `_read_alone`)
    and `read_sites`: the user's lines whose reads ran a graph. A training step
    that shows more programs than steps was split: its read sites say where."""
    return {
        "programs_run": _STATS["programs_run"],
        "nodes": _STATS["nodes"],
        "syncs": {reason: _STATS["sync:" + reason] for reason in SYNC_REASONS},
        "donated_inputs": _STATS["donated_inputs"],
        "reads_alone": _STATS["reads_alone"],
        "read_sites": dict(_READ_SITES),
    }


def reset_stats() -> None:
    _STATS.clear()
    _READ_SITES.clear()


def sync(reason: str = "synchronize") -> None:
    """Run everything recorded so far as one program; pending live values become concrete.
    `reason` is counted in `stats()` (one of SYNC_REASONS)."""
    global _graph
    with _lock:
        graph = _graph
        if not graph.nodes:
            return
        _graph = _Graph()  # ops recorded from here on start a new graph
        everything = graph.placeholders
        live = _live_outputs(everything)
        ending = graph.state.endings.get(live)
        if ending is None:
            ending = graph.state.endings[live] = _Ending(graph, live)
        placeholders = [everything[i] for i in live]
        graph.placeholders = everything = None
        external = graph.external
        donated = _donated(external, ending.external_kinds, ending.reusable)
        has_floats = bool(graph.floats)  # (fixed by the state too: floats are wired in by position)
        compiled = _compiled_for(ending, graph.nodes, has_floats, donated)
        if has_floats:
            external.append(np.asarray(graph.floats, np.float64))
        _last.update(compiled=compiled, nodes=graph.nodes, floats=len(graph.floats))
        _STATS["programs_run"] += 1
        _STATS["nodes"] += len(graph.nodes)
        _STATS["sync:" + reason] += 1
        _STATS["donated_inputs"] += len(donated)
        if reason == "read":
            from tpu_backend.eager.errors import user_frame

            _READ_SITES[user_frame()] += 1
        try:
            results = compiled.program(*external) if live else []
        except jax.errors.JaxRuntimeError as error:
            from tpu_backend.eager.errors import reraise_as_torch

            reraise_as_torch(error)
        external.clear()
        for placeholder, value in zip(placeholders, results):
            placeholder.value = value
        tpu_tensor.replace_computed_payloads()


# ----------------------------------------------------------------------------- reads alone

# A host read of a pending value runs the whole graph (the step so far) unless the value is
# a small integer or boolean computation of concrete arrays: transformers' mask code reads
# such a value mid-forward every step (`find_packed_sequence_indices`, `fast_all(mask)`),
# which split each training step into two programs, each the tail of one step and the head
# of the next. Such a value is computed alone on the host's CPU device, from its own
# ancestry (at most this many nodes), and the graph stays pending, whole: integer ops give
# the same bits there as in the program (floats might not: a float in the ancestry refuses).
_ALONE_MAX_NODES = 64
_alone_programs: dict[tuple, Callable | None] = {}  # ancestry's structure -> its jitted function, None: refused


class _Inexact(Exception):
    """A float or complex value in the ancestry of a value read alone."""


def _ancestry(graph: _Graph, node: int) -> list[int] | None:
    """The nodes `node` depends on, itself included, in program order; None when more than
    `_ALONE_MAX_NODES`."""
    seen, stack = {node}, [node]
    while stack:
        for ref in graph.nodes[stack.pop()][2]:
            if ref[0] == "n" and ref[1] not in seen:
                if len(seen) == _ALONE_MAX_NODES:
                    return None
                seen.add(ref[1])
                stack.append(ref[1])
    return sorted(seen)


def _integers_only(leaves: list) -> None:
    """Raise `_Inexact` for a float or complex value (traced in the ancestry of a read alone)."""
    if any(np.issubdtype(leaf.dtype, np.inexact) for leaf in leaves):
        raise _Inexact


@functools.cache
def _host_device():
    """JAX's CPU device (where values read alone are computed), or None when JAX has none."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def _read_alone(placeholder: LazyArray) -> np.ndarray | None:
    """`placeholder`'s value computed from its ancestry alone on the CPU device, the graph left
    pending; None (the caller syncs) when the ancestry is large or not all integers."""
    cpu = _host_device()
    if cpu is None:
        return None
    with _lock:
        graph = _graph
        _, node, output = placeholder.ref
        if node >= len(graph.nodes):  # (a pending placeholder is always the current graph's)
            return None
        positions = _ancestry(graph, node)
        if positions is None:
            return None
        local = {p: i for i, p in enumerate(positions)}
        inputs: dict[int, int] = {}  # the graph's external index -> the function's argument
        floats: dict[int, int] = {}  # the graph's float index -> its place in the float vector
        nodes = []  # the ancestry, wired as a graph of its own
        for p in positions:
            key, fn, refs = graph.nodes[p]
            wiring = tuple(
                ("n", local[r[1]], r[2])
                if r[0] == "n"
                else ("x", inputs.setdefault(r[1], len(inputs)), *r[2:])
                if r[0] == "x"
                else ("f", floats.setdefault(r[1], len(floats)))
                for r in refs
            )
            nodes.append((key, fn, wiring))
        external = [graph.external[i] for i in inputs]
        external.append(np.asarray([graph.floats[i] for i in floats], np.float64))
    if any(not getattr(x, "is_fully_addressable", True) for x in external):
        return None  # sharded over processes: the graph's own program reads it
    key = (tuple((k, wiring) for k, _, wiring in nodes), local[node], output)
    function = _alone_programs.get(key, ...)
    if function is ...:
        outputs = [(local[node], output)]
        function = _alone_programs[key] = jax.jit(_graph_function(nodes, outputs, True, check=_integers_only))
    if function is None:
        return None
    try:
        with jax.default_device(cpu):
            (value,) = function(*jax.device_put(external, cpu))
    except Exception:  # noqa: BLE001 - a float in the ancestry (`_Inexact`) or a lowering only the device runs
        _alone_programs[key] = None  # the graph's own program reads it (and raises what is wrong)
        return None
    _STATS["reads_alone"] += 1
    return np.asarray(value)


def mark_step() -> None:
    """End of a training step: run the recorded ops as one program (a no-op outside fused mode)."""
    sync("mark_step")


def pending_nodes() -> int:
    """How many ops are recorded and not yet run."""
    return len(_graph.nodes)


def last_program_text() -> tuple[str, str]:
    """(recorded op list, StableHLO) of the last graph that ran: for debugging."""
    if not _last:
        raise RuntimeError("no fused graph has run yet: set_eager_mode('fused') and reach a sync point first")
    compiled = _last["compiled"]
    lowered = jax.jit(compiled.program.fn).lower(*_external_avals(_last["nodes"], _last["floats"]))
    return compiled.ops_text, lowered.as_text()


def enable() -> None:
    tpu_tensor.set_lazy_hooks(record, sync)


def disable() -> None:
    """Leave fused mode: run what is pending, then ops run eagerly again."""
    sync("mode_change")
    tpu_tensor.set_lazy_hooks(None, None)
