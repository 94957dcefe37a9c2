"""ExportedProgram -> IR Model: capture, lower (decomposing only what has no lowering), optimize.

`convert_module` is the whole front half of `litert_torch.convert`:

1. `export_module`: `torch.export.export` on a CPU, eval-mode view of the module.
   Parameters living on another device (the "tpu" device, CUDA...) are copied to CPU in
   a deep copy of the module (`cpu_view`); the user's module is never moved. The module is
   exported in eval mode (dropout off, batch norm on running statistics: what an
   inference artifact needs) unless `eval_mode=False`; its own training flags are
   restored afterwards. Export failures become an `ExportError` that says what to
   try. `source_lines=False` skips torch's per-node stack traces (~15% of the export;
   `convert()` does, and converts again with them only to name source lines in an error).
   Then `drop_runtime_checks` (converter/lowering/runtime_checks.py) removes the
   `torch._check`-style value checks the sample satisfies and refuses those it breaks
   (again after step 3, whose decompositions may add some).
2. `lower_program`, in one pass over the graph torch.export gives: placeholders become
   graph inputs (user inputs, named after the forward() arguments) or constants
   (parameters, buffers, lifted constants); each `call_function` node goes through the
   lowering registry, and a node without a lowering is decomposed on its own
   (`decompositions.trace_decomposition`) and its pieces lowered the same way; in-place
   ops lower as their functional variants. Outputs are flattened to `output_0, ...`.
   Every op without a lowering or decomposition is collected and reported once,
   together, in an `UnsupportedOpsError`.
3. Only where the direct pass cannot be exact (`direct_lowering_blocker`: a write into an
   input or buffer, or through an alias read later; nested graphs) or finds an op it
   cannot lower: `decompose` (`run_decompositions` with
   `converter.lowering.decompositions.decomposition_table()`, which functionalizes the
   whole program) and then `lower_program`.
4. `converter.passes.optimize`: the graph passes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import operator
import re
import warnings
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

import converter.lowering  # noqa: F401  (importing it registers every lowering family)
from common.messages import a_type
from converter import ir
from converter.errors import ConversionError, ExportError, UnsupportedOp, UnsupportedOpsError
from converter.lowering import decompositions, symbolic
from converter.lowering.context import LoweringContext, numpy_dtype, static_shape
from converter.lowering.registry import find_lowering
from converter.lowering.runtime_checks import drop_runtime_checks
from converter.progress import Progress
from converter.source_lines import source_of, source_settings, user_frame_of, user_source  # noqa: F401  (public here)

# ---- 1. export -----------------------------------------------------------------------------


def _on_cpu(t: torch.Tensor) -> bool:
    return t.device.type in ("cpu", "meta")


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of `module`, each once (tied weights), in one walk over
    its submodules (`parameters()` and `buffers()` would walk them twice)."""
    tensors: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                tensors.setdefault(id(t), t)
    return list(tensors.values())


def cpu_view(module: torch.nn.Module, tensors: list[torch.Tensor] | None = None) -> torch.nn.Module:
    """`module` itself when every parameter and buffer (`tensors`, if already listed by
    `module_tensors`) is on CPU; otherwise a deep copy whose tensors are CPU copies (tied
    weights stay tied: the copy is keyed by identity, so device tensors are never
    deep-copied through their own backend)."""
    if all(_on_cpu(t) for t in (module_tensors(module) if tensors is None else tensors)):
        return module
    memo: dict[int, Any] = {}
    for p in module.parameters():
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(p.detach().to("cpu"), requires_grad=p.requires_grad)
    for b in module.buffers():
        if id(b) not in memo:
            memo[id(b)] = b.detach().to("cpu")
    return copy.deepcopy(module, memo)


def _to_cpu(value):
    return torch.utils._pytree.tree_map(
        lambda v: v.detach().to("cpu") if isinstance(v, torch.Tensor) and not _on_cpu(v) else v, value
    )


def _export_hints(error: Exception, strict: bool, dynamic: bool) -> list[str]:
    text = f"{type(error).__name__}: {error}"
    hints = []
    if re.search(r"data.dependent|GuardOnDataDependent|Could not guard on data-dependent", text, re.I):
        hints.append(
            "the model branches on tensor VALUES (data-dependent control flow): rewrite it with "
            "torch.where / torch.cond, or move that logic out of forward()"
        )
    if re.search(r"Constraints violated|dynamic_shapes|specializ|Dim\(", text):
        hints.append(
            "a dimension marked dynamic was specialized or mis-specified: check dynamic_shapes "
            "(torch.export.Dim ranges; torch.export wants one entry per input, keyword inputs included: "
            "a dict by forward()'s argument names, e.g. {'ids': {0: batch}, 'use_cache': None})"
        )
    hints.append(f"retry with strict_export={not strict} (the other torch.export tracing mode)")
    if not dynamic:
        hints.append("check that sample_args match what forward() expects (count, shapes, dtypes)")
    return hints


@contextlib.contextmanager
def _stack_traces(record: bool):
    """torch's per-node stack traces off while exporting when not `record` (the switch
    `torch.fx.config.do_not_emit_stack_traces`; a torch without it always records them)."""
    config = getattr(torch.fx, "config", None)
    before = getattr(config, "do_not_emit_stack_traces", None)
    if record or before is None:
        yield
        return
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def _dynamic_shapes_by_name(module, args: tuple, kwargs: dict | None, dynamic_shapes):
    """torch.export wants one dynamic_shapes entry per input, keyword inputs included. The
    tuple form with one entry per positional arg (what `convert(m, (ids,), {"use_cache":
    False}, dynamic_shapes=({0: batch},))` reads as) becomes the dict form by forward()'s
    argument names, the keyword inputs static (None). Anything else goes to torch as given."""
    if not kwargs or not isinstance(dynamic_shapes, (tuple, list)) or len(dynamic_shapes) != len(args):
        return dynamic_shapes
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return dynamic_shapes
    named_positional = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[: len(args)])
    if len(parameters) < len(args) or not named_positional:
        return dynamic_shapes
    by_position = {p.name: shapes for p, shapes in zip(parameters, dynamic_shapes)}
    return {name: by_position.get(name) for name in bound.arguments}


def export_module(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    dynamic_shapes=None,
    strict_export: bool = False,
    eval_mode: bool = True,
    tensors: list[torch.Tensor] | None = None,
    source_lines: bool = True,
) -> ExportedProgram:
    """`torch.export.export` of a CPU, (by default) eval-mode view of `module` (`tensors`:
    its `module_tensors`, when the caller has them). `source_lines=False` skips torch's
    per-node stack traces (about 15% of torch.export's time): the ops then carry no
    source line for error messages."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert() expects a torch.nn.Module, got {type(module).__name__}")
    target = cpu_view(module, tensors)
    dynamic_shapes = _dynamic_shapes_by_name(module, tuple(args), kwargs, dynamic_shapes)
    modes = {m: m.training for m in target.modules()}
    if eval_mode:
        target.eval()
    try:
        with _stack_traces(source_lines):
            return torch.export.export(
                target,
                _to_cpu(tuple(args)),
                _to_cpu(dict(kwargs or {})),
                dynamic_shapes=dynamic_shapes,
                strict=strict_export,
            )
    except Exception as e:  # noqa: BLE001  (torch.export raises many unrelated types)
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        where = user_frame_of(e)
        where = f"\nat {where}" if where else ""
        hints = _export_hints(e, strict_export, dynamic_shapes is not None)
        recurrent = [name for name, m in target.named_modules() if isinstance(m, torch.nn.RNNBase)]
        if recurrent and dynamic_shapes is not None:
            hints.insert(
                0,
                f"recurrent layer(s) {', '.join(recurrent) or type(target).__name__} (nn.LSTM/nn.GRU) "
                "fix the sequence length when exported: keep the time dim static (batch may be dynamic)",
            )
        hints = "\n".join(f"  - {h}" for h in hints)
        raise ExportError(
            f"torch.export could not capture {type(module).__name__}.forward "
            f"(strict={strict_export}): {type(e).__name__}: {first_line}{where}\nWhat to try:\n{hints}"
        ) from e
    finally:
        for m, training in modes.items():
            m.training = training


def decompose(program: ExportedProgram) -> ExportedProgram:
    """Apply our decomposition table (a full re-trace of the program: on MobileNetV2 an
    empty table costs 80% of the full one, so this stage dominates conversion time)."""
    from converter.lowering.decompositions import decomposition_table

    try:
        with warnings.catch_warnings():
            # torch's own deep copy of the program's pytree specs warns (torch 2.13); not ours to fix.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
            return program.run_decompositions(decomposition_table())
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"decomposing the exported graph failed: {type(e).__name__}: {e}") from e


# ---- 3. lowering ----------------------------------------------------------------------------


def _op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.linalg_det.default"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)


class _Missing:
    """Stands for the value of a node that could not be lowered (so later nodes are
    skipped instead of failing, and the walk can report every unsupported op)."""


_MISSING = _Missing()


def _map_args(value, env: dict):
    """Replace fx Nodes with their IR values, recursively, as plain lists/tuples/dicts."""
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        mapped = [_map_args(v, env) for v in value]
        return tuple(mapped) if isinstance(value, tuple) else mapped
    if isinstance(value, dict):
        return {k: _map_args(v, env) for k, v in value.items()}
    return value


def _contains_missing(value) -> bool:
    if value is _MISSING:
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains_missing(v) for v in value)
    if isinstance(value, dict):
        return any(_contains_missing(v) for v in value.values())
    return False


def _constant(name: str, value) -> ir.Tensor:
    if isinstance(value, torch.nn.Parameter):
        value = value.data
    if not isinstance(value, torch.Tensor):
        raise ConversionError(f"constant '{name}' is {a_type(value)}; only tensors can be stored in the model")
    t = value.detach() if value.requires_grad else value  # (detach and a no-op .to cost per weight)
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.dtype == torch.bfloat16:
        t = t.float()  # TFLite computes bf16 graphs in float32 (see lowering.context)
    data = np.asarray(t.contiguous().numpy(), order="C")  # (np.ascontiguousarray would make 0-d 1-d)
    data = data.astype(numpy_dtype(value.dtype), copy=False)
    return ir.Tensor(name, data.shape, data.dtype, data=data)


def _tag_module(ops: list[ir.Op], node: torch.fx.Node) -> None:
    """Record on `ops` the innermost nn.Module path that called `node` ("layer1.0.conv1"),
    so quantization can keep named layers in float."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return
    path = str(list(stack.values())[-1][0])
    path = path.removeprefix("L['self'].").removeprefix("L__self__.")
    for op in ops:
        op.module = path


def lower_program(program: ExportedProgram, *, name: str = "serving_default") -> ir.Graph:
    """Lower an ExportedProgram (as `torch.export` gives it, or decomposed) to one IR graph.

    One pass over the graph: a node with a lowering is lowered; one without is decomposed
    on its own (`decompositions.trace_decomposition`) and its decomposition lowered the
    same way. In-place ops (`relu_`, `add_`) lower as their functional variants and
    rebind the value they overwrite; `direct_lowering_blocker` says when that is not
    exact (callers then decompose the whole program first, see `convert_module`)."""
    graph = ir.Graph(name=name)
    ctx = LoweringContext(graph)
    sig = program.graph_signature
    input_kinds = {spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")}
    walk = _GraphWalk(graph, ctx)
    env: dict[torch.fx.Node, Any] = {}
    live = _live_nodes(program.graph)  # values nobody reads are never lowered (side effects stay)
    for node in program.graph.nodes:
        if node not in live:
            continue
        if node.op == "placeholder":
            env[node] = _placeholder(node, input_kinds.get(node.name), program, graph, ctx)
        elif node.op == "call_function":
            walk.lower_node(node, env)
        elif node.op == "output":
            if not walk.unsupported:
                _set_outputs(node, sig, env, graph, ctx, _output_names(program))
        else:
            raise ConversionError(f"unexpected fx node kind '{node.op}' ({node.name}) in the exported graph")
    if walk.unsupported:
        raise UnsupportedOpsError(list(walk.unsupported.values()))
    return graph


def _live_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes `graph.eliminate_dead_code()` would keep: impure ones and those read by a
    kept node (found without editing the program's graph, nor checking every node)."""
    live: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if not live.isdisjoint(node.users) or node.is_impure():
            live.add(node)
    return live


# Decompositions nest (an op decomposes to ops that decompose...); a decomposition that
# never bottoms out is reported as unsupported, not followed forever.
_MAX_DECOMPOSITION_DEPTH = 16


class _GraphWalk:
    """Lowers call_function nodes into `graph`, decomposing those without a lowering."""

    def __init__(self, graph: ir.Graph, ctx: LoweringContext):
        self.graph, self.ctx = graph, ctx
        self.unsupported: dict[str, UnsupportedOp] = {}
        self._traces: dict[Any, torch.fx.GraphModule] = {}  # decompositions of equal static calls, traced once
        self._source_settings = source_settings()  # (read once: getcwd per node is a cost)

    def record_unsupported(self, node, source: str | None, reason: str | None = None, target=None):
        name = _op_name(target if target is not None else node.target)
        entry = self.unsupported.setdefault(name, UnsupportedOp(name))
        entry.count += 1
        if source:
            entry.sources.append(source)
        if reason:
            entry.reasons.append(reason)

    def lower_node(self, node: torch.fx.Node, env: dict, origin: torch.fx.Node | None = None, depth: int = 0):
        """Set env[node]. `origin` is the exported graph's node that `node`'s decomposition
        came from (its source line and module path are the user's)."""
        origin = origin or node
        args = _map_args(node.args, env)
        # A value is missing only after an op was reported unsupported: skip the checks till then.
        if node.target is operator.getitem:
            env[node] = _MISSING if self.unsupported and _contains_missing(args[0]) else args[0][args[1]]
            return
        kwargs = _map_args(node.kwargs, env)
        target = decompositions.functional_variant(node.target)
        if target is None:  # direct_lowering_blocker keeps such graphs away
            raise ConversionError(
                f"{_op_name(node.target)} (node '{node.name}') writes into an argument in a way "
                "that needs functionalization"
            )
        lowering = find_lowering(target)
        source = source_of(origin.meta.get("stack_trace") or "", *self._source_settings)
        if self.unsupported and _contains_missing((args, kwargs)):
            # An input could not be lowered (already reported); still report this op if
            # nothing could ever lower it.
            if lowering is None and decompositions.decomposition_for(target) is None:
                self.record_unsupported(node, source, target=target)
            env[node] = _MISSING
            return
        reason = None
        if lowering is not None:
            self.ctx.node, self.ctx.source = node, source
            first_new_op = len(self.graph.ops)
            try:
                value = lowering(self.ctx, *args, **kwargs)
            except NotImplementedError as e:
                reason = str(e) or None  # this call needs the general form: decompose it
            except ConversionError:
                raise
            except Exception as e:  # noqa: BLE001  (a lowering bug: name the op and the user line)
                where = f" (from {source})" if source else ""
                raise ConversionError(
                    f"lowering {_op_name(node.target)} (node '{node.name}'){where} failed: {type(e).__name__}: {e}"
                ) from e
            else:
                _tag_module(self.graph.ops[first_new_op:], origin)
                self._set(node, target, value, env)
                return
        if depth < _MAX_DECOMPOSITION_DEPTH and decompositions.decomposition_for(target) is not None:
            try:
                traced = self._trace(node, target)
            except Exception as e:  # noqa: BLE001  (the decomposition refused these arguments)
                reason = f"its decomposition failed: {type(e).__name__}: {str(e).strip()[:200]}"
            else:
                self._set(node, target, self._lower_decomposition(node, traced, env, origin, depth), env)
                return
        self.record_unsupported(node, source, reason, target=target)
        env[node] = _MISSING

    def _set(self, node: torch.fx.Node, target, value, env: dict) -> None:
        env[node] = value
        if node.target is not target:
            env[node.args[0]] = value  # in place: later reads of the written tensor see the new value

    def _lower_decomposition(self, node: torch.fx.Node, traced: torch.fx.GraphModule, env: dict, origin, depth: int):
        inner: dict[torch.fx.Node, Any] = {}
        # The trace's placeholders are the node's Node arguments, in pytree order.
        leaves = [
            leaf
            for leaf in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
            if isinstance(leaf, torch.fx.Node)
        ]
        result = None
        phs = iter(leaves)
        for sub in traced.graph.nodes:
            if sub.op == "placeholder":
                inner[sub] = env[next(phs)]
            elif sub.op == "call_function":
                self.lower_node(sub, inner, origin, depth + 1)
            elif sub.op == "output":
                result = _map_args(sub.args[0], inner)
        return _MISSING if self.unsupported and _contains_missing(result) else result

    def _trace(self, node: torch.fx.Node, target) -> torch.fx.GraphModule:
        key = _static_call_key(target, node)
        traced = self._traces.get(key) if key is not None else None
        if traced is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = decompositions.trace_decomposition(target, node.args, node.kwargs)
                if _mutation_blocker(traced.graph) is not None:  # a composite kernel writing into views
                    traced = decompositions.trace_decomposition(target, node.args, node.kwargs, functional=True)
            blocker = _mutation_blocker(traced.graph)
            if blocker is not None:
                raise NotImplementedError(f"its decomposition {blocker}")
            if key is not None:
                self._traces[key] = traced
        return traced


def _static_call_key(target, node: torch.fx.Node):
    """A hashable description of a call whose arguments are all static (tensors by shape
    and dtype), or None: equal keys decompose to the same graph."""
    parts = [target]
    for leaf in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(leaf, torch.fx.Node):
            val = leaf.meta.get("val")
            if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
                return None
            parts.append((tuple(val.shape), val.dtype, tuple(val.stride())))
        elif isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:
            parts.append((type(leaf), leaf))
    parts.append(torch.utils._pytree.tree_structure((node.args, node.kwargs)))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


def direct_lowering_blocker(program: ExportedProgram) -> str | None:
    """Why `program`'s graph cannot be lowered as `torch.export` gives it, or None.

    The graph is not functionalized: in-place ops write into their first argument.
    Lowering `y = x.relu_()` as `y = relu(x)` and reading x's later uses as y is exact
    when nothing else can observe the write: x is not an input, parameter or buffer
    (their writes are outputs of the program), and no other alias of x (a view of it,
    the tensor it views, an earlier in-place result) is read after the write. Other
    mutations, nested graphs (torch.cond, autocast or no_grad regions) need
    `run_decompositions` (functionalization) first."""
    return _mutation_blocker(program.graph)


def _mutation_blocker(graph: torch.fx.Graph) -> str | None:
    """`direct_lowering_blocker` for one fx graph (placeholders are its inputs)."""
    nodes = list(graph.nodes)
    root: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(n):
        while root.get(n, n) is not n:
            n = root[n]
        return n

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra is not rb:
            root[ra] = rb

    writes = []
    for node in nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function" or isinstance(node.target, torch._ops.HigherOrderOperator):
            return f"{node.op} {node.target}: a nested graph"
        if node.target is operator.getitem:
            if isinstance(node.args[0], torch.fx.Node) and _returns_alias(node.args[0].target):
                union(node, node.args[0])
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        for i in _aliased_arguments(node.target):
            if i < len(node.args) and isinstance(node.args[i], torch.fx.Node):
                union(node, node.args[i])
        functional = decompositions.functional_variant(node.target)
        if functional is None:
            return f"{node.target} writes into an argument"
        if functional is not node.target:
            if not isinstance(node.args[0], torch.fx.Node):
                return f"{node.target} writes into a constant"
            writes.append(node)
    if not writes:
        return None
    order = {n: i for i, n in enumerate(nodes)}
    last_read = {n: max((order[u] for u in n.users), default=order[n]) for n in nodes}
    classes: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in nodes:
        classes.setdefault(find(n), []).append(n)
    for write in writes:
        written = write.args[0]
        for alias in classes[find(written)]:
            if alias.op == "placeholder":
                return f"{write.target} writes into input '{alias.name}'"
            if alias is not written and order[alias] < order[write] < last_read[alias]:
                return f"{write.target} writes into '{written.name}', whose alias '{alias.name}' is read later"
    return None


@functools.cache  # per op overload: the schema walk is the cost of the check
def _aliased_arguments(op: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the arguments that one of `op`'s results may alias (a view's input,
    the tensor an in-place op writes)."""
    schema = op._schema
    returned = set()
    for out in schema.returns:
        if out.alias_info is not None:
            returned |= set(out.alias_info.before_set)
    return tuple(
        i
        for i, arg in enumerate(schema.arguments)
        if arg.alias_info is not None and set(arg.alias_info.before_set) & returned
    )


def _returns_alias(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and any(r.alias_info is not None for r in target._schema.returns)


def _placeholder(node, spec, program: ExportedProgram, graph: ir.Graph, ctx: LoweringContext):
    kind = spec.kind if spec is not None else InputKind.USER_INPUT
    if kind == InputKind.USER_INPUT:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return val  # a non-tensor user input was specialized into the graph
        shape, signature = static_shape(val.shape)
        tensor = ir.Tensor(ctx.unique_name(node.name), shape, numpy_dtype(val.dtype), shape_signature=signature)
        graph.inputs.append(tensor)
        graph.input_names.append(node.name)
        symbolic.register_input(ctx, tensor, val.shape)  # which input dims define the size symbols
        return tensor
    if kind in (InputKind.PARAMETER, InputKind.BUFFER):
        value = program.state_dict.get(spec.target)
        if value is None:
            value = program.constants[spec.target]  # non-persistent buffer
        return _constant(ctx.unique_name(spec.target), value)
    if kind == InputKind.CONSTANT_TENSOR:
        return _constant(ctx.unique_name(spec.target), program.constants[spec.target])
    raise ConversionError(
        f"input '{node.name}' is a {kind.name} (custom objects and tokens cannot be stored in a .tflite model)"
    )


def _output_names(program: ExportedProgram) -> list[str] | None:
    """Names of forward()'s flattened outputs from its return structure: dict keys (and
    attribute names of output dataclasses), joined with "_" and list positions where
    nested ("logits", "hidden_states_1"; a top-level tuple position reads "output_1"). None when no key names anything (plain
    tensors and tuples keep output_0, output_1, ...)."""
    from torch.utils import _pytree as pytree

    # (what `program.call_spec.out_spec` reads, without the NamedTuple class it defines per call)
    calls = program.module_call_graph
    spec = calls[0].signature.out_spec if calls and calls[0].signature is not None else None
    if spec is None:
        return None
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))
    names = []
    for path, _leaf in paths:
        parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        if path and isinstance(path[0], pytree.SequenceKey):  # (x, {"a": y}) -> output_0, output_1_a
            parts[0] = f"output_{parts[0]}"
        names.append("_".join(parts))
    named = any(isinstance(k, (pytree.MappingKey, pytree.GetAttrKey)) for path, _ in paths for k in path)
    if not named or len(set(names)) != len(names):
        return None
    return names


def _set_outputs(node, sig, env, graph: ir.Graph, ctx: LoweringContext, names: list[str] | None = None) -> None:
    values = list(node.args[0])
    specs = sig.output_specs
    for value, spec in zip(values, specs):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue  # buffer mutations (e.g. batch-norm statistics) do not exist at inference
        out = env[value] if isinstance(value, torch.fx.Node) else value
        if isinstance(out, (int, float, bool)) and not isinstance(out, torch.SymInt):
            out = ctx.const(np.asarray(out), name=f"output_{len(graph.outputs)}")
        position = len(graph.output_names)  # among the user's outputs, as `names` counts them
        if not isinstance(out, ir.Tensor):
            which = f"'{names[position]}'" if names and position < len(names) else str(position)
            raise ConversionError(
                f"output {which} of forward() is {a_type(out)}; only tensors (and numbers) can be model outputs"
                " (return only the outputs that hold tensors)"
            )
        graph.outputs.append(out)
        graph.output_names.append(names[position] if names and position < len(names) else f"output_{position}")


# ---- 4. whole pipeline ------------------------------------------------------------------------


def optimize(model: ir.Model) -> ir.Model:
    """Run the graph passes (`converter.passes.optimize`)."""
    from converter.passes import optimize as run_passes

    return run_passes(model)


def convert_module(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    dynamic_shapes=None,
    strict_export: bool = False,
    eval_mode: bool = True,
    progress: Progress | None = None,
    run_passes: bool = True,
    name: str = "serving_default",
    tensors: list[torch.Tensor] | None = None,
    source_lines: bool = True,
) -> ir.Model:
    """nn.Module + sample inputs -> optimized IR Model (one graph, named `name`: the
    SignatureDef key; `tensors`: the module's `module_tensors`, when the caller has them;
    `source_lines`: see `export_module`)."""
    progress = progress or Progress(False)
    with progress.stage("export", type(module).__name__):
        program = export_module(
            module,
            args,
            kwargs,
            dynamic_shapes=dynamic_shapes,
            strict_export=strict_export,
            eval_mode=eval_mode,
            tensors=tensors,
            source_lines=source_lines,
        )
    program = drop_runtime_checks(program, _to_cpu(tuple(args)), _to_cpu(dict(kwargs or {})))
    blocker = direct_lowering_blocker(program)
    if blocker is None:
        try:
            with progress.stage("lower"):
                graph = lower_program(program, name=name)
        except UnsupportedOpsError:
            blocker = "some op has no lowering"  # let the whole-program decomposition have a try
    if blocker is not None:
        with progress.stage("decompose", blocker):
            program = drop_runtime_checks(decompose(program), _to_cpu(tuple(args)), _to_cpu(dict(kwargs or {})))
        with progress.stage("lower"):
            graph = lower_program(program, name=name)
    model = ir.Model([graph])
    if run_passes:
        with progress.stage("optimize"):
            model = optimize(model)
    progress.note(f"{sum(len(g.ops) for g in model.graphs)} ops")
    return model
