"""Shared setup for the compile tests: a private compilation cache folder per test module.

The disk cache is process-wide JAX configuration; pointing it at a temporary folder
keeps the tests off the user's `~/.cache` and makes cache counts independent of what
ran before. The previous setting comes back after the module.
"""

from __future__ import annotations

import pytest

import tpu_backend.compile as tpu_compile


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory):
    with tpu_compile.using_cache_dir(tmp_path_factory.mktemp("xla_cache")) as folder:
        yield folder
