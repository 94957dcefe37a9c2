"""Decompositions: what to do with an ATen op that has no lowering of its own.

The converter lowers the graph `torch.export` gives directly (`converter.pipeline`), and
decomposes only the nodes without a lowering, one node at a time: `trace_decomposition`
traces the op's entry of `decomposition_table()` on the node's example values (FakeTensors,
symbolic sizes included) into a small fx graph, whose nodes are lowered in turn (and
decomposed again where they have no lowering).

The table starts from PyTorch's core-ATen decompositions and drops every op that maps 1:1
(or nearly) onto a TFLite builtin (KEEP): decomposing those would only make the lowered
graph longer and slower. Every op in KEEP needs a lowering (converter/lowering/<family>.py).
KEEP ops that are CompositeImplicitAutograd (linear, matmul, upsample_*, _pad_circular...)
would be inlined by any trace that runs below autograd; `trace_decomposition` keeps them
whole (so `pad(mode="circular")` decomposes to `_pad_circular`, not to slices and copies).
The same table drives `ExportedProgram.run_decompositions` on the fallback path (graphs
whose mutations need functionalization, see `converter.pipeline`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

aten = torch.ops.aten

# Ops with a direct TFLite lowering: never decompose these.
KEEP = [
    aten.gelu.default,
    aten.hardswish.default,
    aten.hardsigmoid.default,
    aten.silu.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.prelu.default,
    aten.softplus.default,
    aten.mish.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.linear.default,
    aten.matmul.default,
    aten.pixel_shuffle.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
    aten.native_layer_norm.default,
    aten.native_group_norm.default,
    aten.reflection_pad2d.default,
    aten.replication_pad2d.default,
    aten._pad_circular.default,  # else: empty + slice_scatter copies; we GATHER instead
    aten.pixel_unshuffle.default,  # SPACE_TO_DEPTH
    aten._upsample_nearest_exact2d.vec,  # RESIZE_NEAREST_NEIGHBOR with half-pixel centers
    aten.reflection_pad1d.default,
    aten.replication_pad1d.default,
    aten.roll.default,
    aten.flip.default,
    aten.var.correction,
    aten.std.correction,
    aten.adaptive_avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten.avg_pool2d.default,
    aten.clamp.default,
    aten.hardtanh.default,
    aten.embedding.default,
    aten.lstm.input,  # recurrent.py: one input projection for all steps, not per-step matmuls
    aten.gru.input,
    aten.scaled_dot_product_attention.default,  # attention.py: no per-row softmax guards, no k transpose
    aten.one_hot.default,  # indexing.py: its decomposition asserts on the indices' values
]


def decomposition_table() -> dict:
    """A fresh copy of the table (callers may edit it)."""
    return dict(_materialized_table())


@functools.cache
def _materialized_table() -> dict:
    # `default_decompositions()` is a lazy table that materialises every composite op on
    # each use (about 1 s per conversion); a plain dict built once does the same work once.
    table = torch.export.default_decompositions()
    for op in KEEP:
        table.pop(op, None)
    return dict(table.items())


def decomposition_for(op) -> Callable | None:
    """The decomposition of `op` (an OpOverload), or None when it has none: its table
    entry, else its CompositeImplicitAutograd kernel (the table leaves out the composite
    ops that may return an alias, e.g. `to.device`, which `run_decompositions` handles by
    functionalizing; outside KEEP they decompose like any other)."""
    fn = _materialized_table().get(op)
    if fn is None and op not in KEEP and _is_composite(op):
        fn = op.decompose
    return fn


def _is_composite(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    )


def functional_variant(op):
    """`aten.relu.default` for `aten.relu_.default` (an in-place op writing its first
    argument); `op` itself when it mutates nothing; None for other mutations (out=
    variants, ops writing several arguments)."""
    if not isinstance(op, torch._ops.OpOverload):
        return op
    return _functional_overload(op)


@functools.cache  # asked for every node (several times); the schema walk is the cost
def _functional_overload(op: torch._ops.OpOverload):
    written = [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return op
    name = op._schema.name.split("::")[-1]
    if written != [0] or not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace), name[:-1], None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def trace_decomposition(op, args: tuple, kwargs: dict, *, functional: bool = False) -> torch.fx.GraphModule:
    """The decomposition of one call of `op`, traced into an fx graph.

    `args`/`kwargs` are the node's arguments, fx Nodes included: each Node becomes a
    placeholder (in the order `pytree` flattens them) traced with its example value
    (`meta["val"]`), so sizes stay the program's own symbols. Nodes of the result carry
    `meta["val"]`. `functional=True` traces through `torch.func.functionalize` (for
    decompositions that write into views of a fresh tensor, as some composite kernels do)."""
    fn = decomposition_for(op)
    if fn is None:
        raise KeyError(op)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
    examples = [leaves[i].meta["val"] for i in positions]

    def call(*values):
        filled = list(leaves)
        for i, value in zip(positions, values):
            filled[i] = value
        a, k = pytree.tree_unflatten(filled, spec)
        return fn(*a, **k)

    fake_mode = torch._guards.detect_fake_mode(examples)
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), _keep_composite_ops_whole():
        # "symbolic" reuses the examples' fake mode and shape environment (no new symbols).
        fn_to_trace = torch.func.functionalize(call, remove="mutations_and_views") if functional else call
        traced = make_fx(fn_to_trace, tracing_mode="symbolic")(*examples)
    traced.graph.eliminate_dead_code()  # e.g. the unused indices of max_pool1d's max_pool2d_with_indices
    return traced


@contextlib.contextmanager
def _keep_composite_ops_whole():
    """Keep KEEP's CompositeImplicitAutograd ops whole in a trace below autograd, with
    torch.export's own (private) override, the one `run_decompositions` applies. If a
    future torch lacks it, KEEP ops inside a decomposition arrive decomposed (still
    convertible, only longer graphs)."""
    try:
        from torch._export.utils import _special_op_to_preserve_cia
        from torch.export.exported_program import _override_composite_implicit_decomp
    except ImportError:
        yield
        return
    with _override_composite_implicit_decomp({op: _special_op_to_preserve_cia for op in _kept_composite_ops()}):
        yield


@functools.cache
def _kept_composite_ops() -> tuple:
    try:
        from torch._export.utils import _is_cia_op
    except ImportError:
        return ()
    return tuple(op for op in KEEP if _is_cia_op(op))
