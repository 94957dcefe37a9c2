"""The shipped packages import in layers: no module imports another that needs it back.

Checked from the source (`tools/import_graph.py`, `ast` only), so a circle is named before
anything runs. Lazy imports (inside a function) count too: Python tolerates one that runs
back up, but it is the same circle in design terms. To break one, move the piece both
modules need into a module below them (`python -m tools.import_graph` lists the edges).
"""

from __future__ import annotations

import textwrap

import pytest

from tools import import_graph

# pyproject.toml's packages: what users import (benchmarks/, examples/ and tests/ sit on top)
SHIPPED = ["common", "converter", "kernels", "litert_torch", "runtimes", "tpu_backend"]


def circles(edges: list[import_graph.Edge], lazy: bool) -> list[str]:
    """Each circle as `a -> b -> ... -> a`, with the lazy imports inside it and their lines."""
    adjacency = import_graph.graph(edges, lazy=lazy)
    found = []
    for component in import_graph.strongly_connected(adjacency):
        members = set(component)
        lazy_lines = [
            f"    lazy: {e.source}:{e.line} ~> {e.target}"
            for e in edges
            if e.lazy and e.source in members and e.target in members
        ]
        found.append("\n".join([" -> ".join(import_graph.cycle_in(adjacency, component)), *lazy_lines]))
    return found


@pytest.fixture(scope="module")
def shipped_edges():
    return import_graph.import_edges(SHIPPED)


def test_no_circle_among_module_level_imports(shipped_edges):
    found = circles(shipped_edges, lazy=False)
    assert not found, "import circles among module-level imports:\n" + "\n".join(found)


def test_no_lazy_import_runs_back_up(shipped_edges):
    found = circles(shipped_edges, lazy=True)
    assert not found, (
        "import circles once lazy imports count (move what both sides need into a module below them):\n"
        + "\n".join(found)
    )


def test_a_circle_is_found_and_named(tmp_path):
    """The check itself: a package whose `low` lazily imports `high`, which imports `low`."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("from pkg.low import helper\nfrom . import leaf\n")
    (package / "leaf.py").write_text("")
    (package / "low.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from pkg import leaf  # never runs: not an edge

            def helper():
                from pkg import high
                return high
            """
        )
    )
    edges = import_graph.import_edges(["pkg"], str(tmp_path))
    assert {(e.source, e.target, e.lazy) for e in edges} == {
        ("pkg.high", "pkg.low", False),
        ("pkg.high", "pkg.leaf", False),
        ("pkg.low", "pkg.high", True),
    }
    assert circles(edges, lazy=False) == []
    assert circles(edges, lazy=True) == ["pkg.high -> pkg.low -> pkg.high\n    lazy: pkg.low:8 ~> pkg.high"]
