"""Setup shared by the whole test session.

The tpu device's compilation cache writes to `~/.cache/tpu_backend/xla` by default; a
test run gets a temporary folder instead (unless `TPU_CACHE_DIR` is already set), so
tests never fill the user's cache and never depend on what an earlier run left there.
The converter validates its IR after every graph pass (`LITERT_TORCH_VALIDATE_PASSES`),
so a pass that leaves a malformed graph fails the test that exercised it, by name.
On a TPU machine, `@pytest.mark.chip_difference(name)` skips a test with the named
difference of the chip as its reason, and the `on_tpu` fixture says where the suite runs
(`tests/chip.py` lists the differences).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests import chip

_session_cache: str | None = None


def pytest_configure(config):
    global _session_cache
    config.addinivalue_line(
        "markers", "chip_difference(name): skipped on a TPU, where the named difference (tests/chip.py) breaks it"
    )
    os.environ.setdefault("LITERT_TORCH_VALIDATE_PASSES", "1")
    if "TPU_CACHE_DIR" not in os.environ:
        _session_cache = tempfile.mkdtemp(prefix="tpu_xla_cache_")
        os.environ["TPU_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config):
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)
        os.environ.pop("TPU_CACHE_DIR", None)


def pytest_runtest_setup(item):
    for marker in item.iter_markers("chip_difference"):
        name = marker.args[0]
        if name not in chip.DIFFERENCES:
            raise pytest.UsageError(f"{item.nodeid}: unknown chip difference {name!r} (tests/chip.py)")
        if chip.ON_TPU:
            pytest.skip(f"on a TPU: {chip.DIFFERENCES[name]}")


@pytest.fixture
def on_tpu() -> bool:
    """Whether the suite runs on a TPU chip (tests/chip.py)."""
    return chip.ON_TPU
