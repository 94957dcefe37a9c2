"""Selective activation checkpointing: which values of a checkpointed block the backward keeps.

`torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` keeps nothing of the block
and recomputes all of it in the backward; without checkpointing everything is kept. Between
the two, `save_matmuls` keeps the outputs of the block's matrix products with the weights and
recomputes the rest (norms, activations, rotary embeddings, attention), as JAX's
`checkpoint_policies.dots_with_no_batch_dims_saveable` does:

    from torch.utils.checkpoint import checkpoint
    from tpu_backend.compile import save_matmuls

    class Block(nn.Module):
        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False, context_fn=save_matmuls)

With `scan_layers`, call `checkpoint` inside the block's forward, as above: checkpointed from
outside (around the call of a scanned block), the block is recomputed whole whatever the
policy says.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten
MATMULS = frozenset({aten.mm.default, aten.addmm.default})  # `nn.Linear`'s products (no batch dimensions)


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def save_matmuls():
    """A `context_fn` for `torch.utils.checkpoint.checkpoint` (module docstring)."""
    return create_selective_checkpoint_contexts(_keep_matmuls)
