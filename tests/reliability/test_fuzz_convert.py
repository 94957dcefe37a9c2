"""Converter fuzzing: random small graphs (tests/reliability/graphs.py), converted with
`litert_torch.convert`, run in LiteRT and compared with PyTorch by the project's metric
(`tests.helpers.assert_converts`: max relative error <= 1e-4 or max abs error <= 1e-5;
integer outputs exact).

Each hypothesis example is a batch of programs placed side by side in one module
(`graphs.Forest`): one conversion checks all of them (a small conversion costs ~1-2 s,
almost all of it torch.export and decomposition). When a batch fails, each program is
converted alone to name the culprit; hypothesis then shrinks the batch.

The default suite runs a fixed, derandomized set (3 batches of 10 programs); the long run
takes its number of batches from the environment:

    RELIABILITY_FUZZ_BATCHES=50 .venv/bin/python -m pytest -q -s -m slow tests/reliability/test_fuzz_convert.py

Every failure is a finding: a refusal (`UnsupportedOpsError`) as much as any other
exception or a numeric mismatch. The generator only draws ops and arguments the converter
supports (docs/design/converter.md lists what it refuses), so a refusal here is a converter
bug, not an expected outcome.
"""

from __future__ import annotations

import collections
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import litert_torch
from tests.helpers import assert_converts
from tests.reliability.graphs import I32, Forest, Program, Spec, Value, forest_inputs, programs, sample_inputs

BATCH = 10
OUTCOMES: collections.Counter = collections.Counter()


def _check_one(spec, seed: int = 0) -> str | None:
    """The problem with one program (None when it converts and matches), with the weights
    and inputs it gets at position `seed` of a batch."""
    try:
        assert_converts(Program(spec, seed=seed), sample_inputs(spec, seed=seed), progress=False)
    except litert_torch.UnsupportedOpsError as e:
        return f"refused: {e}"
    except Exception as e:  # noqa: BLE001  (every other exception is a finding)
        return f"{type(e).__name__}: {e}"
    return None


def _check_batch(specs) -> None:
    try:
        assert_converts(Forest(specs), forest_inputs(specs), progress=False)
        OUTCOMES["programs matched PyTorch"] += len(specs)
        return
    except litert_torch.UnsupportedOpsError as e:
        OUTCOMES["batches refused"] += 1
        batch_error = f"refused: {e}"
    except Exception as e:  # noqa: BLE001
        batch_error = f"{type(e).__name__}: {e}"
    problems = [(s, p) for k, s in enumerate(specs) if (p := _check_one(s, seed=k))]
    OUTCOMES["programs failed"] += len(problems)
    assert not problems, "\n\n".join(f"{s}\n-> {p[:1500]}" for s, p in problems)
    # every program passes alone: then the batch's failure comes from combining them
    assert batch_error is None, (
        "the batch fails but each program passes alone:\n" + "\n\n".join(map(str, specs)) + f"\n-> {batch_error[:3000]}"
    )


# Programs the fuzz found failing, kept as regressions (each fixed in the converter).
FOUND = {
    # cumsum of int32 is int64; LiteRT's ABS kernel refuses INT64 ("Type INT64 is
    # unsupported by op Abs"): abs of int64 is now MAXIMUM(x, NEG(x)).
    "abs of an int64 cumsum": Spec(
        [Value((5, 2, 5, 3), I32)],
        [
            {"op": "cumsum", "dim": -2, "x": 0},
            {"op": "unary", "fn": "abs", "x": 1},
            {"op": "unary", "fn": "neg", "x": 2},
        ],
        [2, 3],
    ),
}


@pytest.mark.parametrize("name", list(FOUND))
def test_programs_the_fuzz_found(name):
    problem = _check_one(FOUND[name])
    assert problem is None, problem


_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


@settings(max_examples=3, derandomize=True, **_COMMON)
@given(st.lists(programs(max_steps=6), min_size=BATCH, max_size=BATCH))
def test_random_graphs_convert_and_match(specs):
    _check_batch(specs)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("RELIABILITY_FUZZ_BATCHES", "30")), **_COMMON)
@given(st.lists(programs(max_steps=10), min_size=BATCH, max_size=BATCH))
def test_random_graphs_long_run(specs):
    _check_batch(specs)


def teardown_module(module):
    if OUTCOMES:
        print(f"\nconverter fuzz outcomes: {dict(OUTCOMES)}")
