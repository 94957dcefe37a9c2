"""Shared setup for the compile tests: a private compilation cache folder per test module.

The disk cache is process-wide JAX configuration; pointing it at a temporary folder
keeps the tests off the user's `~/.cache` and makes cache counts independent of what
ran before.
"""

from __future__ import annotations

import pytest

import tpu_backend.compile as tpu_compile


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory):
    previous = tpu_compile.cache_dir()
    folder = tmp_path_factory.mktemp("xla_cache")
    tpu_compile.set_cache_dir(folder)
    yield folder
    tpu_compile.set_cache_dir(previous)
