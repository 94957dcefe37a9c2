"""ATen -> TFLite lowering: importing this package registers every family's lowerings.

Families (one file each, one small function per ATen op):
elementwise, activations, conv, pad, pool, norm, linalg, shape, reduce, index, creation,
resize, attention (scaled_dot_product_attention), sorting (topk, sort), recurrent (LSTM/GRU), symbolic (dynamic sizes as values). `layout` holds the
NCHW <-> NHWC helpers, `emit` the single-op builders they share, `decompositions` the per-node decompositions and their table (KEEP: what stays whole).
"""

from converter.lowering import (  # noqa: F401  (imported to register their lowerings)
    activations,
    attention,
    conv,
    creation,
    elementwise,
    index,
    linalg,
    norm,
    pad,
    pool,
    quantized,
    reduce,
    resize,
    recurrent,
    shape,
    sorting,
    symbolic,
)
from converter.lowering.registry import LOWERINGS, find_lowering, lowers  # noqa: F401
