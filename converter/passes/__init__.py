"""Graph passes run between lowering and the flatbuffer writer.

One pass per module, each a function `Graph -> Graph` (editing in place and returning
the graph) whose docstring says what it guarantees. `optimize` runs them all, in the
order below, on every graph of a model, repeating the loop while a pass changed the
graph. `run_pass` runs one pass and reports whether it changed the graph (its ops, their
inputs, outputs and options, the graph's outputs); with `LITERT_TORCH_VALIDATE_PASSES=1`
(the test suite sets it; set it in debug runs) the IR is validated after every pass, and
a malformed graph raises `ConversionError` naming the pass that broke it.
"""

from __future__ import annotations

import os
from typing import Callable

from converter.errors import ConversionError
from converter.ir import Graph, Model

from ._graph import opcode_histogram
from .deduplicate_constants import deduplicate_constants
from .drop_broadcasts import drop_broadcasts
from .drop_zero_terms import drop_zero_terms
from .fold_batch_norm import fold_batch_norm
from .fold_constants import fold_constants
from .fold_pad_into_conv import fold_pad_into_conv
from .fold_reshapes_into_fully_connected import fold_reshapes_into_fully_connected
from .fuse_activations import fuse_activations
from .fuse_gelu import fuse_gelu
from .hoist_transpose_above_pad import hoist_transpose_above_pad
from .narrow_int64_indices import narrow_int64_indices
from .remove_dead_code import remove_dead_code
from .simplify_reshapes import simplify_reshapes
from .sink_row_slices import sink_row_slices
from .to_nhwc import to_nhwc

__all__ = [
    "optimize",
    "optimize_graph",
    "fold_constants",
    "drop_broadcasts",
    "drop_zero_terms",
    "to_nhwc",
    "fold_batch_norm",
    "fuse_activations",
    "remove_dead_code",
    "deduplicate_constants",
    "fold_pad_into_conv",
    "simplify_reshapes",
    "opcode_histogram",
    "narrow_int64_indices",
    "fuse_gelu",
    "hoist_transpose_above_pad",
    "fold_reshapes_into_fully_connected",
    "sink_row_slices",
    "run_pass",
    "folding_summary",
    "validate_between_passes",
]

MAX_ROUNDS = 4


def validate_between_passes() -> bool:
    """Whether `run_pass` validates the IR after each pass (read at call time)."""
    return os.environ.get("LITERT_TORCH_VALIDATE_PASSES", "0").lower() in ("1", "true", "yes", "on")


def _structure(graph: Graph) -> list:
    """What a pass may change, as one flat list of comparable values: the graph's outputs,
    then per op the op, its opcode, its input count, inputs, outputs and a shallow copy of
    its options. Ops and tensors compare by identity (`eq=False`: passes never mutate a
    tensor); options by their values (passes replace option values, never edit one in
    place). Built for every pass of every round, so kept flat: a tuple per op and per
    option (and a repr of every op's options before that) made this check a third of
    `optimize` on small graphs, and its objects fed the garbage collector."""
    flat = [len(graph.outputs), *graph.outputs]
    for op in graph.ops:
        flat += (op, op.opcode, len(op.inputs))
        flat += op.inputs
        flat += op.outputs
        flat.append(op.options.copy())
    return flat


def _changed(before: list, after: list) -> bool:
    try:
        return before != after
    except ValueError:  # an option holding a numpy array was replaced by another array
        return True


def _validate(graph: Graph, after: str) -> None:
    from converter.writer import validate

    try:
        validate(Model([graph]))
    except ConversionError as e:
        raise ConversionError(f"the IR is malformed after pass {after}: {e}") from e


def run_pass(graph_pass: Callable[[Graph], Graph], graph: Graph) -> bool:
    """Run `graph_pass` on `graph` (in place); returns whether it changed the graph."""
    return _run(graph_pass, graph, _structure(graph))[0]


def _run(graph_pass: Callable[[Graph], Graph], graph: Graph, before: list) -> tuple[bool, list]:
    """`run_pass` given the graph's `_structure` now; also returns the one after, which
    is the next pass's `before` (one structure per pass instead of two)."""
    graph_pass(graph)
    if validate_between_passes():
        _validate(graph, graph_pass.__name__)
    after = _structure(graph)
    return _changed(before, after), after


# One round of the loop, in order (see optimize_graph).
ROUND = (
    fold_constants,
    drop_zero_terms,
    drop_broadcasts,
    sink_row_slices,
    fuse_gelu,
    fold_reshapes_into_fully_connected,
    to_nhwc,
    fold_constants,
    fold_batch_norm,
    fold_pad_into_conv,
    fuse_activations,
    remove_dead_code,
    deduplicate_constants,
)


# The passes that remove ops because their values are known before the model runs:
# `folding_summary` reports what they removed (`Graph.folded`).
FOLDING = (fold_constants, drop_zero_terms)


def folding_summary(model: Model) -> str | None:
    """What constant folding removed from `model`, in a line for the user (None: nothing);
    ops are the lowered graph's, before batch norms and activations fuse. A model with
    zero-initialised norms loses whole residual branches: timm's ResNet-18
    (zero_init_last) converts to 14 ops, not 37, and this line says why."""
    ops = sum(g.folded.get("ops", 0) for g in model.graphs)
    branches = sum(g.folded.get("zero branches", 0) for g in model.graphs)
    if not ops:
        return None
    line = f"constant folding removed {ops} op{'s' * (ops != 1)} (counted before fusion)"
    if branches:
        plural = "es" * (branches != 1)
        line += f", among them {branches} residual branch{plural} whose output is always zero (zero-initialised norm weights?)"
    return line


def optimize_graph(graph: Graph) -> Graph:
    """Run the pass pipeline on one graph (in place); returns it.

    Order and why:
    1. remove_dead_code: less to look at;
    2. fold_constants: weight rearrangements (TRANSPOSE/RESHAPE of constant filters)
       become plain constants, so the layout pass only sees activation transposes;
       drop_zero_terms: `x + branch * 0` is `x` (a zero-initialised LayerNorm scale,
       Swin-V2), and the branch dies (see its docstring for the NaN/inf rule);
       drop_broadcasts: a BROADCAST_TO read by a binary op that broadcasts anyway
       is bypassed (XNNPACK takes no BROADCAST_TO: each splits its partition);
       then fuse_gelu: a hand-written tanh GELU (GPT-2) becomes one GELU op, and
       fold_reshapes_into_fully_connected: flatten -> FC -> unflatten is one FC;
       sink_row_slices (before them): a slice of rows (an LM's last position, a ViT's
       class token) moves above the row-wise ops that computed the rows it drops;
    3. to_nhwc: sink and cancel the NCHW<->NHWC transposes; per-channel constants are
       transposed on the way, so batch norm's MUL/ADD now broadcast on the last axis;
       it ends with simplify_reshapes (unit-dim transposes, reshape chains, a
       global pool's keepDims before a flatten);
    4. fold_batch_norm: those MUL/ADD go into the conv/FC weights and bias;
    5. fold_pad_into_conv: explicit zero PADs equal to SAME padding disappear;
    6. fuse_activations: RELU/RELU6 after conv/add/... become fused activations
       (after 4, so the activation is what directly follows the conv);
    7. remove_dead_code, deduplicate_constants (and CSE);
    then, once, narrow_int64_indices (int64 indices computed as int32 where exact) and
    hoist_transpose_above_pad (a PAD left before the input's NCHW->NHWC TRANSPOSE moves
    after it; once, after the loop, since to_nhwc would sink that transpose back).
    Repeated while some pass changed the graph (at most MAX_ROUNDS times): a CSE or a
    fold can expose more cancellations; a pass is not re-run while nothing changed since
    its last run found nothing to do.
    """
    # A pass that changed nothing, with no change by any pass since, would change nothing
    # again (passes are functions of the graph): `settled` holds those, and is skipped.
    # The loop ends as soon as every pass of ROUND is settled, which is where the full
    # round with no change would have ended.
    changed, structure = _run(remove_dead_code, graph, _structure(graph))
    settled = set() if changed else {remove_dead_code}
    for _ in range(MAX_ROUNDS):
        for graph_pass in ROUND:
            if graph_pass in settled:
                continue
            ops = len(graph.ops)
            changed, structure = _run(graph_pass, graph, structure)
            settled = set() if changed else settled | {graph_pass}
            if graph_pass in FOLDING and len(graph.ops) < ops:
                graph.folded["ops"] = graph.folded.get("ops", 0) + ops - len(graph.ops)
        if settled.issuperset(ROUND):
            break
    for graph_pass in (narrow_int64_indices, hoist_transpose_above_pad, remove_dead_code):
        changed, structure = _run(graph_pass, graph, structure)
    return graph


def optimize(model: Model) -> Model:
    """Optimize every graph (signature) of `model` in place; returns the model."""
    for graph in model.graphs:
        optimize_graph(graph)
    return model
