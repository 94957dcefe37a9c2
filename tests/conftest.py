"""Setup shared by the whole test session.

The tpu device's compilation cache writes to `~/.cache/tpu_backend/xla` by default; a
test run gets a temporary folder instead (unless `TPU_CACHE_DIR` is already set), so
tests never fill the user's cache and never depend on what an earlier run left there.
The converter validates its IR after every graph pass (`LITERT_TORCH_VALIDATE_PASSES`),
so a pass that leaves a malformed graph fails the test that exercised it, by name.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_session_cache: str | None = None


def pytest_configure(config):
    global _session_cache
    os.environ.setdefault("LITERT_TORCH_VALIDATE_PASSES", "1")
    if "TPU_CACHE_DIR" not in os.environ:
        _session_cache = tempfile.mkdtemp(prefix="tpu_xla_cache_")
        os.environ["TPU_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config):
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)
        os.environ.pop("TPU_CACHE_DIR", None)
