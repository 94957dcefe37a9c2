"""`benchmarks.generative.one_call_bench` on two families: a row that matches transformers
and a row refused by name, in the table's columns."""

from __future__ import annotations

import pytest

from benchmarks.generative import one_call_bench


def test_rows_say_same_ids_or_why_not(capsys):
    rows = one_call_bench.main(["causal LM: llama"])
    assert capsys.readouterr().out.startswith(one_call_bench.HEADER)
    exact, refused = rows
    assert exact.startswith("| causal LM: llama | same ids (2 rows) | ")
    assert float(exact.split("|")[3]) <= 1e-4
    assert refused.startswith("| causal LM: llama (dynamic rope) | refused: rope_type 'dynamic' switches")


def test_an_unknown_family_lists_the_names():
    with pytest.raises(SystemExit, match="no family name contains nosuch; names: causal LM: llama"):
        one_call_bench.main(["nosuch"])
