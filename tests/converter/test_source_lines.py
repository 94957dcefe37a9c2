"""The source line named for an op is the innermost frame outside torch, the standard
library and this project: for a model from a library (transformers, timm), the library's
line that made the op; LITERT_TORCH_SOURCE_CHAIN=1 shows the whole chain.
(torch.export records the `forward` frames of the call stack, so the innermost one is the
library module's forward that made the op.)"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from converter.pipeline import export_module, user_source


@pytest.fixture
def library_model(tmp_path, monkeypatch):
    """A model whose forward calls a function of a package installed in site-packages."""
    package = tmp_path / "site-packages" / "fakelib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "modeling.py").write_text(
        textwrap.dedent("""
        import torch

        class Scores(torch.nn.Module):
            def forward(self, q, k):
                return torch.cumsum(q * k, dim=-1)  # the op
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    from fakelib.modeling import Scores

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scores = Scores()

        def forward(self, q, k):
            return self.scores(q, k) + 1  # the user's line

    yield Wrapper()
    sys.modules.pop("fakelib.modeling", None)
    sys.modules.pop("fakelib", None)


def cumsum_node(module):
    program = export_module(module, (torch.randn(2, 3), torch.randn(2, 3)))
    return next(n for n in program.graph.nodes if n.op == "call_function" and "cumsum" in str(n.target))


def test_source_is_the_library_line_that_made_the_op(library_model, monkeypatch):
    monkeypatch.delenv("LITERT_TORCH_SOURCE_CHAIN", raising=False)
    source = user_source(cumsum_node(library_model))
    assert "fakelib" in source and "modeling.py:6 in forward" in source
    assert source.endswith("torch.cumsum(q * k, dim=-1)  # the op")


def test_source_chain_on_request_lists_outermost_to_innermost(library_model, monkeypatch):
    monkeypatch.setenv("LITERT_TORCH_SOURCE_CHAIN", "1")
    chain = user_source(cumsum_node(library_model)).split(" -> ")
    assert "test_source_lines.py" in chain[0] and "the user's line" in chain[0]
    assert "modeling.py:6 in forward" in chain[-1]
