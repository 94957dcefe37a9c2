"""Shared setup for the compile tests: a private compilation cache folder per test module,
and a fresh Dynamo and fresh compile statistics for the tests that ask for them.

The disk cache is process-wide JAX configuration; pointing it at a temporary folder
keeps the tests off the user's `~/.cache` and makes cache counts independent of what
ran before. The previous setting comes back after the module.
"""

from __future__ import annotations

import pytest
import torch._dynamo

import tpu_backend.compile as tpu_compile


@pytest.fixture(scope="module", autouse=True)
def private_cache_dir(tmp_path_factory):
    with tpu_compile.using_cache_dir(tmp_path_factory.mktemp("xla_cache")) as folder:
        yield folder


@pytest.fixture
def fresh_dynamo():
    """No graph compiled for an earlier test is reused, and compile counts start at zero."""
    torch._dynamo.reset()
    tpu_compile.compile_stats().reset()
    yield
    torch._dynamo.reset()
