"""Where a compiled program parts from eager: `find_divergence(fn, *args, **kwargs)`.

XLA compiles a whole graph at once and fuses across its ops, so a compiler bug shows up as a
compiled result that the same ops run one at a time on the same device do not give (on a
v5e a slice of a concatenated, broadcast `arange` came back 128 positions off: docs/tpu.md,
"What differs from CPU"). `find_divergence` runs `fn` once under `torch.compile` as backend
"tpu" does, and for every graph AOTAutograd makes (forward, backward, inference) also

- compiles a copy of the graph whose outputs are all of its nodes' values, and
- runs another copy op by op in eager mode, on copies of the graph's inputs;

it returns the nodes whose values differ, graph by graph in graph order: the first one is
where to look. `fn`'s own result is the ordinary compiled one. Random ops (dropout) differ
by design: turn them off first. Each graph compiles twice, so this is a debugging tool.

    from tpu_backend.compile import find_divergence
    for d in find_divergence(model, input_ids=ids, labels=ids):
        print(d)
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import torch

from tpu_backend.compile.backend import with_graph_compilers
from tpu_backend.compile.compiled_graph import compile_for_tpu


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One node whose compiled value is not its eager one."""

    graph: str  # "forward 0", "backward 0", "inference 1", ...
    node: str  # the node's name in the AOTAutograd graph
    op: str  # what it calls, e.g. "aten.slice.Tensor"
    difference: str  # the largest absolute difference, or why the values differ
    source: str  # the user code line that made the node, when the graph kept it

    def __str__(self) -> str:
        where = f"  ({self.source})" if self.source else ""
        return f"{self.graph}: {self.node} = {self.op}: {self.difference}{where}"


def find_divergence(fn, *args, rtol: float = 1e-5, atol: float = 1e-5, **kwargs) -> list[Divergence]:
    """The nodes of `fn`'s compiled graphs whose values differ from running the same graph
    op by op in eager mode (floats beyond `atol + rtol * |eager|`, anything else unequal).
    A call that also runs a backward (`fn` calling `.backward()`) checks that graph too."""
    found: list[Divergence] = []
    kinds = {kind: itertools.count() for kind in ("forward", "backward", "inference")}

    def make_compiler(name: str):
        kind = next(k for k in kinds if name.endswith(k))
        return lambda gm, example_inputs: _checked(gm, f"{kind} {next(kinds[kind])}", name, found, rtol, atol)

    def backend(gm, example_inputs, **options):
        return with_graph_compilers(gm, example_inputs, make_compiler, **options)

    torch.compile(fn, backend=backend)(*args, **kwargs)
    return found


def _every_node(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """A graph module over `gm`'s attributes returning the value of each of its nodes that
    computes a tensor (the graph is copied; its constants and subgraphs are shared)."""
    graph, copied = torch.fx.Graph(), {}
    graph.graph_copy(gm.graph, copied)
    nodes = [
        copied[n] for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    graph.output(tuple(nodes))
    return torch.fx.GraphModule(gm, graph), nodes


def _source(node: torch.fx.Node) -> str:
    """The innermost "file:line  code" of the node's stack trace, or ""."""
    lines = (node.meta.get("stack_trace") or "").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        found = re.match(r'\s*File "(.+)", line (\d+)', lines[i])
        if found:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{found[1]}:{found[2]}  {code}"
    return ""


def _checked(gm, graph: str, name: str, found: list, rtol: float, atol: float):
    """`gm` compiled as usual, checking its nodes against eager at each call."""
    compiled_nodes = compile_for_tpu(_every_node(gm)[0], f"{name}_every_node")
    eager, nodes = _every_node(gm)  # (copied before compile_for_tpu rewrites gm)
    program = compile_for_tpu(gm, name)

    def run(args: list) -> list:
        clones = [[a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args] for _ in range(2)]
        got = compiled_nodes(clones[0])
        with torch.no_grad():
            want = eager(*clones[1])
        for node, g, w in zip(nodes, got, want, strict=True):
            difference = _difference(g.detach().cpu(), w.detach().cpu(), rtol, atol)
            if difference is not None:
                found.append(Divergence(graph, node.name, str(node.target), difference, _source(node)))
        return program(args)

    run._boxed_call = True
    return run


def _difference(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    """How `got` differs from `want`, or None when it does not."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} against {want.dtype}{list(want.shape)}"
    if not (got.is_floating_point() or got.is_complex()):
        unequal = int((got != want).sum())
        return f"{unequal} of {got.numel()} values unequal" if unequal else None
    wide = torch.complex128 if got.is_complex() else torch.float64
    got, want = got.to(wide), want.to(wide)
    if torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True).all():
        return None
    finite = torch.isfinite(got) & torch.isfinite(want)
    largest = (got - want)[finite].abs().max().item() if finite.any() else 0.0
    return f"up to {largest:.3g} apart" if largest > 0 else "infinities or NaNs in other places"
