"""A model given as a .tflite path or as bytes: what every bench entry point takes."""

from __future__ import annotations

import os


def read_model_file(model) -> tuple[bytes, str]:
    """(the model's bytes, its name for reports: the path, or "<bytes>")."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), "<bytes>"
    if not os.path.isfile(model):
        raise FileNotFoundError(f"no such model file: {model}")
    with open(model, "rb") as f:
        return f.read(), str(model)
