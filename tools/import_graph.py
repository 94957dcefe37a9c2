"""Import edges between the project's modules, and the circles they make.

`python -m tools.import_graph [PACKAGE ...]` reads every module of the named packages
(default: every top-level package of the repository but `tests`) with `ast`, without
importing anything, and prints:

- the strongly connected components of the module-level import graph (a component of
  more than one module is a circle: each of its modules needs another to be importable);
- the components once lazy imports (inside a function) count too, with the lazy imports
  inside each: they run back up a floor. Python tolerates them at run time, but in design
  terms they are circles too;
- with `--edges`, every edge (`-> ` module-level, `~> ` lazy) with its line.

An edge goes to the most specific module a statement names: `from a.b import c` is an edge
to `a.b.c` when that is a module, else to `a.b` (the package's `__init__`). The parent
packages Python also imports on the way are not edges (every module would otherwise
depend on its package's `__init__`). Imports under `if TYPE_CHECKING:` never run and are
skipped; so are `importlib.import_module` strings.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function: runs when called, not when the module is imported


def project_packages(root: str = ROOT) -> list[str]:
    """The repository's top-level packages (folders with an `__init__.py`), tests excluded."""
    return sorted(
        name for name in os.listdir(root) if name != "tests" and os.path.isfile(os.path.join(root, name, "__init__.py"))
    )


def module_files(packages: list[str], root: str = ROOT) -> dict[str, str]:
    """Dotted module name -> file path, for every `.py` file under the packages."""
    modules = {}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(folder, d, "__init__.py")))
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
                    modules[dotted.removesuffix(".__init__")] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Yield (import node, lazy) for every import that can run, in source order."""

    def walk(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy)
            else:
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                yield from walk(child, inner)

    yield from walk(tree, False)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules) -> list[str]:
    """The project modules one import statement names (see the module docstring)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            parent = parts if is_package else parts[:-1]
            parent = parent[: len(parent) - (node.level - 1)]
            base = ".".join(parent + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in modules:  # `import a.b.attr` style: the longest module prefix
            name = name.rpartition(".")[0]
        if name and name != module and name not in found:
            found.append(name)
    return found


def import_edges(packages: list[str] | None = None, root: str = ROOT) -> list[Edge]:
    """Every import edge between modules of the packages (module-level and lazy)."""
    modules = module_files(packages or project_packages(root), root)
    edges = []
    for module, path in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")
        for node, lazy in _import_nodes(tree):
            for target in _targets(node, module, is_package, modules):
                edges.append(Edge(module, target, node.lineno, lazy))
    return edges


def graph(edges: list[Edge], lazy: bool = False) -> dict[str, set[str]]:
    """Adjacency sets of the module-level edges (and the lazy ones too when `lazy`)."""
    adjacency: dict[str, set[str]] = {}
    for edge in edges:
        adjacency.setdefault(edge.target, set())
        if lazy or not edge.lazy:
            adjacency.setdefault(edge.source, set()).add(edge.target)
        else:
            adjacency.setdefault(edge.source, set())
    return adjacency


def strongly_connected(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (the circles), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(adjacency):
        if start in index:
            continue
        work = [(start, iter(sorted(adjacency[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(adjacency[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found, key=lambda c: (-len(c), c))


def path(adjacency: dict[str, set[str]], source: str, target: str) -> list[str] | None:
    """A shortest import path source -> ... -> target (breadth first), or None."""
    previous = {source: None}
    frontier = [source]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(adjacency.get(node, ())):
                if child not in previous:
                    previous[child] = node
                    if child == target:
                        chain = [child]
                        while previous[chain[-1]] is not None:
                            chain.append(previous[chain[-1]])
                        return chain[::-1]
                    following.append(child)
        frontier = following
    return None


def cycle_in(adjacency: dict[str, set[str]], component: list[str]) -> list[str]:
    """One circle through the component's first module: `a -> b -> ... -> a`."""
    start = component[0]
    members = set(component)
    inside = {node: adjacency[node] & members for node in component}
    for child in sorted(inside[start]):
        back = path(inside, child, start) if child != start else [start]
        if back:
            return [start] + back
    raise AssertionError(f"{component} is not strongly connected")


def design_circles(edges: list[Edge]) -> list[tuple[list[str], list[Edge]]]:
    """The circles once lazy imports count too, each with its lazy edges (those that run
    back up: without them the component would fall apart or shrink)."""
    found = []
    for component in strongly_connected(graph(edges, lazy=True)):
        members = set(component)
        lazy = [e for e in edges if e.lazy and e.source in members and e.target in members]
        found.append((component, lazy))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help="top-level packages (default: all but tests)")
    parser.add_argument("--edges", action="store_true", help="also print every edge")
    parser.add_argument("--root", default=ROOT, help="the repository to read (default: this one)")
    args = parser.parse_args(argv)
    edges = import_edges(args.packages or None, args.root)
    module_level = graph(edges)
    lazy = [e for e in edges if e.lazy]
    print(f"{len(module_level)} modules, {len(edges) - len(lazy)} module-level edges, {len(lazy)} lazy edges")
    if args.edges:
        for edge in edges:
            print(f"  {edge.source} {'~>' if edge.lazy else '->'} {edge.target}  (line {edge.line})")
    components = strongly_connected(module_level)
    print(f"\ncircles among module-level imports: {len(components)}")
    for component in components:
        print(f"  {len(component)} modules: {' '.join(component)}")
        print(f"    e.g. {' -> '.join(cycle_in(module_level, component))}")
    with_lazy = graph(edges, lazy=True)
    circles = design_circles(edges)
    print(f"\ncircles once lazy imports count too (a circle in design terms): {len(circles)}")
    for component, lazy_edges in circles:
        print(f"  {len(component)} modules: {' '.join(component)}")
        print(f"    e.g. {' -> '.join(cycle_in(with_lazy, component))}")
        for edge in lazy_edges:
            print(f"    lazy: {edge.source}:{edge.line} ~> {edge.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
