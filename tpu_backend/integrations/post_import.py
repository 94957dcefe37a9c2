"""`when_imported(name, apply)`: run `apply(module)` once a library is imported (now, if
it already is). What every integration in this package is built on; the package
re-exports it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

_PENDING: dict[str, list[Callable]] = {}


def when_imported(module_name: str, apply: Callable) -> None:
    """Call `apply(module)` once `module_name` is imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        apply(module)
        return
    _PENDING.setdefault(module_name, []).append(apply)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a watched module so that the
    pending integrations run right after the module has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        sys.meta_path.remove(self)  # let the normal finders locate the module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ApplyAfterExec(spec.loader, _PENDING.pop(fullname))
        return spec


class _ApplyAfterExec(importlib.abc.Loader):
    def __init__(self, loader, hooks: list[Callable]):
        self._loader, self._hooks = loader, hooks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for hook in self._hooks:
            hook(module)
