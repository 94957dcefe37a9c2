"""PyTorch custom ops that stand for one LiteRT builtin each, for model code written for
export (the generative KV cache), with their eager kernel, shape rule and lowering here.

- `torch.ops.litert.dynamic_update_slice(operand, update, start)`: `operand` with
  `update` written at offset `start` (int32, one entry per axis) -> DYNAMIC_UPDATE_SLICE.
  As in LiteRT, each start is clamped to [0, operand.size(axis) - update.size(axis)], so
  the update always lands whole (callers that need the exact offset check it first).
"""

from __future__ import annotations

import torch

from converter.lowering.registry import lowers


@torch.library.custom_op("litert::dynamic_update_slice", mutates_args=())
def dynamic_update_slice(operand: torch.Tensor, update: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    if start.shape != (operand.dim(),) or update.dim() != operand.dim():
        raise ValueError(
            f"dynamic_update_slice: start must hold one offset per axis of the operand "
            f"{tuple(operand.shape)} and update {tuple(update.shape)} the same rank, got start {tuple(start.shape)}"
        )
    starts = [min(max(int(s), 0), size - n) for s, size, n in zip(start.tolist(), operand.shape, update.shape)]
    out = operand.clone()
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


@dynamic_update_slice.register_fake
def _(operand, update, start):
    return torch.empty_like(operand)


@lowers(torch.ops.litert.dynamic_update_slice.default)
def lower_dynamic_update_slice(ctx, operand, update, start):
    return ctx.emit("DYNAMIC_UPDATE_SLICE", [operand, update, start])
