"""The family table (docs/llm_families.md): each transformers decoder family is exported
(prefill 8, cache 40) and either matches the model's own forward at every prefill and
decode step in LiteRT over 32 tokens (beyond 3x every sliding window, across chunk and
ring-buffer boundaries, max relative error <= 1e-4) or is refused with a reason.

The default suite runs a few families; `-m slow` runs the whole table and checks that
the doc says what the run found. Regenerate the doc with
`LLM_FAMILIES_WRITE=1 pytest -m slow tests/litert_torch/generative/test_families.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from benchmarks.families.causal_lm import FAMILIES, VOCAB, build, longest_window
from litert_torch.generative import UnsupportedModelError, export_generative
from runtimes.litert import max_relative_error
from tests.litert_torch.generative.test_generate import run_stepwise, torch_logits

DOC = Path(__file__).resolve().parents[3] / "docs" / "llm_families.md"
PREFILL, CACHE, TOTAL, PROMPT = 8, 40, 32, 11
TOLERANCE = 1e-4
# a refusal by default; a non-Llama layout with learned positions (20 s) under -m slow
DEFAULT = [pytest.param("gpt2", marks=pytest.mark.slow), "llama (dynamic rope)"]


def family_result(family: str) -> tuple[str, str]:
    """("exact", "max rel. error ...") or ("refused", the reason)."""
    model = build(family)
    try:
        edge = export_generative(model, prefill_len=PREFILL, cache_len=CACHE, progress=False)
    except UnsupportedModelError as e:
        return "refused", str(e).split(": ", 1)[-1]
    assert TOTAL > 3 * longest_window(model)
    ids = torch.randint(0, VOCAB, (1, TOTAL), generator=torch.Generator().manual_seed(2))
    expected = torch_logits(model, ids)[0]
    got = run_stepwise(edge, ids, PROMPT)
    errors = [max_relative_error(got[0][-1], expected[PREFILL - 1])]
    errors += [max_relative_error(g[-1], expected[pos]) for pos, g in enumerate(got[2:], start=PROMPT)]
    assert len(errors) == 1 + TOTAL - PROMPT
    worst = max(errors)
    assert worst <= TOLERANCE, (family, worst)
    return "exact", f"max rel. error {worst:.0e} over {len(errors)} steps"


def table(results: dict[str, tuple[str, str]]) -> str:
    lines = ["| family (transformers config) | model class | result | detail |", "| --- | --- | --- | --- |"]
    for family, (status, detail) in results.items():
        lines.append(f"| {family} | `{FAMILIES[family][1]}` | {status} | {detail} |")
    return "\n".join(lines)


def doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in FAMILIES:
            rows[cells[0]] = (cells[2], cells[3])
    return rows


@pytest.mark.parametrize("family", DEFAULT)
def test_family_exact_or_refused(family):
    status, detail = family_result(family)
    assert (status, _reason(detail)) == (doc_rows()[family][0], _reason(doc_rows()[family][1]))


def _reason(detail: str) -> str:
    # numbers of an exact row vary with the machine's float rounding; refusals must match word for word
    return "" if detail.startswith("max rel. error") else detail


@pytest.mark.slow
def test_the_family_table_is_what_the_run_finds():
    results = {family: family_result(family) for family in FAMILIES}
    assert sum(s == "exact" for s, _ in results.values()) >= 15
    if os.environ.get("LLM_FAMILIES_WRITE"):
        text = DOC.read_text()
        start, end = text.index("<!-- table -->"), text.index("<!-- /table -->")
        DOC.write_text(text[:start] + "<!-- table -->\n" + table(results) + "\n" + text[end:])
    rows = doc_rows()
    assert list(rows) == list(results), "docs/llm_families.md lists other families"
    for family, (status, detail) in results.items():
        assert (status, _reason(detail)) == (rows[family][0], _reason(rows[family][1])), family
