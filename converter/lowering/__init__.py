"""ATen -> TFLite lowering: importing this package registers every family's lowerings.

Families (one file each, one small function per ATen op):
pointwise, activations, conv, pad, pooling, norm, linalg, shape, reduction, indexing, creation,
resize, attention (scaled_dot_product_attention), sort (topk, sort), recurrent (LSTM/GRU), symbolic (dynamic sizes as values),
litert_ops (custom ops standing for one LiteRT builtin: the KV cache's DYNAMIC_UPDATE_SLICE).
Families with the same role carry the same name as in `tpu_backend/ops/`. `layout` holds the
NCHW <-> NHWC helpers, `emit` the single-op builders they share, `decompositions` the per-node decompositions and their table (KEEP: what stays whole).
"""

from converter.lowering import (  # noqa: F401  (imported to register their lowerings)
    activations,
    attention,
    conv,
    creation,
    indexing,
    linalg,
    litert_ops,
    norm,
    pad,
    pointwise,
    pooling,
    quantized,
    recurrent,
    reduction,
    resize,
    shape,
    sort,
    symbolic,
)
from converter.lowering.registry import LOWERINGS, find_lowering, lowers  # noqa: F401
