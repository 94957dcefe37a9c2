"""Wording shared by the project's error messages."""

from __future__ import annotations


def a_type(value) -> str:
    """The type of `value` as a message names it: "None", "an int", "a list", "an ndarray"."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
