"""Fixtures shared by the device's tests."""

import pytest

import tpu_backend


@pytest.fixture
def fused_mode():
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("fused")
    yield
    tpu_backend.set_eager_mode(previous)
