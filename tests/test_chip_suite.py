"""`python -m tools.chip_suite`: slices that cover the suite once, and one summary of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import chip
from tools import chip_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_slices_are_contiguous_cover_every_test_once_and_balance_the_weight():
    weights = [1.0] * 10 + [30.0] + [1.0] * 9  # one slow test
    parts = chip_suite.split(weights, 3)
    assert [i for part in parts for i in part] == list(range(20))
    sums = [sum(weights[i] for i in part) for part in parts]
    assert sums == [10.0, 30.0, 9.0]  # the slow test alone in its part, the rest shared
    few = chip_suite.split([1.0, 1.0], 4)  # more parts than tests: some are empty
    assert len(few) == 4 and [i for part in few for i in part] == [0, 1]
    assert chip_suite.parse_slice("2/6") == (2, 6)
    with pytest.raises(Exception, match="K must be between 1 and N"):
        chip_suite.parse_slice("7/6")


SAMPLE = """
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture broke")

    def test_passes():
        pass

    def test_fails():
        assert 1 == 2, "one is not two"

    def test_skipped():
        pytest.skip("not here")

    def test_setup_error(broken):
        pass

    @pytest.mark.parametrize("i", range(4))
    def test_many(i):
        pass

    @pytest.mark.slow
    def test_slow():
        pass
"""


def _slice(tmp_path, spec: str, *extra: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out" / spec.replace("/", "-of-")
    return subprocess.run(
        [sys.executable, "-m", "tools.chip_suite", "--slice", spec, "--out", str(out), *extra],
        cwd=ROOT,
        env=chip.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_two_slices_record_every_outcome_and_merge_into_one_table(tmp_path):
    sample = tmp_path / "sample" / "test_sample.py"
    sample.parent.mkdir()
    sample.write_text(textwrap.dedent(SAMPLE))
    for spec in ("1/2", "2/2"):
        # the rootdir pinned: pytest otherwise takes the common ancestor of the checkout and
        # tmp_path when they share one below / (a checkout under /tmp: ids "pytest-of-.../...")
        done = _slice(tmp_path, spec, "--paths", str(sample), "--", "-m", "not slow", f"--rootdir={sample.parent}")
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*/slice-*.json"))]
    ran = [set(r["tests"]) for r in results]
    # every test once, the slow one in neither (sliced after pytest's own deselection)
    assert len(results) == 2 and not ran[0] & ran[1] and len(ran[0] | ran[1]) == 8
    assert [r["selected"] for r in results] == [len(r) for r in ran] and all(ran)
    assert all((tmp_path / "out").glob("*/slice-*.xml"))  # pytest's junit XML beside each

    table = chip_suite.merge([str(tmp_path / "out")])
    assert "| test_sample.py | 5 | 1 | 1 | 1 |" in table, table
    assert "| **total** | **5** | **1** | **1** | **1** |" in table
    assert "one is not two" in table and "fixture broke" in table

    # a slice that never came back is named
    for path in (tmp_path / "out").glob("2-of-2/*"):
        path.unlink()
    assert "Slices missing: 2/2." in chip_suite.merge([str(tmp_path / "out")])


def test_a_slice_past_its_budget_stops_and_lists_what_it_did_not_run(tmp_path):
    sample = tmp_path / "sample" / "test_sample.py"
    sample.parent.mkdir()
    sample.write_text(textwrap.dedent(SAMPLE))
    done = _slice(tmp_path, "1/1", "--paths", str(sample), "--budget", "0", "--", "-m", "not slow")
    assert done.returncode != 0 or "budget" in done.stdout, done.stdout[-3000:]
    (result,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/slice-*.json")]
    assert len(result["tests"]) == 1 and len(result["not_run"]) == 7
    assert "Not run (past the slice's budget): 7 tests" in chip_suite.merge([str(tmp_path / "out")])
