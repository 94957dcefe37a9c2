"""`import timm` where torchvision cannot load (installed by `import litert_torch` and `import tpu_backend`).

timm's modules import a few torchvision names at import time (FrozenBatchNorm2d,
transforms' InterpolationMode) that its models do not call. `tools/setup.sh` installs
timm without torchvision: PyPI's torchvision wheels are CUDA builds whose `torchvision._C`
does not load against the CPU torch ('operator torchvision::nms does not exist'), and a
broken torchvision would also break transformers' imports.

`install()` puts a finder on `sys.meta_path` that acts on one import only, `import timm`:
when torchvision is missing or fails to load, timm's own import runs with a stand-in
`torchvision` whose every attribute is an inert placeholder class; the stand-in is removed
as soon as timm is imported, so nothing else ever sees it (transformers asks torchvision's
version and must see no torchvision at all). A model that really calls torchvision fails
loudly (a placeholder is not the real thing). A working torchvision is used as is; timm
imported before them is untouched (it either worked or already failed).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Placeholder(type):
    """Any attribute of the stand-in: a class whose attributes are placeholders too."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (object,), {})

    def __hash__(cls):
        return id(cls)


class _StandInTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def placeholder(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(name, (object,), {})

        module.__getattr__ = placeholder
        return module

    def exec_module(self, module):
        pass


def torchvision_loads() -> bool:
    """Whether `import torchvision` works here (a failed attempt leaves no modules behind)."""
    if "torchvision" in sys.modules:
        return True
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001  (ImportError, or RuntimeError from a mismatched _C)
        _drop_torchvision_modules()
        return False
    return True


def _drop_torchvision_modules() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


class _TimmLoader(importlib.abc.Loader):
    """timm's own loader, run with the stand-in torchvision on `sys.meta_path` when needed."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # resource readers, get_source...: timm's loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if torchvision_loads():
            return self._loader.exec_module(module)
        stand_in = _StandInTorchvision()
        sys.meta_path.insert(0, stand_in)
        try:
            self._loader.exec_module(module)
        finally:
            # timm keeps the placeholders it imported; the stand-in goes.
            sys.meta_path.remove(stand_in)
            _drop_torchvision_modules()


class _TimmFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "timm":
            return None
        for finder in sys.meta_path:  # the finder that would have found timm without this one
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _TimmLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Let a later `import timm` succeed without a working torchvision (idempotent)."""
    if not any(isinstance(finder, _TimmFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TimmFinder())
