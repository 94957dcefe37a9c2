"""Run an ATen-level FX graph as a JAX function, through the one ATen -> JAX lowering table.

`GraphFunction(gm)` walks `gm.graph` node by node; each `call_function` on an ATen
overload is looked up in the one table, `tpu_backend.ops.registry.LOWERINGS`, whatever
the record's kind: "op" (what every execution mode shares), "view" (view ops, pure
functions in a functional graph) or "graph" (prims, size queries, assertions:
`tpu_backend.compile.prims`).

Control flow (`torch.cond`, `while_loop`) becomes `lax.cond` / `lax.while_loop` over
the branch subgraphs, interpreted the same way. Calls of a nested compile region
(`invoke_subgraph`, from `scan.scan_layers`) run their subgraph as a function; a run of
calls of the same block becomes one `lax.scan` (`tpu_backend.compile.scan`). A region that
writes its inputs (a static KV cache's `index_copy_` in a decoder layer) reaches us as
`auto_functionalized_v2(invoke_subgraph, ...)`: its subgraph ends in `copy_(input, new)`,
which becomes an extra output, and the call returns the region's outputs and then the new
value of every base it wrote.

Plain Python callables in the graph (`operator.getitem`, `operator.mul` on sizes,
`torch.sym_max`...) are called as they are: inside `jax.jit` shapes are concrete, so
symbolic arithmetic is ordinary integer arithmetic.

Randomness is functional. When any node's lowering has `needs_rng=True`, the function
takes a `jax.random` key and returns the advanced key with its outputs; each random
node gets its own key split from it. Nothing random is baked into the compiled program:
two calls with different keys differ, the same key reproduces.

`compile_graph(gm, name)` wraps the function in a `Program` (one `jax.jit` executable
per input signature, counted by the cache layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

import tpu_backend.compile.prims  # noqa: F401  (registers the graph-only lowerings)
import tpu_backend.ops  # noqa: F401  (fills the table)
from tpu_backend.compile.interop import tensor_to_jax
from tpu_backend.compile.program import Program
from tpu_backend.compile.scan import INVOKE_SUBGRAPH, plan_runs
from tpu_backend.ops.registry import LOWERINGS, Lowering, jax_dtype

AUTO_FUNCTIONALIZED = torch.ops.higher_order.auto_functionalized_v2


class UnsupportedGraphError(NotImplementedError):
    """The graph uses ops that have no JAX lowering."""


def lowering_for(target) -> Lowering | None:
    """The JAX lowering of an ATen/prims overload (any kind), or None."""
    return LOWERINGS.get(target)


def is_covered(target) -> bool:
    return lowering_for(target) is not None


def lowering_tables_version() -> tuple[int, ...]:
    """Changes whenever a lowering is added to the table (it only grows)."""
    return (len(LOWERINGS),)


def runs_higher_order(target) -> bool:
    """Whether graphs may call the higher-order op `target` (`torch.cond`, `while_loop`,
    a nested compile region's `invoke_subgraph`): its subgraphs are interpreted too."""
    return target in _HIGHER_ORDER


def _is_python_callable(target) -> bool:
    """Python-level graph nodes (getitem, size arithmetic): run as they are."""
    return not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator))


def lift_input_mutations(gm: torch.fx.GraphModule) -> list[int]:
    """Turn the graph's writes into its inputs (`copy_(input, new)`, which AOTAutograd
    keeps in inference graphs: an optimizer step's parameter and state updates) into
    extra outputs, after the graph's own; returns the placeholder index each one writes.

    The compiled callable stores them into the input tensors itself, and may donate the
    inputs' old buffers to the program, so that XLA updates parameters in place."""
    placeholders = {node: i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    written = []
    for node in list(gm.graph.nodes):
        if _writes_input(node):
            if set(node.users) == {output} and not node.kwargs and len(node.args) == 2:
                # a function returning the input it wrote (`w.mul_(s)`): the output is the new value
                node.replace_all_uses_with(node.args[1])
            if node.users or node.kwargs or len(node.args) != 2:
                raise NotImplementedError(f"tpu: graph writes its input in an unexpected form: {node.format_node()}")
            if node.args[0] in {w for w, _ in written}:
                raise NotImplementedError(f"tpu: graph writes input {node.args[0].name} twice")
            written.append((node.args[0], node.args[1]))
            gm.graph.erase_node(node)
    if not written:
        return []
    output.args = (tuple(output.args[0]) + tuple(value for _, value in written),)
    gm.recompile()
    return [placeholders[target] for target, _ in written]


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` to rewrite (its nodes' metadata shared, not copied)."""
    copy = torch.fx.Graph()
    output, old_output = copy.graph_copy(graph, {}, return_output_node=True)
    copy.output(output).meta.update(old_output.meta)
    return copy


def _writes_input(node: torch.fx.Node) -> bool:
    """`copy_(placeholder, value)`: a write of the graph's input (lifted to an output)."""
    return (
        node.op == "call_function"
        and node.target is torch.ops.aten.copy_.default
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].op == "placeholder"
    )


def missing_lowerings(gm: torch.fx.GraphModule) -> list[str]:
    """Names of the ops, in the graph and its subgraphs, that no table lowers (empty when
    the graph can run). Writes of a graph's inputs are not ops: they are lifted to outputs
    (`lift_input_mutations`)."""
    missing = set()
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or _is_python_callable(node.target) or node.target in _HIGHER_ORDER:
                continue
            if _writes_input(node):
                continue
            if isinstance(node.target, torch._ops.OpOverload) and is_covered(node.target):
                continue
            missing.add(str(node.target))
    return sorted(missing)


def _to_constant(value):
    """A graph attribute (a lifted constant tensor) as a numpy array JAX can embed."""
    if isinstance(value, torch.Tensor):
        # numpy, not a jax.Array: JAX 0.10 passes a closed-over jax.Array to the executable as
        # an extra input, which `lower().compile()` loses ("compiled for 32 inputs but called
        # with 26": a cache that starts as an empty tensor, HF's sliding-window models)
        with jax.ensure_compile_time_eval():  # read at trace time: a value, not a tracer
            return np.asarray(tensor_to_jax(value.detach()))
    return value


class GraphFunction:
    """An ATen FX graph as a function of JAX values: `fn(*inputs)` or `fn(key, *inputs)`.

    Inputs follow the graph's placeholders: arrays for tensors, Python numbers for
    symbolic sizes and scalars. Outputs follow the graph's output node (a tuple, with
    None where the graph returns None, e.g. gradients of inputs that need none).
    With `needs_rng`, the first argument is a `jax.random` key and the result is
    `(new_key, outputs)`.
    """

    def __init__(self, gm: torch.fx.GraphModule, name: str = "graph", written: Sequence[int] = ()):
        missing = missing_lowerings(gm)
        if missing:
            raise UnsupportedGraphError(
                f"tpu: graph {name!r} uses ops without a JAX lowering: {', '.join(missing)}. "
                "Add a lowering in tpu_backend/ops/<family>.py (see tpu_backend/ops/registry.py), "
                "or a decomposition to ops that have one."
            )
        if any(_writes_input(n) for n in gm.graph.nodes):
            raise UnsupportedGraphError(
                f"tpu: graph {name!r} writes its inputs (copy_ into a placeholder): lift the writes to outputs "
                "first (lift_input_mutations)"
            )
        self.gm = gm
        self.name = name
        self.written = list(written)  # inputs whose new values are the last outputs (lift_input_mutations)
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._constants: dict[str, Any] = {}
        self._subgraphs: dict[str, GraphFunction] = {}
        self._invoked: dict[int, GraphFunction] = {}
        self.runs = plan_runs(gm, self.invoked_function)  # repeated blocks: one lax.scan each
        self.needs_rng = any(
            n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and lowering_for(n.target).needs_rng
            for n in gm.graph.nodes
        ) or any(fn.needs_rng for fn in self._invoked.values())

    @property
    def output_nodes(self) -> tuple:
        output = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        values = output.args[0]
        return tuple(values) if isinstance(values, (list, tuple)) else (values,)

    def forwarded_operand(self, index: int) -> int | None:
        """The input position output `index` returns unchanged, or None."""
        node = self.output_nodes[index]
        if isinstance(node, torch.fx.Node) and node.op == "placeholder":
            return self.placeholders.index(node)
        return None

    def invoked_function(self, call: torch.fx.Node) -> "GraphFunction":
        """The function an `invoke_subgraph` call runs (one per subgraph module). The
        subgraph of a region that writes its inputs runs from a copy whose writes are
        outputs (`written`: the inputs they write)."""
        if call.target is AUTO_FUNCTIONALIZED:
            module, identifier = _fetch_attr(self.gm, call.kwargs["subgraph"].target), call.kwargs["identifier"]
        else:
            module, identifier = _fetch_attr(self.gm, call.args[0].target), call.args[1]
        if id(module) not in self._invoked:
            if call.target is AUTO_FUNCTIONALIZED:
                copy = torch.fx.GraphModule(module, _copy_graph(module.graph))
                function = GraphFunction(copy, f"{self.name}/{identifier}", written=lift_input_mutations(copy))
            else:
                function = GraphFunction(module, f"{self.name}/{identifier}")
            self._invoked[id(module)] = function
        return self._invoked[id(module)]

    def __call__(self, *args):
        if self.needs_rng:
            key, *inputs = args
            return self.run(inputs, key)
        return self.run(args)[1]

    def run(self, inputs, key=None):
        """Evaluate the graph on `inputs`; returns `(advanced key or None, outputs)`."""
        if len(inputs) != len(self.placeholders):
            raise TypeError(f"graph {self.name!r} takes {len(self.placeholders)} inputs, got {len(inputs)}")
        if self.needs_rng and key is None:
            raise TypeError(f"graph {self.name!r} draws random numbers: pass a jax.random key")
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, inputs))
        state = {"key": key}
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" or node in env:  # (computed early for a scan)
                continue
            if node.op == "output":
                return state["key"], self._match_metadata(node.args[0], _map_nodes(node.args[0], env))
            self._compute(node, env, state)
        raise ValueError(f"graph {self.name!r} has no output node")

    def _compute(self, node: torch.fx.Node, env: dict, state: dict) -> None:
        """Put `node`'s value in `env`. A call of a scanned run computes the whole run, after
        the values it reads (which the graph may place between the layers' calls)."""
        run = self.runs.get(node)
        if run is None:
            env[node] = self._evaluate(node, env, state)
            return
        pending = [n for n in run.inputs if n not in env]
        while pending:  # their ancestors first, depth first (none depends on the run: scan.plan_runs)
            top = pending[-1]
            missing = [n for n in top.all_input_nodes if n not in env]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            if top not in env:
                self._compute(top, env, state)
        functions = [self.invoked_function(call) for call in run.calls[: run.period]]
        env.update(run.evaluate(functions, env, state, _map_nodes))

    def _match_metadata(self, output_nodes, outputs):
        """Outputs with the dtypes AOTAutograd's metadata promises (autograd checks them).

        A shape mismatch is a lowering bug and is reported; a dtype mismatch (e.g. a
        weakly typed scalar result) is cast, which is free inside the jit."""
        if not isinstance(outputs, (list, tuple)):
            return outputs
        matched = []
        for node, value in zip(output_nodes, outputs):
            expected = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if isinstance(expected, torch.Tensor) and hasattr(value, "dtype"):
                if not _shape_matches(value.shape, expected.shape):
                    raise ValueError(
                        f"tpu: graph {self.name!r} output {node.name} has shape {tuple(value.shape)}, "
                        f"PyTorch expects {tuple(expected.shape)}: a lowering returned the wrong shape"
                    )
                target = jax_dtype(expected.dtype)
                if value.dtype != target:
                    value = value.astype(target)
            matched.append(value)
        return type(outputs)(matched)

    def _evaluate(self, node: torch.fx.Node, env: dict, state: dict):
        if node.op == "get_attr":
            if node.target not in self._constants:
                self._constants[node.target] = _to_constant(_fetch_attr(self.gm, node.target))
            return self._constants[node.target]  # a constant, or a subgraph (GraphModule)
        if node.op != "call_function":
            raise UnsupportedGraphError(f"tpu: graph {self.name!r}: node kind {node.op!r} ({node}) is not supported")
        if node.target is INVOKE_SUBGRAPH:  # a block called once, or not scannable: a plain call
            return self._call_region(node, _map_nodes(node.args[2:], env), state)
        if node.target is AUTO_FUNCTIONALIZED:
            return self._call_writing_region(node, env, state)
        args = _map_nodes(node.args, env)
        kwargs = _map_nodes(node.kwargs, env)
        if _is_python_callable(node.target):
            return node.target(*args, **kwargs)
        if node.target in _HIGHER_ORDER:
            return _HIGHER_ORDER[node.target](self, *args, **kwargs)
        lowering = lowering_for(node.target)
        if lowering.needs_rng:
            state["key"], kwargs["key"] = jax.random.split(state["key"])
        try:
            return lowering.fn(*args, **kwargs)
        except Exception as error:
            error.add_note(f"tpu: while lowering {node.target} in graph {self.name!r}, node: {node.format_node()}")
            raise

    def _call_region(self, node: torch.fx.Node, operands, state: dict):
        function = self.invoked_function(node)
        key = None
        if function.needs_rng:
            state["key"], key = jax.random.split(state["key"])
        return function.run(operands, key)[1]

    def _call_writing_region(self, node: torch.fx.Node, env: dict, state: dict):
        """`auto_functionalized_v2(invoke_subgraph, subgraph=, identifier=, arg0=, ...,
        _all_bases=[...])`: operand `argK` is passed (`argK=`), or it is written and then it
        is one of `_all_bases` (`_argK_base_index`), whole or a slice of it. Returns the
        region's outputs, then every base after the region's writes."""
        if node.args[0] is not INVOKE_SUBGRAPH:
            raise UnsupportedGraphError(
                f"tpu: graph {self.name!r}: auto_functionalized_v2 of {node.args[0]} is not supported (only a "
                "nested compile region, invoke_subgraph, that writes its inputs)"
            )
        function = self.invoked_function(node)
        kwargs = node.kwargs
        bases = list(_map_nodes(kwargs["_all_bases"], env))
        operands, views = [], {}
        for k in range(len(function.placeholders)):
            if f"arg{k}" in kwargs:
                operands.append(_map_nodes(kwargs[f"arg{k}"], env))
            else:
                views[k] = _written_view(kwargs, k, f"tpu: graph {self.name!r}, region {kwargs['identifier']!r}")
                operands.append(views[k].read(bases))
        results = self._call_region(node, operands, state)
        outputs = list(results[: len(results) - len(function.written)])
        for k, value in zip(function.written, results[len(outputs) :]):
            if k not in views:
                raise UnsupportedGraphError(
                    f"tpu: graph {self.name!r}: region {kwargs['identifier']!r} writes operand {k}, which "
                    "PyTorch did not mark as written"
                )
            views[k].write(bases, value)
        return (*outputs, *bases)

    def subgraph(self, gm: torch.fx.GraphModule) -> "GraphFunction":
        """The function of a control-flow branch/body (built once per subgraph)."""
        key = str(id(gm))
        if key not in self._subgraphs:
            sub = GraphFunction(gm, f"{self.name}/{type(gm).__name__}")
            if sub.needs_rng:
                raise UnsupportedGraphError(
                    f"tpu: graph {self.name!r}: random ops inside torch.cond/while_loop bodies are not supported; "
                    "draw the random numbers outside the control flow and pass them in"
                )
            self._subgraphs[key] = sub
        return self._subgraphs[key]


@dataclass
class _WrittenView:
    """Which part of one of `auto_functionalized_v2`'s bases a region's written operand is:
    the whole base, or `base[start:end]` along `dim`."""

    base: int
    dim: int | None = None
    start: int = 0
    end: int | None = None

    def _index(self) -> tuple:
        return (slice(None),) * self.dim + (slice(self.start, self.end),)

    def read(self, bases: list):
        base = bases[self.base]
        return base if self.dim is None else base[self._index()]

    def write(self, bases: list, value) -> None:
        base = bases[self.base]
        bases[self.base] = value if self.dim is None else base.at[self._index()].set(value)


def _written_view(kwargs: dict, k: int, where: str) -> _WrittenView:
    """Operand `argK`'s view of its base, from auto_functionalized_v2's `_argK_*` arguments."""
    prefix = f"_arg{k}_"
    index = kwargs.get(prefix + "base_index")
    extra = sorted(name[len(prefix) :] for name in kwargs if name.startswith(prefix) and name != prefix + "base_index")
    if index is not None and extra in ([], ["alias"]):
        return _WrittenView(index)
    if index is not None and extra == ["slice_dim", "slice_end", "slice_start"]:
        return _WrittenView(
            index, kwargs[prefix + "slice_dim"], kwargs[prefix + "slice_start"], kwargs[prefix + "slice_end"]
        )
    raise UnsupportedGraphError(
        f"{where}: operand {k} is written as a view of an input that is not a slice ({', '.join(extra) or 'no base'}); "
        "write a whole buffer or a slice of one (index_copy_, or x[a:b].copy_), or leave the blocks unmarked "
        "(tpu_backend.compile.scan.unmark)"
    )


# --------------------------------------------------------------------- control flow (higher-order ops)


def _cond(graph: GraphFunction, pred, true_gm, false_gm, operands):
    """`torch.cond` as `lax.cond`: both branches are traced, one runs."""
    on_true, on_false = graph.subgraph(true_gm), graph.subgraph(false_gm)
    operands = tuple(operands)
    if isinstance(pred, (bool, int)):  # decided at trace time
        return tuple((on_true if pred else on_false)(*operands))
    return jax.lax.cond(
        jnp.reshape(pred, ()).astype(bool),
        lambda ops: tuple(on_true(*ops)),
        lambda ops: tuple(on_false(*ops)),
        operands,
    )


def _while_loop(graph: GraphFunction, cond_gm, body_gm, carried_inputs, additional_inputs):
    """`torch._higher_order_ops.while_loop` as `lax.while_loop` (forward only, like PyTorch's)."""
    keep_going, body = graph.subgraph(cond_gm), graph.subgraph(body_gm)
    extra = tuple(additional_inputs)

    def condition(carried):
        result = keep_going(*carried, *extra)
        if isinstance(result, (list, tuple)):
            (result,) = result
        return jnp.reshape(result, ()).astype(bool)

    return jax.lax.while_loop(condition, lambda carried: tuple(body(*carried, *extra)), tuple(carried_inputs))


_HIGHER_ORDER = {
    torch.ops.higher_order.cond: _cond,
    torch.ops.higher_order.while_loop: _while_loop,
    INVOKE_SUBGRAPH: None,  # GraphFunction._evaluate / scan.Run (needs the random key state)
    AUTO_FUNCTIONALIZED: None,  # GraphFunction._call_writing_region (of invoke_subgraph only)
}


def _shape_matches(shape, expected) -> bool:
    """Concrete `shape` against metadata whose symbolic dims (SymInt) match anything."""
    return len(shape) == len(expected) and all(
        not isinstance(want, int) or got == want for got, want in zip(shape, expected)
    )


def _fetch_attr(gm: torch.fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _map_nodes(value, env: dict):
    """Replace every fx Node inside `value` (nested lists/tuples/dicts) by its computed value."""
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_map_nodes(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _map_nodes(v, env) for k, v in value.items()}
    return value


def fx_to_jax(gm: torch.fx.GraphModule, name: str = "graph") -> GraphFunction:
    """`gm` as a plain (traceable, not yet jitted) JAX function; see `GraphFunction`."""
    return GraphFunction(gm, name)


def compile_graph(
    gm: torch.fx.GraphModule,
    name: str,
    donate: tuple[int, ...] = (),
    fn: "GraphFunction | None" = None,
    rows_as_views: bool = False,
) -> Program:
    """`gm` as a `Program`: jitted per input signature, cached, counted under `name`.
    `donate`: array argument positions whose buffers the program may reuse; `fn`: the
    graph's function if already built (a donating twin of another program);
    `rows_as_views`: see `Program`."""
    fn = fn or GraphFunction(gm, name)
    return GraphProgram(fn, name, lambda: gm.print_readable(print_output=False), donate, rows_as_views)


class GraphProgram(Program):
    """A `Program` of a `GraphFunction` (or of one taking rows, `rows.RowLayout`), which
    knows whether it needs a random key."""

    def __init__(self, fn, name: str, source, donate: tuple[int, ...] = (), rows_as_views: bool = False):
        super().__init__(name, fn, source, donate, rows_as_views=rows_as_views)
        self.graph_fn = fn

    @property
    def needs_rng(self) -> bool:
        return self.graph_fn.needs_rng


__all__ = [
    "GraphFunction",
    "GraphProgram",
    "UnsupportedGraphError",
    "compile_graph",
    "fx_to_jax",
    "is_covered",
    "lowering_for",
    "missing_lowerings",
    "runs_higher_order",
]
