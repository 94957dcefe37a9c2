"""Attention: `scaled_dot_product_attention` kept whole and lowered to BATCH_MATMUL + SOFTMAX.

    scores = (q * scale) @ k^T  [+ mask]        BATCH_MATMUL with adjY (k is never transposed)
    out    = softmax(scores) @ v                SOFTMAX over the last axis, BATCH_MATMUL

PyTorch's own decomposition scales q and k separately, transposes k, and guards every
softmax row against being fully masked with five extra ops per layer (EQUAL, 2x
LOGICAL_NOT, REDUCE_ANY, SELECT_V2). Here:
- the scale is one MUL, on q or on the scores, whichever is smaller;
- masks: a boolean mask becomes an additive one (0 where kept, float32 min where not);
  `is_causal` is a constant lower-triangular mask; constant masks are prepared in numpy;
- fully masked rows give zeros, as in PyTorch: for a constant mask the rows are known
  now (no op at all unless some row is fully masked); for a mask computed at run time
  one REDUCE_ANY over the mask and one SELECT_V2 on the output;
- grouped-query attention (`enable_gqa=True`, or k/v whose heads were repeated with
  expand + reshape, as `transformers`' `repeat_kv` does) never repeats heads: q's
  (heads, length) axes are regrouped to (kv_heads, group * length) so each k/v head is
  read by its group of q heads in one BATCH_MATMUL.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten

_BMM = {"adjX": False, "adjY": False, "asymmetricQuantizeInputs": False}
_MASKED = float(np.finfo(np.float32).min)  # additive value of a masked-out position


def _batch_matmul(ctx, a: Tensor, b: Tensor, transpose_b: bool = False) -> Tensor:
    """a @ b (or a @ b^T), broadcasting the batch axes."""
    batch = emit.broadcast_shape(a.shape[:-2], b.shape[:-2])
    cols = b.shape[-2] if transpose_b else b.shape[-1]
    signature = None
    if a.is_dynamic or b.is_dynamic:
        a_sig, b_sig = a.shape_signature or a.shape, b.shape_signature or b.shape
        batch_sig = (
            tuple(-1 if -1 in (x, y) else max(x, y) for x, y in zip(a_sig[:-2], b_sig[:-2]))
            if len(a_sig) == len(b_sig)
            else None
        )
        if batch_sig is None:
            raise emit.unsupported(
                ctx,
                "attention on dynamic operands of different ranks",
                "Give q, k and v the same rank, or export with static shapes.",
            )
        signature = (*batch_sig, a_sig[-2], b_sig[-2] if transpose_b else b_sig[-1])
    return ctx.emit(
        "BATCH_MATMUL",
        [a, b],
        dict(_BMM, adjY=transpose_b),
        shape=(*batch, a.shape[-2], cols),
        dtype=a.dtype,
        signature=signature,
    )


def _producer(ctx, t: Tensor, opcode: str):
    """The op of kind `opcode` that wrote `t` in this graph, or None."""
    for op in reversed(ctx.graph.ops):
        if any(out is t for out in op.outputs):
            return op if op.opcode == opcode else None
    return None


def _unrepeated_heads(ctx, t: Tensor) -> tuple[Tensor, int]:
    """(tensor with kv heads, group size) when `t` (B, H, S, E) is a head repetition
    (RESHAPE of a BROADCAST_TO from (B, Hkv, 1, S, E)), else (t, 1)."""
    reshape = _producer(ctx, t, "RESHAPE") if t.rank == 4 and not t.is_dynamic else None
    broadcast = _producer(ctx, reshape.inputs[0], "BROADCAST_TO") if reshape else None
    if broadcast is None:
        return t, 1
    source, repeated = broadcast.inputs[0], broadcast.outputs[0].shape
    b, heads, s, e = t.shape
    if (
        source.rank != 5
        or source.shape[2] != 1
        or len(repeated) != 5
        or source.shape[0] != b
        or repeated[0] != b
        or source.shape[1] * repeated[2] != heads
        or repeated[1] != source.shape[1]
        or tuple(repeated[3:]) != (s, e)
        or tuple(source.shape[3:]) != (s, e)
    ):
        return t, 1
    kv_heads = source.shape[1]
    return emit.reshape(ctx, source, (b, kv_heads, s, e)), heads // kv_heads


def _as_rank(ctx, mask: Tensor, rank: int) -> Tensor:
    """mask with leading unit axes so that it has `rank` axes."""
    if mask.rank >= rank:
        return mask
    return emit.reshape(ctx, mask, (1,) * (rank - mask.rank) + tuple(mask.shape))


def _grouped_mask(ctx, mask: Tensor, kv_heads: int, groups: int) -> Tensor:
    """A mask for (B, H, L, S) scores rearranged for (B, Hkv, G*L, S) scores."""
    lead, heads, length, keys = mask.shape[:-3], mask.shape[-3], mask.shape[-2], mask.shape[-1]
    if heads == 1:  # shared by every head: repeat it along the rows, once per group member
        if mask.is_const:
            return ctx.const(np.tile(mask.data, (1,) * (mask.rank - 2) + (groups, 1)))
        multiples = emit.int32(ctx, [1] * (mask.rank - 2) + [groups, 1])
        return emit.op(ctx, "TILE", [mask, multiples], shape=(*lead, 1, groups * length, keys), dtype=mask.dtype)
    return emit.reshape(ctx, mask, (*lead, kv_heads, groups * length, keys))


def _additive(ctx, mask: Tensor, dtype) -> Tensor:
    """A boolean keep-mask as 0 / float32-min; a float mask as is (in the scores' dtype)."""
    if mask.dtype != np.bool_:
        return emit.cast(ctx, mask, dtype)
    if mask.is_const:
        return ctx.const(np.where(mask.data, 0.0, _MASKED).astype(dtype))
    return emit.op(
        ctx,
        "SELECT_V2",
        [mask, emit.scalar_like(ctx, 0.0, dtype), emit.scalar_like(ctx, _MASKED, dtype)],
        shape=mask.shape,
        dtype=dtype,
    )


def _rows_with_a_key(ctx, mask: Tensor):
    """Where each scores row keeps at least one key, shaped (..., L, 1): None when every
    row does (known for constant masks), else a boolean constant or a REDUCE_ANY."""
    if mask.is_const:
        keeps = mask.data if mask.dtype == np.bool_ else mask.data != -np.inf
        rows = np.any(keeps, axis=-1, keepdims=True)
        return None if rows.all() else ctx.const(rows)
    keeps = (
        mask
        if mask.dtype == np.bool_
        else emit.binary(ctx, "NOT_EQUAL", mask, emit.scalar_like(ctx, -np.inf, mask.dtype), dtype=np.bool_)
    )
    return emit.reduce(ctx, "REDUCE_ANY", keeps, [-1], keep_dims=True)


@lowers(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(
    ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if dropout_p:
        raise emit.unsupported(
            ctx,
            f"attention dropout (dropout_p={dropout_p}) at inference",
            "Pass dropout_p=0.0 when not training (e.g. `dropout_p=p if self.training else 0.0`).",
        )
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise emit.unsupported(
            ctx,
            f"attention on q, k, v of ranks {q.rank}, {k.rank}, {v.rank}",
            "Pass q, k, v with the same rank (batch..., heads, length, features).",
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    length, keys = q.shape[-2], k.shape[-2]
    dynamic = q.is_dynamic or k.is_dynamic or v.is_dynamic
    if is_causal:
        if dynamic:  # iota comparisons over the run-time lengths
            from converter.lowering.symbolic import causal_mask

            attn_mask = causal_mask(ctx, ctx.node.args[0].meta["val"].shape[-2], ctx.node.args[1].meta["val"].shape[-2])
        else:
            attn_mask = ctx.const(np.tril(np.ones((length, keys), dtype=np.bool_)))

    # Grouped-query attention: q heads h*G .. h*G+G-1 read k/v head h.
    groups = 1
    if q.rank == 4 and not dynamic:
        k, k_groups = _unrepeated_heads(ctx, k)
        v, v_groups = _unrepeated_heads(ctx, v)
        if k_groups != v_groups:  # only one of them was repeated: undo neither
            k, v = _repeat_heads(ctx, k, k_groups), _repeat_heads(ctx, v, v_groups)
        groups = q.shape[1] // k.shape[1]
    elif q.rank >= 3 and q.shape[-3] != k.shape[-3]:
        raise emit.unsupported(
            ctx,
            "grouped-query attention on dynamic or non-4-D operands",
            "Export with static shapes and (batch, heads, length, features) operands.",
        )
    batch = q.shape[0]
    if groups > 1:
        q = emit.reshape(ctx, q, (batch, k.shape[1], groups * length, q.shape[-1]))

    factor = emit.scalar_like(ctx, scale, q.dtype)
    scale_scores = scale != 1.0 and keys < q.shape[-1]  # scale whichever operand is smaller
    if scale != 1.0 and not scale_scores:
        q = emit.binary(ctx, "MUL", q, factor)
    scores = _batch_matmul(ctx, q, k, transpose_b=True)
    if scale_scores:
        scores = emit.binary(ctx, "MUL", scores, factor)

    rows_ok = None
    if attn_mask is not None:
        mask = _as_rank(ctx, attn_mask, q.rank)
        if groups > 1:
            mask = _grouped_mask(ctx, mask, k.shape[1], groups)
        # A causal row always keeps key 0, so only other masks need the guard.
        rows_ok = None if is_causal else _rows_with_a_key(ctx, mask)
        scores = emit.binary(ctx, "ADD", scores, _additive(ctx, mask, scores.dtype))
    probabilities = emit.unary(ctx, "SOFTMAX", scores, {"beta": 1.0})
    out = _batch_matmul(ctx, probabilities, v)
    if rows_ok is not None:
        zero = emit.scalar_like(ctx, 0.0, out.dtype)
        out = emit.op(
            ctx,
            "SELECT_V2",
            [rows_ok, out, zero],
            shape=emit.broadcast_shape(rows_ok.shape, out.shape),
            dtype=out.dtype,
            signature=out.shape_signature,
        )
    if groups > 1 or out.shape != ctx.out_shape():
        out = emit.reshape(ctx, out, ctx.out_shape())
    return out


def _repeat_heads(ctx, t: Tensor, groups: int) -> Tensor:
    """(B, Hkv, S, E) -> (B, Hkv * groups, S, E), each head repeated `groups` times in place."""
    if groups == 1:
        return t
    b, heads, s, e = t.shape
    lifted = emit.reshape(ctx, t, (b, heads, 1, s, e))
    repeated = emit.op(
        ctx,
        "BROADCAST_TO",
        [lifted, emit.int32(ctx, (b, heads, groups, s, e))],
        shape=(b, heads, groups, s, e),
        dtype=t.dtype,
    )
    return emit.reshape(ctx, repeated, (b, heads * groups, s, e))
