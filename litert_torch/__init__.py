"""litert_torch: convert PyTorch models to LiteRT (.tflite) and run them.

edge = litert_torch.convert(model, (torch.randn(1, 3, 224, 224),))
y = edge(x)                 # runs in the LiteRT interpreter
edge.export("model.tflite")
again = litert_torch.load("model.tflite")
"""

from common.package_names import check_top_level_names

# before the first generic name is imported (and `kernels`, which litert_torch never imports,
# only where ours would shadow another package's)
check_top_level_names(("common", "converter", "runtimes"))

from common import timm_compat  # noqa: E402
from converter.errors import ConversionError, UnsupportedOpsError  # noqa: E402
from litert_torch import quantize  # noqa: E402
from litert_torch.api import convert  # noqa: E402
from litert_torch.edge_model import EdgeModel, load  # noqa: E402
from litert_torch.signatures import SignatureBuilder, signature  # noqa: E402

__all__ = [
    "convert",
    "quantize",
    "signature",
    "SignatureBuilder",
    "load",
    "EdgeModel",
    "ConversionError",
    "UnsupportedOpsError",
]

timm_compat.install()  # `import timm` works without a loadable torchvision (tools/setup.sh installs none)
