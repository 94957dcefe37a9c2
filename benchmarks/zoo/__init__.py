"""The converter's model zoo: CNN, MLP, segmentation, audio, image-to-image, video (3-D
convolution) and optical-flow (grid_sample) architectures defined in code, transformer
families built from `transformers` configs, and timm families (CNNs, hybrids, ViTs) built
with `pretrained=False` (random seeded weights, nothing downloaded; `transformers` and
`timm` are imported only when such a model is built).

    from benchmarks.zoo import ZOO, build, entries
    model, args = build("resnet18")          # eval mode, seeded weights and inputs
    for entry in entries(fast=True): ...     # the default-suite subset

Each entry (`ZooEntry`) has a name, a factory, sample input shapes, a family and a `fast`
flag. The package imports torch only, so the benchmark's anchor script can load it by path
in an environment where `litert_torch` is the reference converter.
"""

from .registry import FAMILIES, ZOO, ZooEntry, build, entries, randomize_norm_statistics, zoo_model

# Importing the family files registers their models (in this order).
# isort: off
from . import mlp  # noqa: F401
from . import cnn  # noqa: F401
from . import segmentation  # noqa: F401
from . import audio  # noqa: F401
from . import image2image  # noqa: F401
from . import transformers_models  # noqa: F401
from . import transformers_more  # noqa: F401
from . import timm_models  # noqa: F401
from . import video  # noqa: F401
from . import optical_flow  # noqa: F401
# isort: on

__all__ = ["FAMILIES", "ZOO", "ZooEntry", "build", "entries", "randomize_norm_statistics", "zoo_model"]
