"""Activation checkpointing in one program (`TrainStep`, the pod plan): the policies training takes.

Training on the device checkpoints a block with `torch.utils.checkpoint` (`--remat full`) or
keeps its matrix products (`tpu_backend.compile.save_matmuls`, `--remat matmuls`); under
`torch.compile` AOTAutograd's partitioner then splits the step into a forward program that
saves a block's inputs (and products) and a backward program that recomputes the rest. The
plan traces the step as ONE joint graph (`capture.py`), where neither happens:
`aot_export_module` traces no saved-tensor hooks, so the checkpoint would be ignored, and a
recomputation traced into one program is merged back into the forward by XLA's
common-subexpression pass.

So the trace checkpoints each repeated block (`repeated_blocks`: a transformer's layers)
itself, as JAX's `jax.checkpoint` does:
- the forward runs the block without recording anything for autograd and saves only its
  inputs and parameters (with "matmuls", also the outputs of its products with weights);
- the backward recomputes the block from those saved values, each passed through
  `optimization_barrier` together with the gradient of the block's output: XLA cannot prove
  the recomputation equal to the forward's, so it neither merges the two nor keeps the
  forward's activations alive until the backward, and it cannot recompute a block before
  the backward reaches it (all blocks at once would hold all their activations again).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tpu_backend.compile.remat import MATMULS
from tpu_backend.compile.scan import repeated_blocks
from tpu_backend.jax_op import jax_op

POLICIES = ("none", "full", "matmuls")
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)  # block arguments held as they are


@jax_op("tpu_aot::fence")
def fence(x: jax.Array, after: jax.Array) -> jax.Array:
    """`x` itself, not before `after` exists, and a value XLA may not merge with any other
    (`lax.optimization_barrier` of both)."""
    return jax.lax.optimization_barrier((x, after))[0]


@contextlib.contextmanager
def checkpointed_blocks(model: nn.Module, policy: str) -> Iterator[int]:
    """Within the block, `model`'s repeated blocks are checkpointed with `policy`
    ("none", "full", "matmuls"); yields how many blocks are."""
    if policy not in POLICIES:
        raise ValueError(f"remat={policy!r}: use one of {', '.join(POLICIES)}")
    if policy == "none":
        yield 0
        return
    blocks = repeated_blocks(model)
    if blocks is None:
        raise ValueError(
            f"remat={policy!r}: {type(model).__name__} has no stack of repeated blocks to checkpoint "
            "(an nn.ModuleList of two or more modules of one class, a transformer's layers)"
        )
    # a transformers model hands its decoder layers a KV cache to update: recomputing a layer
    # would update it twice, so, as transformers does under gradient checkpointing, no cache
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    own = [block.__dict__.get("forward") for block in blocks]  # a forward set on the instance, kept
    for block in blocks:
        block.forward = _checkpointed_forward(block, policy == "matmuls")
    try:
        if use_cache:
            config.use_cache = False
        yield len(blocks)
    finally:
        if use_cache:
            config.use_cache = use_cache
        for block, forward in zip(blocks, own):
            if forward is None:
                del block.forward  # the class's forward again
            else:
                block.forward = forward


def _checkpointed_forward(block: nn.Module, keep_matmuls: bool):
    """`block.forward` run through `_Recompute`: its tensor arguments (positional, keyword,
    inside tuples, as transformers' decoder layers take them) and parameters are the saved
    values; everything else it is called with is held as it is."""
    forward = block.forward
    names = [name for name, _ in block.named_parameters()]

    def checkpointed(*args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        stateful = [leaf for leaf in leaves if not isinstance(leaf, (torch.Tensor, *_PLAIN))]
        if stateful:
            raise TypeError(
                f"remat: {type(block).__name__} is called with a {type(stateful[0]).__name__}, which recomputing the "
                "block in the backward would use twice (a KV cache would be updated twice); call the model without "
                "it (transformers: use_cache=False) or plan without remat"
            )
        results = {}  # the output's structure and non-tensor leaves, from the forward

        def run(params, tensors):
            filled = list(leaves)
            for i, t in zip(where, tensors):
                filled[i] = t
            call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
            block.forward = forward  # functional_call calls the module: its own forward, not this one
            try:
                out = torch.func.functional_call(block, dict(zip(names, params)), call_args, call_kwargs)
            finally:
                block.forward = checkpointed
            out_leaves, results["spec"] = pytree.tree_flatten(out)
            results["leaves"] = out_leaves
            return tuple(leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor))

        params = [p for _, p in block.named_parameters()]
        tensors = _Recompute.apply(run, keep_matmuls, len(where), *(leaves[i] for i in where), *params)
        tensors = iter(tensors if isinstance(tensors, tuple) else (tensors,))
        out = [next(tensors) if isinstance(leaf, torch.Tensor) else leaf for leaf in results["leaves"]]
        return pytree.tree_unflatten(out, results["spec"])

    return checkpointed


class _Recompute(torch.autograd.Function):
    """`run(params, inputs) -> tensors` whose backward recomputes it from fenced saved values."""

    @staticmethod
    def forward(ctx, run, keep_matmuls, n_inputs, *tensors):
        inputs, params = tensors[:n_inputs], tensors[n_inputs:]
        kept = _KeepMatmuls() if keep_matmuls else contextlib.nullcontext([])
        with kept as products:
            outs = run(params, inputs)
        ctx.run, ctx.n_inputs, ctx.n_kept = run, n_inputs, len(products)
        ctx.save_for_backward(*tensors, *products)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        n_tensors = len(saved) - ctx.n_kept
        after = next(g for g in grads if g is not None)  # the backward has reached the block
        fenced = [_fence(t, after) for t in saved[:n_tensors]]
        wants = [t.is_floating_point() and n for n, t in zip(ctx.needs_input_grad[3:], fenced)]
        for t, w in zip(fenced, wants):
            t.requires_grad_(bool(w))
        replay = (
            _ReplayMatmuls([_fence(t, after) for t in saved[n_tensors:]]) if ctx.n_kept else contextlib.nullcontext()
        )
        with torch.enable_grad(), replay:
            outs = ctx.run(fenced[ctx.n_inputs :], fenced[: ctx.n_inputs])
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wrt = [t for t, w in zip(fenced, wants) if w]
        found = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        found = iter(found)
        return (None, None, None, *(next(found) if w else None for w in wants))


def _fence(t: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return (fence(t, after) if t.is_floating_point() else t).detach()


class _KeepMatmuls(TorchDispatchMode):
    """Records the outputs of the block's products with weights (as `save_matmuls` keeps)."""

    def __enter__(self):
        self.products = []
        super().__enter__()
        return self.products

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            self.products.append(out)
        return out


class _ReplayMatmuls(TorchDispatchMode):
    """Gives the recorded products back, in order, instead of computing them again."""

    def __init__(self, products: list[torch.Tensor]):
        super().__init__()
        self.products = iter(products)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            return next(self.products)
        return func(*args, **(kwargs or {}))
