"""Repeated blocks compiled once: a run of calls of the same block lowered as one `lax.scan`.

A model whose layers are N copies of one block (a transformer's decoder layers) gives
XLA N copies of the block's forward and backward to compile when the layers are
unrolled; XLA's compile time grows with the program, and for the 374M Llama step
on a v5e it was 8.5x that of one `lax.scan` over stacked weights (docs/tpu.md).

Marking: `scan_layers(blocks)` makes each block's `forward` a
`torch.compiler.nested_compile_region`. Dynamo then traces the block once and emits one
`torch.ops.higher_order.invoke_subgraph` call per layer, all referencing the same
subgraph, and AOTAutograd keeps them: the forward graph calls a partitioned forward
subgraph per layer, the backward graph a backward subgraph per layer (and, when the
block is checkpointed from outside, the forward subgraph again before each one).

Lowering (`plan_runs`, `Run`): in a graph our interpreter runs, consecutive
invoke_subgraph calls whose subgraphs repeat with a period (`F F F ...`, or `F B F B ...`
for a checkpointed block's backward) form a run. Each operand of the repeated group is
classified once, from the graph alone:

- carried: the previous repetition's output (the residual stream, its gradient);
- internal: an output of an earlier call in the same repetition (F's saved values for B);
- shared: the same value in every repetition (rotary tables);
- stacked: one value per repetition computed before the run (per-layer weights, saved
  activations), stacked into one array along a new leading axis.

The run becomes `lax.scan` over the stacked operands; outputs read outside the run
(per-layer weight gradients, saved activations) come back stacked and are sliced per
layer. Outputs that merely return a stacked or shared operand (the forward subgraph
hands its weights back as saved values) are taken from the operand, not stacked again.
Anything that does not fit (an operand computed between the layers, a group of fewer
than two repetitions) is called unrolled, with the reason said once (`warnings`): the
result is the same, only the compile time differs.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import torch
import torch.fx

from kernels import sharded
from kernels import stack as kernels_stack
from tpu_backend import kernel_mode
from tpu_backend.compile.rows import note, run_of

INVOKE_SUBGRAPH = torch.ops.higher_order.invoke_subgraph

# Longest repeated group looked for: one call (the forward), two (forward and backward
# of an outside-checkpointed block); a little spare for blocks split in several regions.
MAX_PERIOD = 4


# --------------------------------------------------------------------- marking


@functools.cache
def _scanned_class(cls: type) -> type:
    """`cls` with its forward a nested compile region, shared by every instance, so Dynamo
    traces it once and all the layers call one subgraph. A subclass, not an instance
    attribute: with a per-instance bound `forward`, torch 2.13's Dynamo passed every
    layer the first layer's parameters."""
    region = torch.compiler.nested_compile_region(cls.forward)
    # Named here, under a name made from the base class's, so that it pickles by reference
    # in every process that marks the same class (Dynamo's cached guards name it:
    # `dynamo_cache.py`); under the base class's own name pickle would find the base
    name = "scanned__" + f"{cls.__module__}__{cls.__qualname__}".replace(".", "_").replace("<", "_").replace(">", "_")
    # (and as its `__name__`: Dynamo refuses to pickle a class whose name and qualified name differ)
    scanned = type(name, (cls,), {"forward": region, "__module__": __name__, "_scan_layers_base": cls})
    globals()[name] = scanned
    return scanned


def scan_layers(blocks: Iterable[torch.nn.Module]):
    """Compile a model's repeated blocks once under `torch.compile(backend="tpu")`: the
    layers run as one `lax.scan` over their stacked parameters (forward and backward),
    so XLA compiles one block instead of N. Returns `blocks`.

        scan_layers(model.layers)
        step = torch.compile(model, backend="tpu")

    The blocks should be instances of one class with parameters of the same shapes (a
    transformer's decoder layers); they must be called one after the other, each on the
    previous one's output, and their other inputs must be the same for every layer or
    computed before the first one. Activation checkpointing of each block (inside its
    forward or around the call, `torch.utils.checkpoint`; a selective policy such as
    `save_matmuls` only inside the forward) is kept, and recommended: without
    it every layer's saved activations cross from the forward program to the backward one
    as separate tensors, sliced out of the loop and stacked again (a cost at run time). Eager execution is
    unchanged (the blocks' class becomes a subclass whose forward is marked with
    `torch.compiler.nested_compile_region`; `unmark` undoes it). A run that cannot be
    scanned is compiled unrolled, and a warning says why.
    """
    for block in blocks:
        if not isinstance(block, torch.nn.Module):
            raise TypeError(f"scan_layers: expected nn.Module blocks, got {type(block).__name__}")
        if not is_marked(block):
            block.__class__ = _scanned_class(type(block))
    return blocks


def is_marked(block: torch.nn.Module) -> bool:
    return "_scan_layers_base" in type(block).__dict__


def unmark(blocks: Iterable[torch.nn.Module]):
    """Undo `scan_layers` (the blocks' own class again)."""
    for block in blocks:
        if is_marked(block):
            block.__class__ = type(block)._scan_layers_base
    return blocks


def repeated_blocks(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """A model's stack of repeated blocks (a transformer's decoder layers): of its
    `ModuleList`s whose entries are two or more modules of one class, the one holding the
    most parameters; None when there is none."""
    stacks = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({_base_class(b) for b in m}) == 1
    ]
    return max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)


def _base_class(block: torch.nn.Module) -> type:
    return type(block).__dict__.get("_scan_layers_base", type(block))


# --------------------------------------------------------------------- tracing


def _operand_key(value):
    if isinstance(value, torch.Tensor):
        return (
            type(value),
            tuple(value.shape),
            tuple(value.stride()),
            value.storage_offset(),
            value.dtype,
            value.device,
            value.requires_grad,
        )
    return (type(value), value if isinstance(value, (int, float, bool, str)) else id(value))


@contextlib.contextmanager
def schema_checked_once():
    """AOTAutograd's trace of the marked blocks, with the mutation check done once per block.

    Before its cache of traced blocks (keyed by the subgraph's identifier), PyTorch's
    autograd rule for `invoke_subgraph` (`HigherOrderOperator.py_autograd_impl`, torch
    2.13) generates the call's schema to refuse blocks that write their inputs, and that
    re-traces the whole block with `make_fx` (`materialize_as_graph`) at every call:
    once per layer in AOTAutograd's metadata pass and once more in its joint trace. For the
    374M Llama that was 48 traces of the block, about a third of AOTAutograd's time.

    Inside this scope the schema of a call is computed once per (subgraph object,
    identifier, operands' types, shapes, strides, dtypes, devices and `requires_grad`,
    dispatch keys and grad mode) and reused: the check itself is unchanged (a block that
    writes an input is still refused at its first call), and the schema depends on
    nothing else."""
    hop = INVOKE_SUBGRAPH
    if "gen_schema" in hop.__dict__:  # nested: the outer scope's memo serves
        yield
        return
    generate = type(hop).gen_schema
    memo: dict = {}

    def gen_schema(subgraph, identifier, *operands):
        key = (
            id(subgraph),
            identifier,
            tuple(_operand_key(o) for o in operands),
            repr(torch._C._dispatch_tls_local_include_set()),
            repr(torch._C._dispatch_tls_local_exclude_set()),
            torch.is_grad_enabled(),
        )
        found = memo.get(key)
        if found is not None and found[0] is subgraph:
            return found[1]
        schema = generate(hop, subgraph, identifier, *operands)
        memo[key] = (subgraph, schema)  # holding the subgraph keeps its id unique
        return schema

    hop.gen_schema = gen_schema
    try:
        yield
    finally:
        del hop.gen_schema


# --------------------------------------------------------------------- planning


_warned: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


@dataclass
class Slot:
    """Where operand `index` of the group's call `call` comes from, in every repetition.

    kind: "carried" (`source` = (call, output) of the previous repetition), "internal"
    (`source` of the same repetition), "shared" (`value`: one node or constant) or
    "stacked" (`values`: one node per repetition)."""

    call: int
    index: int
    kind: str
    source: tuple[int, int] | None = None
    value: Any = None
    values: tuple = ()


class Run:
    """`repeats` repetitions of a group of `period` invoke_subgraph calls, as one lax.scan."""

    def __init__(self, calls: list[torch.fx.Node], period: int, slots: list[list[Slot]], outputs: dict, inputs: list):
        self.calls = calls
        self.inputs = inputs  # the nodes the scan reads (computed first, wherever they are in the graph)
        self.period = period
        self.repeats = len(calls) // period
        self.slots = slots
        self.carried = [slot for group in slots for slot in group if slot.kind == "carried"]
        self.stacked = [slot for group in slots for slot in group if slot.kind == "stacked"]
        # (call, output) -> how it is produced: "stacked" (scan output), "forwarded"
        # (a stacked/shared operand handed back), or absent (nobody reads it)
        self.outputs = outputs
        self.stacked_outputs = [key for key, how in outputs.items() if how == "stacked"]

    def __repr__(self) -> str:
        return f"Run({self.repeats} x {self.period} call(s) of {[c.args[1] for c in self.calls[: self.period]]})"

    def evaluate(self, functions: list, env: dict, state: dict, map_nodes) -> dict:
        """The values of every call of the run (tuples of outputs), computed by one scan.

        Stacked operands that are already consecutive rows of one array (`rows.run_of`:
        the backward's weights and layer inputs, handed over by the forward) are read from
        it; the others are stacked, and their values noted as the stack's rows. The
        per-layer outputs are noted as rows of the scan's stacked outputs; a carried value
        read outside the run (each layer's input, saved for the backward) comes back as
        the stack of the layers' inputs, so the first is the run's initial value."""
        repeats, period = self.repeats, self.period
        init = tuple(map_nodes(slot.values[0], env) for slot in self.carried)
        operands = [_operand([map_nodes(v, env) for v in slot.values]) for slot in self.stacked]
        xs = tuple(base for base, first, step in operands if _whole(base, first, step, repeats))
        indexed = any(not _whole(*operand, repeats) for operand in operands)
        keys = []
        for fn in functions:
            if fn.needs_rng:
                state["key"], key = jax.random.split(state["key"])
                keys.append(jax.random.split(key, repeats))
            else:
                keys.append(None)
        shared = {
            (s.call, s.index): map_nodes(s.value, env) for group in self.slots for s in group if s.kind == "shared"
        }
        carried_at = {}
        for i, s in enumerate(self.carried):
            carried_at.setdefault(s.source, i)
        as_inputs = set()  # outputs returned as the stack of the carry's incoming values

        def body(carry, per_layer):
            whole, layer_keys, i = per_layer
            whole = iter(whole)
            layer = [
                next(whole) if _whole(base, first, step, repeats) else _row(base, first + step * i)
                for base, first, step in operands
            ]
            carried = dict(zip(((s.call, s.index) for s in self.carried), carry))
            stacked = dict(zip(((s.call, s.index) for s in self.stacked), layer))
            results = []
            for j, (fn, group) in enumerate(zip(functions, self.slots)):
                args = []
                for slot in group:
                    where = (slot.call, slot.index)
                    if slot.kind == "internal":
                        args.append(results[slot.source[0]][slot.source[1]])
                    elif slot.kind == "carried":
                        args.append(carried[where])
                    elif slot.kind == "stacked":
                        args.append(stacked[where])
                    else:
                        args.append(shared[where])
                _, outs = fn.run(args, layer_keys[j])
                results.append(outs)
            new_carry = tuple(_like(results[s.source[0]][s.source[1]], old) for s, old in zip(self.carried, carry))
            ys = []
            for j, q in self.stacked_outputs:
                out, c = results[j][q], carried_at.get((j, q))
                if c is not None and _same_type(out, carry[c]):
                    as_inputs.add((j, q))
                    out = carry[c]
                ys.append(out)
            return new_carry, tuple(ys)

        counter = jnp.arange(repeats) if indexed else None
        final, ys = jax.lax.scan(body, init, (xs, tuple(keys), counter), length=repeats)
        stacked_at = {key: i for i, key in enumerate(self.stacked_outputs)}
        final_of = {s.source: value for s, value in zip(self.carried, final)}
        for (j, q), i in stacked_at.items():
            if (j, q) in as_inputs:
                note(init[carried_at[(j, q)]], ys[i], 0)
        values = {}
        for k in range(repeats):
            for j in range(period):
                node = self.calls[k * period + j]
                n_out = len(functions[j].output_nodes)
                outs = []
                for q in range(n_out):
                    how = self.outputs.get((j, q))
                    if how == "stacked" and (j, q) in as_inputs:  # the next layer's input; the last: the final carry
                        outs.append(final_of[(j, q)] if k == repeats - 1 else _row(ys[stacked_at[(j, q)]], k + 1))
                    elif how == "stacked":
                        outs.append(_row(ys[stacked_at[(j, q)]], k))
                    elif k == repeats - 1 and (j, q) in final_of:
                        outs.append(final_of[(j, q)])
                    elif isinstance(how, tuple):  # ("forwarded", operand index)
                        slot = self.slots[j][how[1]]
                        source = slot.values[k] if slot.kind == "stacked" else slot.value
                        outs.append(map_nodes(source, env))
                    else:
                        outs.append(None)
                values[node] = tuple(outs)
        return values


def _operand(values: list) -> tuple:
    """A stacked operand as (array, first row, step): rows of an array already, or stacked."""
    found = run_of(values)
    if found is not None:
        return found
    stacked = stack(values)
    for k, value in enumerate(values):
        note(value, stacked, k)
    return stacked, 0, 1


def _whole(base, first: int, step: int, repeats: int) -> bool:
    """Whether the operand is its array as it is (the scan's `xs`), not rows read by index."""
    return first == 0 and step == 1 and base.shape[0] == repeats


def _row(base, k):
    """Row `k` (static or traced) of `base`, noted as such when `k` is static."""
    value = jax.lax.dynamic_index_in_dim(base, k, keepdims=False)
    if isinstance(k, int):
        note(value, base, k)
    return value


def _same_type(a, b) -> bool:
    return (
        a.shape == b.shape and a.dtype == b.dtype and getattr(a, "weak_type", False) == getattr(b, "weak_type", False)
    )


def stack(values: list):
    """`jnp.stack(values)`; on a TPU as one DMA per value (`kernels/stack.py`): XLA's TPU
    compiler takes ~0.7 s for each stack of 24 layers' weights, which were half of the
    scanned 374M Llama's compile. XLA stacks under a device mesh (it cannot partition a
    Mosaic call) and where the kernels are off."""
    impl = kernel_mode.implementation()
    on_a_mesh = sharded.current(impl) is not None or jax.sharding.get_abstract_mesh().size > 1
    return kernels_stack.stack(values, impl="reference" if on_a_mesh else impl)


def _like(value, reference):
    """A new carry with exactly the old one's type (lax.scan compares them, weak types too)."""
    value = jnp.asarray(value)
    if value.dtype != reference.dtype or getattr(value, "weak_type", False) != getattr(reference, "weak_type", False):
        value = jax.lax.convert_element_type(value, reference.dtype)
    return value


def _getitem_of(node, calls: dict) -> tuple[torch.fx.Node, int] | None:
    if (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is operator.getitem
        and node.args[0] in calls
        and isinstance(node.args[1], int)
    ):
        return node.args[0], node.args[1]
    return None


def _depends_on(nodes, targets: set) -> torch.fx.Node | None:
    """A node among `nodes` that is, or is computed from, one of `targets`; else None."""
    seen: set = set()
    for root in nodes:
        stack = [root]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node in targets:
                return root
            stack.extend(node.all_input_nodes)
    return None


def _same_shape(nodes) -> bool:
    metas = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in nodes]
    if not all(isinstance(m, torch.Tensor) for m in metas):
        return False
    first = metas[0]
    return all(tuple(m.shape) == tuple(first.shape) and m.dtype == first.dtype for m in metas)


# The first repetition alone is tied to the rest of the graph: with the block checkpointed
# from outside, the last layer's recomputed forward feeds the head's backward, whose result
# is the first gradient the run carries. That repetition is called unrolled, the rest scanned.
FIRST_REPETITION_TIED = "the first layer's operands are computed from its own outputs"


def _build_run(calls: list[torch.fx.Node], period: int, subgraphs: list) -> Run | str:
    """The run of `calls` (repetitions of `period` calls), or why it cannot be scanned."""
    repeats = len(calls) // period
    where = {call: divmod(i, period) for i, call in enumerate(calls)}  # call -> (repetition, position)
    for call in calls:
        for user in call.users:
            if _getitem_of(user, where) is None:
                return f"a call's outputs are used as a whole ({user.format_node()})"
    slots: list[list[Slot]] = []
    for j in range(period):
        operands = [calls[k * period + j].args[2:] for k in range(repeats)]
        if len({len(ops) for ops in operands}) != 1:
            return "the repetitions pass different numbers of operands"
        group = []
        for a in range(len(operands[0])):
            values = tuple(ops[a] for ops in operands)
            links = []
            for v in values:
                item = _getitem_of(v, where)
                links.append(None if item is None else (*where[item[0]], item[1]))  # (repetition, position, output)
            later = links[1:]
            if all(
                link is not None and link[0] == k and link[1] == later[0][1] for k, link in enumerate(later)
            ) and all(link[2] == later[0][2] for link in later):
                if links[0] is not None:
                    return f"operand {a} of call {j} of the group comes from the run itself in its first repetition"
                group.append(Slot(j, a, "carried", source=(later[0][1], later[0][2]), values=values))
            elif all(
                link is not None and link[0] == k and link[1] < j and (link[1], link[2]) == (links[0][1], links[0][2])
                for k, link in enumerate(links)
            ):
                group.append(Slot(j, a, "internal", source=(links[0][1], links[0][2])))
            elif any(link is not None for link in links):
                return f"operand {a} of call {j} of the group links the repetitions irregularly"
            elif all(v is values[0] for v in values) or (
                not isinstance(values[0], torch.fx.Node) and all(v == values[0] for v in values)
            ):
                group.append(Slot(j, a, "shared", value=values[0]))
            elif any(not isinstance(v, torch.fx.Node) for v in values):
                return f"operand {a} of call {j} of the group is a constant that differs between repetitions"
            elif not _same_shape(values):
                return f"operand {a} of call {j} of the group has different shapes or dtypes in different repetitions"
            else:
                group.append(Slot(j, a, "stacked", values=values))
        slots.append(group)
    inputs = [
        v
        for group in slots
        for slot in group
        for v in (
            (slot.values[0],) if slot.kind == "carried" else slot.values if slot.kind == "stacked" else (slot.value,)
        )
        if isinstance(v, torch.fx.Node)
    ]
    late = _depends_on(inputs, set(calls))
    if late is not None:
        if _depends_on(inputs, set(calls[period:])) is None:
            return FIRST_REPETITION_TIED
        return f"an operand of one block ({late.name}) is computed from the output of another, not passed as an operand"
    carried_sources = {slot.source for group in slots for slot in group if slot.kind == "carried"}
    outputs: dict = {}
    for call in calls:
        k, j = where[call]
        for item in call.users:
            q = item.args[1]
            external = False
            for user in item.users:
                if user in where:
                    k2, j2 = where[user]
                    uses = [slots[j2][a] for a, v in enumerate(user.args[2:]) if v is item]
                    linked = all(
                        (s.kind == "carried" and k2 == k + 1 and s.source == (j, q))
                        or (s.kind == "internal" and k2 == k and s.source == (j, q))
                        for s in uses
                    )
                    if linked and uses:
                        continue
                external = True
            if not external or (k == repeats - 1 and (j, q) in carried_sources):
                continue
            forwarded = subgraphs[j].forwarded_operand(q)
            if forwarded is not None and slots[j][forwarded].kind in ("stacked", "shared"):
                outputs[(j, q)] = ("forwarded", forwarded)
            else:
                outputs[(j, q)] = "stacked"
    return Run(calls, period, slots, outputs, list(dict.fromkeys(inputs)))


def plan_runs(gm: torch.fx.GraphModule, subgraph_function) -> dict[torch.fx.Node, Run]:
    """The runs of repeated invoke_subgraph calls in `gm`, keyed by every call they cover.
    `subgraph_function(node)` gives the `GraphFunction` a call's subgraph runs as."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is INVOKE_SUBGRAPH]
    identity = [subgraph_function(call) for call in calls]
    runs: dict[torch.fx.Node, Run] = {}
    i = 0
    while i < len(calls):
        best = None
        for period in range(1, MAX_PERIOD + 1):
            template = identity[i : i + period]
            if len(template) < period:
                break
            repeats = 1
            while identity[i + repeats * period : i + (repeats + 1) * period] == template:
                repeats += 1
            if repeats >= 2 and (best is None or repeats * period > best[0] * best[1]):
                best = (repeats, period)
        if best is None:
            i += 1
            continue
        repeats, period = best
        chosen = calls[i : i + repeats * period]
        run = _build_run(chosen, period, identity[i : i + period])
        if run == FIRST_REPETITION_TIED:
            if repeats == 2:  # one left: nothing to scan, and nothing lost by calling both
                i += repeats * period
                continue
            run = _build_run(chosen[period:], period, identity[i : i + period])
        if isinstance(run, str):
            _say_once(
                f"tpu: {repeats} repeated calls of block {chosen[0].args[1]!r} are compiled unrolled "
                f"(no lax.scan, so XLA compiles each copy): {run}"
            )
            i += repeats * period
            continue
        for call in run.calls:
            runs[call] = run
        i += repeats * period
    return runs


__all__ = [
    "INVOKE_SUBGRAPH",
    "Run",
    "is_marked",
    "plan_runs",
    "repeated_blocks",
    "scan_layers",
    "schema_checked_once",
    "unmark",
]
