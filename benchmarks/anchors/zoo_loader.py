"""Load the model zoo (`benchmarks/zoo/`) by file path, without importing any other project code.

Both the benchmark and the anchor script (which runs in another environment, where
`litert_torch` is the reference converter) use this, so the zoo must stay torch-only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ZOO_DIR = REPO_ROOT / "benchmarks" / "zoo"


def load_zoo(module_name: str = "model_zoo"):
    """Import `benchmarks/zoo/` as the top-level package `module_name` and return it."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(
        module_name, ZOO_DIR / "__init__.py", submodule_search_locations=[str(ZOO_DIR)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the model zoo from {ZOO_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
