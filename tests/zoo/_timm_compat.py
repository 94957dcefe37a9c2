"""timm for the zoo: `import litert_torch` installs the product's torchvision stand-in for
timm (litert_torch/_timm_compat.py), so timm imports where torchvision cannot load."""

from __future__ import annotations

import litert_torch._timm_compat as _product
from litert_torch._timm_compat import _StandInTorchvision  # noqa: F401  (tests look for it on sys.meta_path)


def import_timm():
    """The timm module (imported through the stand-in when torchvision cannot load)."""
    _product.install()
    import timm

    return timm
