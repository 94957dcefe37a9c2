"""The suite's one mechanism for what differs on a TPU chip (tests/chip.py, tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import chip


def test_helper_processes_stay_off_the_chip():
    env = chip.child_env(EXTRA="1")
    assert env["JAX_PLATFORMS"] == "cpu" and env["EXTRA"] == "1"
    done = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "cpu", done.stderr[-2000:]


def test_a_tolerance_names_a_known_difference(on_tpu):
    assert chip.tolerance("matmul_passes", cpu=1e-6, tpu=1e-4) == (1e-4 if on_tpu else 1e-6)
    with pytest.raises(KeyError, match="unknown chip difference 'fast_math'"):
        chip.tolerance("fast_math", cpu=0, tpu=1)


@pytest.mark.chip_difference("host_memory")
def test_a_marked_test_runs_off_the_chip_and_is_skipped_on_it():
    assert not chip.ON_TPU  # on a TPU the marker skips this, with the difference as the reason
