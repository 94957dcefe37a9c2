"""Runtime checks in an exported graph (`torch._check`, `torch._check_tensor_all`,
transformers' `torch_compilable_check`): dropped when the export's sample satisfies
them, refused naming the check when it does not.

A check on a tensor's values reaches the graph as a chain that computes nothing the
model returns: `_is_all_true` (or `_local_scalar_dense`, `.item()`) turns a tensor into a
scalar, sym ops compare it, and `_assert_scalar` / `_assert_async` /
`sym_constrain_range*` consume it. LiteRT has no assertion op and those scalars have no
lowering, so `drop_runtime_checks` evaluates each such chain on the sample (the
exported graph's own nodes, in eager PyTorch) and removes it:

- a check on constants only (parameters, buffers, shapes fixed at export) folds to a
  constant: dropped when true, refused when false (the file would compute on a model
  that fails its own check);
- a check on an input's values cannot be evaluated in the file: dropped when the sample
  satisfies it, with a warning naming the check and its source line (inputs that break
  it give whatever the arithmetic gives, as in PyTorch with the check disabled), refused
  when the sample breaks it.

A scalar read from a tensor that also feeds the computation (a data-dependent size) is
not a check: it is left for the lowering, which reports it as unsupported. Checks on
symbolic sizes alone (`_assert_scalar` on `sym_size` arithmetic, dynamic shapes) read
no tensor value and are left as they are (lowered as no-ops: the exported shape ranges
hold them).
"""

from __future__ import annotations

import warnings

import torch
from torch.export import ExportedProgram

from converter.errors import ConversionError
from converter.source_lines import user_source

aten = torch.ops.aten

# Nodes whose only effect is to raise.
CHECKS = {
    aten._assert_scalar.default,
    aten._assert_async.default,
    aten._assert_async.msg,
    aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
}

# Nodes that read a tensor's values into a Python scalar.
VALUE_READS = {
    aten._local_scalar_dense.default,
    aten._is_all_true.default,
    aten._assert_async.default,
    aten._assert_async.msg,
}


class RuntimeCheckWarning(UserWarning):
    """A check on input values was dropped: the LiteRT file cannot evaluate it."""


def _check_only_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Check nodes and the call_function nodes read only by them (the chains computing checks)."""
    only: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in CHECKS or (node.users and all(u in only for u in node.users)):
            only.add(node)
    return only


def _chain(check: torch.fx.Node, only: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The check-only nodes `check` is computed from, itself included."""
    seen, todo = {check}, [check]
    while todo:
        for arg in todo.pop().all_input_nodes:
            if arg in only and arg not in seen:
                seen.add(arg)
                todo.append(arg)
    return list(seen)


def _reads_user_values(nodes: list[torch.fx.Node], user_inputs: set[str]) -> bool:
    """Whether a value read in `nodes` depends on a user input's values (not only its shape)."""
    todo = [arg for n in nodes if n.target in VALUE_READS for arg in n.all_input_nodes]
    seen: set[torch.fx.Node] = set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder" and node.name in user_inputs:
            return True
        if node.target is not aten.sym_size.int:  # a size is fixed by the exported shape
            todo.extend(node.all_input_nodes)
    return False


def _expression(node, names: dict, depth: int = 4) -> str:
    """`node` as a short call expression over the model's inputs, parameters and buffers
    (`all(gt(spatial_shapes, 0))`); `names`: placeholder -> the model's name for it."""
    if not isinstance(node, torch.fx.Node):
        return repr(node)
    if node.op != "call_function" or depth == 0:
        return names.get(node.name, node.name)
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0].lstrip("_")
    return f"{name}({', '.join(_expression(a, names, depth - 1) for a in node.args)})"


def _described(check: torch.fx.Node, chain: list[torch.fx.Node], names: dict) -> str:
    """What the check reads (`all(gt(spatial_shapes, 0))`) and the user's line that made it."""
    reads = [n for n in chain if n.target in VALUE_READS]
    what = " and ".join(sorted({_expression(n.args[0], names) for n in reads}))
    source = next((s for s in map(user_source, [check, *reads]) if s), None)
    return what + (f" at {source}" if source else "")


class _CheckRun(torch.fx.Interpreter):
    """Runs the exported graph on the sample and records which checks fail."""

    def __init__(self, module, checks):
        super().__init__(module)
        self.checks, self.failed = checks, []

    def run_node(self, node):
        if node not in self.checks:
            return super().run_node(node)
        try:
            return super().run_node(node)
        except RuntimeError:
            self.failed.append(node)
            return None


def drop_runtime_checks(program: ExportedProgram, args: tuple, kwargs: dict | None = None) -> ExportedProgram:
    """Remove the value checks of `program` (module docstring) when `args`/`kwargs` (the
    export's sample) satisfy them; raise ConversionError naming each one they break.
    Edits the program's graph in place and returns it."""
    graph = program.graph
    only = _check_only_nodes(graph)
    checks = {}
    for node in graph.nodes:
        if node.target in CHECKS:
            chain = _chain(node, only)
            if any(n.target in VALUE_READS for n in chain):
                checks[node] = chain
    if not checks:
        return program
    flat = program._graph_module_flat_inputs(args, kwargs or {})
    run = _CheckRun(program.graph_module, set(checks))
    with torch.no_grad():
        run.run(*flat)
    sig = program.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    if run.failed:
        failed = sorted({_described(n, checks[n], names) for n in run.failed})
        lines = "\n".join(f"  - {d}" for d in failed)
        raise ConversionError(
            f"the export's sample fails {len(failed)} runtime check(s) of the model:\n{lines}\n"
            "Convert with a sample the model accepts (a check on parameters or buffers alone fails whatever the sample: "
            "the model itself breaks it)."
        )
    user_inputs = set(sig.user_inputs)
    on_inputs = {_described(n, chain, names) for n, chain in checks.items() if _reads_user_values(chain, user_inputs)}
    if on_inputs:
        shown = "\n".join(f"  - {d}" for d in sorted(on_inputs))
        warnings.warn(
            f"runtime check(s) on input values are not in the LiteRT file (it has no assertion op); the sample "
            f"satisfies them, inputs that do not are not refused on device:\n{shown}",
            RuntimeCheckWarning,
            stacklevel=3,
        )
    dropped = {n for chain in checks.values() for n in chain}
    for node in reversed(graph.nodes):
        if node in dropped and not node.users:
            graph.erase_node(node)
    program.graph_module.recompile()
    return program
