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
were already concrete: parameters, data, optimizer state, rng keys, and Python floats
such as learning rates, passed as values so that changing them does not recompile).
Its *outputs* are the placeholders still alive (weak references tell): new parameter
values, gradients, optimizer state, the loss. Dead intermediates are not outputs, so XLA
fuses them away. The function is a `tpu_backend.compile.Program` (name "fused") keyed by
a structural fingerprint: each node's key (op, static arguments) and wiring, plus the
output positions; `Program` keys on input shapes and dtypes. So fused programs count in
`compile_stats()`, use the persistent disk cache, are refused by `cache_only()`, and are
written by `tpu_backend.compile.dump(folder)`. `last_program_text()` returns the last
graph's op list and StableHLO.

Views and in-place writes keep strict mode's semantics because the same gather/scatter
functions run, recorded: a storage's payload is an SSA value that each write replaces.

Ops recorded on autograd's device thread (the backward pass) join the same graph; a
lock keeps recording and syncing from interleaving. Not done: donating the buffers a
step overwrites (XLA writes updated parameters to new buffers).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

import jax
import numpy as np

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
    """The not-yet-computed output `index` of a recorded node; `value` once synced."""

    __slots__ = ("aval", "node", "index", "value", "__weakref__")

    def __init__(self, aval, node: "_Node | None", index: int):
        self.aval, self.node, self.index, self.value = aval, node, index, None

    shape = property(lambda self: tuple(self.aval.shape))
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: len(self.aval.shape))
    size = property(lambda self: int(np.prod(self.aval.shape, dtype=np.int64)))
    weak_type = property(lambda self: self.aval.weak_type)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def force(self) -> jax.Array:
        """The concrete array: runs the recorded graph if this value is still pending."""
        if self.value is None:
            sync()
        if self.value is None:  # only a bug can get here: a live placeholder is always an output
            raise RuntimeError("fused mode lost a pending value; please report with the recorded op list")
        return self.value

    def astype(self, dtype) -> "LazyArray":
        return record(("astype", np.dtype(dtype)), lambda x: x.astype(dtype), [self])

    def reshape(self, *shape) -> "LazyArray":
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return record(("reshape", shape), lambda x: x.reshape(shape), [self])

    def item(self):
        return self.force().item()

    def __repr__(self) -> str:
        state = "pending" if self.value is None else "computed"
        return f"LazyArray({self.dtype}{list(self.shape)}, {state})"


class _Node:
    """One recorded call: `fn(*inputs)` with `inputs` given as wiring references."""

    __slots__ = ("key", "fn", "inputs", "outputs", "treedef", "position")

    def __init__(self, key, fn: Callable, inputs: tuple, position: int):
        self.key, self.fn, self.inputs, self.position = key, fn, inputs, position
        self.outputs: list[weakref.ref] = []
        self.treedef = None


class _Graph:
    """The graph being recorded: nodes in program order and their external inputs."""

    def __init__(self):
        self.nodes: list[_Node] = []
        self.external: list[Any] = []  # concrete arrays (and 0-d float64 numpy for Python floats)
        self.external_index: dict[int, int] = {}  # id(array) -> position (an array used twice is one input)
        self.external_floats: list[int] = []  # positions that were Python floats (weakly typed in torch)

    def input_ref(self, value) -> tuple:
        if isinstance(value, LazyArray):
            if value.value is None:
                return ("n", value.node.position, value.index)
            value = value.value
        if type(value) is float:
            self.external.append(np.asarray(value, np.float64))
            self.external_floats.append(len(self.external) - 1)
            return ("f", len(self.external) - 1)
        found = self.external_index.get(id(value))
        if found is None:
            found = self.external_index[id(value)] = len(self.external)
            self.external.append(value)
        return ("x", found)


_graph = _Graph()
_shape_cache: dict[tuple, tuple] = {}  # (node key, input avals) -> (treedef, output avals)


def _aval(value) -> tuple:
    if type(value) is float:
        return ("float",)
    if isinstance(value, LazyArray):
        if value.value is None:
            return (value.shape, value.dtype, bool(value.aval.weak_type))
        value = value.value
    return (tuple(value.shape), value.dtype, bool(getattr(value, "weak_type", False)))


def _abstract(value):
    if type(value) is float:
        return value
    shape, dtype, weak = _aval(value)
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


def _abstract_input(value) -> jax.ShapeDtypeStruct:
    # Shapes only: keeping the last step's arrays would hold a second copy of the parameters.
    return jax.ShapeDtypeStruct(value.shape, value.dtype, weak_type=bool(getattr(value, "weak_type", False)))


def _output_shapes(key, fn: Callable, inputs: list, avals: tuple) -> tuple:
    cache_key = (key, avals)
    found = _shape_cache.get(cache_key)
    if found is None:
        out = jax.eval_shape(fn, *[_abstract(v) for v in inputs])
        leaves, treedef = jax.tree_util.tree_flatten(out)
        found = _shape_cache[cache_key] = (treedef, tuple(leaves))
    return found


def record(key, fn: Callable, inputs: list):
    """Record `fn(*inputs)` (JAX arrays, placeholders or Python floats) and return
    placeholders shaped like its result. `key` must identify `fn` exactly (op and static
    arguments): graphs with equal keys and wiring share one compiled program."""
    treedef, avals = _output_shapes(key, fn, inputs, tuple([_aval(v) for v in inputs]))
    with _lock:
        graph = _graph
        node = _Node(key, fn, tuple([graph.input_ref(v) for v in inputs]), len(graph.nodes))
        node.treedef = treedef
        results = [LazyArray(aval, node, i) for i, aval in enumerate(avals)]
        node.outputs = [weakref.ref(r) for r in results]
        graph.nodes.append(node)
        full = len(graph.nodes) >= _max_nodes
    out = results[0] if treedef.num_leaves == 1 and treedef.num_nodes == 1 else treedef.unflatten(results)
    if full:
        sync()
    return out


# ----------------------------------------------------------------------------- running


class _Compiled:
    """The `Program` of one graph structure and the op list it came from."""

    def __init__(self, program, ops_text: str):
        self.program, self.ops_text = program, ops_text


_programs: dict[tuple, _Compiled] = {}
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


def _graph_function(nodes: list[_Node], outputs: list[tuple[int, int]], floats: frozenset) -> Callable:
    """The recorded graph as one function of its external inputs, returning live outputs."""
    steps = [(node.fn, node.inputs) for node in nodes]
    convert_element_type = _weak_type_converter()

    def run(*external):
        # Python floats arrive as float64 arrays; make them weakly typed again, as in
        # strict mode, so `float32_tensor * lr` stays float32.
        external = [convert_element_type(x, weak_type=True) if i in floats else x for i, x in enumerate(external)]
        values: list[list] = []
        for fn, refs in steps:
            args = [values[r[1]][r[2]] if r[0] == "n" else external[r[1]] for r in refs]
            values.append(jax.tree_util.tree_leaves(fn(*args)))
        return [values[p][i] for p, i in outputs]

    return run


def _render(template, refs: list[str]) -> str:
    """A static argument template with its dynamic slots shown as the values wired in."""
    if type(template).__name__ == "_Slot":  # dispatch's placeholder for the i-th dynamic value
        return refs[template.index]
    if type(template) is tuple:
        return "[" + ", ".join(_render(t, refs) for t in template) + "]"
    return repr(template)


def _describe_node(node: _Node) -> str:
    refs = [f"%{r[1]}.{r[2]}" if r[0] == "n" else f"in{r[1]}" for r in node.inputs]
    key = node.key
    if isinstance(key[0], str):  # a storage access: ("gather", shape, strides, offset)...
        return f"{key[0]}{tuple(key[1:])}({', '.join(refs)})"
    op, template_args, template_kwargs = key
    args = [_render(t, refs) for t in template_args] + [f"{k}={_render(t, refs)}" for k, t in template_kwargs]
    return f"{op}({', '.join(args)})"


def _describe_ops(nodes: list[_Node], outputs: list[tuple[int, int]]) -> str:
    lines = [f"# fused graph: {len(nodes)} nodes, {len(outputs)} outputs"]
    for node in nodes:
        lines.append(f"%{node.position} = {_describe_node(node)}")
    lines.append("return " + ", ".join(f"%{p}.{i}" for p, i in outputs))
    return "\n".join(lines)


def _compiled_for(fingerprint: tuple, nodes, outputs, floats) -> _Compiled:
    found = _programs.get(fingerprint)
    if found is None:
        from tpu_backend.compile.program import Program

        ops_text = _describe_ops(nodes, outputs)
        program = Program("fused", _graph_function(nodes, outputs, floats), source=ops_text)
        found = _programs[fingerprint] = _Compiled(program, ops_text)
    return found


def sync() -> None:
    """Run everything recorded so far as one program; pending live values become concrete."""
    global _graph
    with _lock:
        graph = _graph
        if not graph.nodes:
            return
        _graph = _Graph()  # ops recorded from here on start a new graph
        outputs, placeholders = [], []
        for node in graph.nodes:
            for index, ref in enumerate(node.outputs):
                placeholder = ref()
                if placeholder is not None:
                    outputs.append((node.position, index))
                    placeholders.append(placeholder)
        floats = frozenset(graph.external_floats)
        fingerprint = (tuple((n.key, n.inputs) for n in graph.nodes), tuple(outputs), floats)
        compiled = _compiled_for(fingerprint, graph.nodes, outputs, floats)
        _last.update(compiled=compiled, external=[_abstract_input(x) for x in graph.external])
        results = compiled.program(*graph.external) if outputs else []
        for placeholder, value in zip(placeholders, results):
            placeholder.value, placeholder.node = value, None
        tpu_tensor.replace_computed_payloads()


def mark_step() -> None:
    """End of a training step: run the recorded ops as one program (a no-op outside fused mode)."""
    sync()


def pending_nodes() -> int:
    """How many ops are recorded and not yet run."""
    return len(_graph.nodes)


def last_program_text() -> tuple[str, str]:
    """(recorded op list, StableHLO) of the last graph that ran: for debugging."""
    if not _last:
        raise RuntimeError("no fused graph has run yet: set_eager_mode('fused') and reach a sync point first")
    compiled = _last["compiled"]
    lowered = jax.jit(compiled.program.fn).lower(*_last["external"])
    return compiled.ops_text, lowered.as_text()


def enable() -> None:
    tpu_tensor.set_lazy_hooks(record, sync)


def disable() -> None:
    """Leave fused mode: run what is pending, then ops run eagerly again."""
    sync()
    tpu_tensor.set_lazy_hooks(None, None)
