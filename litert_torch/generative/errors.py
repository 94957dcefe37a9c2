"""The error every generative export raises for a model it would not reproduce exactly."""

from __future__ import annotations


class UnsupportedModelError(NotImplementedError):
    """The model has a feature the generative export would not reproduce exactly."""
