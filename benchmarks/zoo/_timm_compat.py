"""timm for the zoo, through the product's finder (common/timm_compat.py, installed by
`import litert_torch` and `import tpu_backend`): timm imports where torchvision cannot load."""

from __future__ import annotations

from common import timm_compat


def import_timm():
    """The timm module (imported with a stand-in torchvision when the real one cannot load)."""
    timm_compat.install()
    import timm

    return timm
