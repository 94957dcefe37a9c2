"""Comparisons with the anchor, litert-torch 0.10.0 from PyPI.

The anchor's import name (`litert_torch`) is ours too, so its side runs in an environment
of its own: `anchor_convert.py`, `anchor_quantize.py`, `anchor_generative.py` and
`anchor_families.py` are scripts run by file path with the anchor's python (never with
this repository on PYTHONPATH), importing nothing from here but the torch-only zoo
(`zoo_loader.py`). Our side (`families_vs_anchor`, and the converter and generative
benchmarks' `--anchor-python` options) starts them with `script(name)`."""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent


def script(name: str) -> str:
    """The path of the anchor-side script `name` (e.g. "anchor_convert")."""
    return str(DIR / f"{name}.py")
