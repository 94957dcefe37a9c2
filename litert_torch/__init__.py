"""litert_torch: convert PyTorch models to LiteRT (.tflite) and run them.

edge = litert_torch.convert(model, (torch.randn(1, 3, 224, 224),))
y = edge(x)                 # runs in the LiteRT interpreter
edge.export("model.tflite")
again = litert_torch.load("model.tflite")
"""

from converter.errors import ConversionError, UnsupportedOpsError
from litert_torch import _timm_compat, quantize
from litert_torch.api import convert
from litert_torch.edge_model import EdgeModel, load
from litert_torch.signatures import SignatureBuilder, signature

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

_timm_compat.install()  # `import timm` works without a loadable torchvision (tools/setup.sh installs none)
