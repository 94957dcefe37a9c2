"""litert_torch: convert PyTorch models to LiteRT (.tflite) and run them.

    edge = litert_torch.convert(model, (torch.randn(1, 3, 224, 224),))
    y = edge(x)                 # runs in the LiteRT interpreter
    edge.export("model.tflite")
    again = litert_torch.load("model.tflite")
"""

from converter.errors import ConversionError, UnsupportedOpsError
from litert_torch.api import convert
from litert_torch.edge_model import EdgeModel, load

__all__ = ["convert", "load", "EdgeModel", "ConversionError", "UnsupportedOpsError"]
