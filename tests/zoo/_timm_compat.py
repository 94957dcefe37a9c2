"""Import timm where torchvision cannot load (test-time shim, no effect elsewhere).

timm's model modules import a few torchvision names at import time (FrozenBatchNorm2d,
transforms' InterpolationMode) that no zoo model uses. This machine's torch is the CPU
build; the only torchvision wheels available are CUDA builds, whose `torchvision._C`
does not load against it. When `import torchvision` fails, `import_timm()` puts a
stand-in package on `sys.meta_path` whose every attribute is an inert placeholder class,
so those imports succeed; building a model that really calls torchvision would fail
loudly (a placeholder is not callable as the real thing). A working torchvision is used
as is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
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


def import_timm():
    """The timm module (stand-in torchvision installed first when the real one cannot load)."""
    if "timm" in sys.modules:
        return sys.modules["timm"]
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001  (ImportError, or RuntimeError from a mismatched _C)
        _drop_torchvision_modules()
        stand_in = _StandInTorchvision()
        sys.meta_path.insert(0, stand_in)
        try:
            import timm
        finally:
            # timm keeps the placeholders it imported; the stand-in goes, so that later
            # imports (transformers asks torchvision's version) see no torchvision at all.
            sys.meta_path.remove(stand_in)
            _drop_torchvision_modules()
    import timm

    return timm


def _drop_torchvision_modules() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
