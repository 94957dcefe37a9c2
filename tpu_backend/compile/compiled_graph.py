"""One AOTAutograd graph as a callable on tensors: `compile_for_tpu(gm, name)`.

The graph becomes a `Program` (`interpreter.compile_graph`: the graph interpreted through
the shared lowering table inside one `jax.jit`, compiled once per input signature and
cached on disk). At run time the callable (`CompiledGraph`) takes the JAX payloads of its
tensor inputs (tpu tensors: their device arrays; CPU tensors: copies), runs the program
and wraps the outputs as tensors on the device each output's metadata names.

Inputs a graph writes (an optimizer step's parameters and state, batch norm's running
statistics) are written by the callable itself, with their old buffers donated to the
program where nothing else holds them. A graph with symbolic sizes goes to `dynamic.py`
(bucketed shapes).

The Dynamo backend (`backend.py`) and AOTAutograd's cache (`graph_cache.py`, which
rebuilds the callable after loading a graph) both compile through here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import weakref
from typing import Any, Sequence

import jax
import numpy as np
import torch

from tpu_backend import native
from tpu_backend import random as device_random
from tpu_backend import tensor as device_tensor
from tpu_backend.compile import dynamic, rows
from tpu_backend.compile.interop import BACKEND_NAME, jax_to_tensor, tensor_to_jax
from tpu_backend.compile.interpreter import GraphProgram, compile_graph, lift_input_mutations
from tpu_backend.compile.program import is_array
from tpu_backend.compile.scan import INVOKE_SUBGRAPH
from tpu_backend.ops.registry import jax_dtype

try:
    from jax._src.array import ArrayImpl  # the concrete array class: an exact type test is ~10x isinstance
except ImportError:  # pragma: no cover - a JAX without it: every input takes the general path
    ArrayImpl = ()

_DEFAULT_BUCKETS = object()  # "the process-wide policy" (dynamic.set_buckets)


def _input_to_jax(value):
    if isinstance(value, torch.Tensor):
        return tensor_to_jax(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("torch.compile(backend='tpu'): a symbolic value reached the compiled graph at run time")
    return value


# --------------------------------------------------------------------- the compiled callable


def _output_nodes(gm: torch.fx.GraphModule) -> list:
    """What the graph's output node returns, in order (nodes, or None and constants)."""
    return list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])


def _output_values(gm: torch.fx.GraphModule) -> list:
    """Per graph output, its FakeTensor metadata (None where there is none)."""
    return [item.meta.get("val") if isinstance(item, torch.fx.Node) else None for item in _output_nodes(gm)]


def _output_devices(gm: torch.fx.GraphModule) -> list[torch.device | None]:
    """Per graph output, the device its FakeTensor metadata says (None for non-tensors)."""
    return [value.device if isinstance(value, torch.Tensor) else None for value in _output_values(gm)]


def _scalar_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the graph's 0-d floating outputs (a loss), which `CompiledGraph` starts
    copying to the host once computed: `loss.item()` then does not wait for a transfer
    (a scalar's read on a v5e: 0.74 ms waiting for it, 0.07 ms with it done)."""
    return tuple(
        i
        for i, value in enumerate(_output_values(gm))
        if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype.is_floating_point
    )


class _Slot:
    """How input `index` of a graph is read fast: a contiguous tpu tensor of `shape` and
    `dtype` whose storage array is exactly the tensor (every parameter and optimizer state
    of a training step). Anything else, or a tensor that does not match at run time, takes
    the general path (`tensor_to_jax`)."""

    __slots__ = ("shape", "dtype", "numel", "array_dtype")

    def __init__(self, value: torch.Tensor):
        self.shape = tuple(int(d) for d in value.shape)
        self.dtype = value.dtype
        self.numel = value.numel()
        self.array_dtype = np.dtype(jax_dtype(value.dtype))


def _input_slots(gm: torch.fx.GraphModule) -> list[_Slot | None]:
    slots = []
    for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("val")
        fast = (
            isinstance(value, torch.Tensor)
            and value.device.type == BACKEND_NAME
            and all(isinstance(d, int) for d in value.shape)
            and value.is_contiguous()
            and not value.is_conj()
            and not value.is_neg()
        )
        slots.append(_Slot(value) if fast else None)
    return slots


def _read_inputs(args: list, slots: list, general=_input_to_jax) -> tuple[list, list]:
    """(the JAX value of every argument, the storage payload of each one read the fast way
    or None). The fast way is `device_tensor.read`'s own hot path, inlined, with the shape
    and dtype known from the graph: ~1 us an input instead of ~3; `general` reads the rest."""
    values, payloads = [], []
    for arg, slot in zip(args, slots):
        if slot is not None:
            payload = device_tensor.payload_if_tpu(arg)
            if payload is not None:
                base = payload.array
                if (
                    type(base) is ArrayImpl
                    and payload.dtype is slot.dtype
                    and base.shape == slot.shape
                    and arg.storage_offset() == 0
                    and arg.shape == slot.shape
                    and arg.is_contiguous()
                    and not arg.is_neg()
                    and not arg.is_conj()
                ):
                    values.append(base)
                    payloads.append(payload)
                    continue
        values.append(general(arg))
        payloads.append(None)
    return values, payloads


python_read_inputs = _read_inputs  # the definition; in C++ (no Python step per input):
if hasattr(native.load(), "whole_arrays"):

    def _read_inputs(
        args: list, slots: list, general=_input_to_jax, _whole_arrays=native.module.whole_arrays
    ) -> tuple[list, list]:
        return _whole_arrays(args, slots, general)


class CompiledGraph:
    """What AOTAutograd calls for one graph: a list of tensors (and numbers) in, a list out.

    AOTAutograd's boxed convention: the argument list is emptied once read, so saved
    activations die as early as possible. `_boxed_call` is an instance attribute because
    Dynamo wraps the backward callable with `functools.wraps`, which copies `__dict__`.

    `written`: the inputs the graph writes (`lift_input_mutations`); their new values are
    the program's last outputs. The old buffers of `donated` (among them) go to a second
    program, built with `donate`, when nothing but the input tensor holds them.
    `scalars`: outputs copied to the host as soon as they are computed (`_scalar_outputs`).
    """

    def __init__(
        self,
        program: GraphProgram,
        output_devices: list[torch.device | None],
        written: Sequence[int] = (),
        donating: GraphProgram | None = None,
        donated: Sequence[int] = (),
        slots: Sequence[_Slot | None] | None = None,
        scalars: Sequence[int] = (),
    ):
        self.program = program
        self.scalars = tuple(i for i in scalars if i < len(output_devices))  # not the written inputs' new values
        self.output_devices = output_devices
        self.written = tuple(written)
        self.donating = donating
        self.donated = tuple(donated)
        self.slots = list(slots) if slots is not None else None
        # inputs that may come as rows of a stacked array: the operands of scanned blocks
        self.row_inputs = () if self.written else _block_operands(program.graph_fn.gm)
        self._row_programs: dict[tuple, GraphProgram] = {}
        self._boxed_call = True

    def __call__(self, args: list) -> list:
        program = self.program
        # the operands of scanned blocks may be rows of a stacked array (a forward's saved
        # values): those are found among the inputs not read the fast way
        general = _input_or_row if self.row_inputs else _input_to_jax
        if self.slots is not None and len(args) == len(self.slots):
            values, payloads = _read_inputs(args, self.slots, general)
        else:
            values, payloads = [general(a) for a in args], [None] * len(args)
        if self.row_inputs:
            layout, bases = rows.take_rows(values, self.row_inputs, args, _input_to_jax)
            if layout:  # the program takes the stacked arrays
                program = self._with_rows(layout)
                values.extend(bases)
        targets = [(args[i], payloads[i], self.slots[i] if payloads[i] else None) for i in self.written]
        devices = self.output_devices
        if any(device is None for device in devices):
            fallback = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            devices = [device or fallback for device in devices]
        args.clear()
        if self.donating is not None and device_tensor.held_only_by_their_tensors(values, self.donated):
            program = self.donating
        if program.needs_rng:
            # The device's key stream: seeded by torch.manual_seed, one fresh key per call.
            _, outputs = program(device_random.next_key(), *values)
        else:
            outputs = program(*values)
        del values
        for i in self.scalars:
            if type(outputs[i]) is ArrayImpl:
                outputs[i].copy_to_host_async()
        if self.written:
            outputs, new_values = outputs[: -len(self.written)], outputs[-len(self.written) :]
            for (target, payload, slot), value in zip(targets, new_values):
                if payload is not None and payload.numel == slot.numel and _fits(value, slot):
                    payload.array = value  # `device_tensor.write`'s hot path: the tensor is its whole storage
                else:
                    _store(target, value)
        if self.program.rows_as_views:
            return _with_views(outputs, devices)
        return [jax_to_tensor(out, device) if is_array(out) else out for out, device in zip(outputs, devices)]

    def _with_rows(self, layout: tuple) -> GraphProgram:
        """The program taking the inputs of `layout` as rows of stacked arrays (`rows.py`)."""
        program = self._row_programs.get(layout)
        if program is None:
            plain = self.program
            fn = rows.RowLayout(plain.graph_fn, len(plain.graph_fn.placeholders), layout)
            program = GraphProgram(fn, plain.name, plain.source)
            program.identity = lambda: f"{plain.identity()}\ninputs as rows {layout}"
            program = self._row_programs.setdefault(layout, program)  # (also built ahead, on a thread)
        return program

    def compile_rows_ahead(self, forward: GraphProgram, output_names: list, names: list, arguments: list) -> None:
        """Compile ahead the variant this backward will run: its inputs that the forward
        returns as rows (known once the forward is traced) taken as the stacked arrays."""
        try:
            returned = forward.row_outputs.result(timeout=_FORWARD_TRACE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the forward failed or is slow: compile as before
            returned = {}
        row_of = {output_names[i]: row for i, row in returned.items() if i < len(output_names)}
        rows_in: dict[int, int] = {}  # forward's stack -> its rows (those it returns)
        for b, k in returned.values():
            rows_in[b] = max(rows_in.get(b, 0), k + 1)
        offset = 1 if self.program.needs_rng else 0
        layout, first = [], {}  # first: forward's stack -> (ordinal, the argument of one row)
        for p in self.row_inputs:
            if names[p] in row_of:
                b, k = row_of[names[p]]
                first.setdefault(b, (len(first), arguments[offset + p]))
                layout.append((p, first[b][0], k))
        if not layout:
            self.program.compile_ahead(arguments)
            return
        taken = {offset + p for p, _, _ in layout}
        plain = [a for i, a in enumerate(arguments) if i not in taken]
        bases = [
            jax.ShapeDtypeStruct((rows_in[b], *row.shape), row.dtype, sharding=row.sharding)
            for b, (_, row) in first.items()  # in ordinal order
        ]
        self._with_rows(tuple(layout)).compile_ahead(plain + bases)


_FORWARD_TRACE_TIMEOUT_S = 900


def _input_or_row(arg):
    """An input's JAX value, or `rows.Row` when it is a row of its storage's stacked array."""
    found = rows.stacked_view(arg)
    return rows.Row(*found) if found is not None else _input_to_jax(arg)


def _with_views(outputs, devices) -> list:
    """Outputs as tensors; the rows of one stacked array (`rows.Row`) as tensors over one
    storage. Not views of it: each row has its own version counter, so writing one row in
    place does not flag the others (saved layer inputs) for autograd; a row returned twice
    (a layer's input, also a user output) is one tensor and its `detach()`, which share
    theirs, so writing the user's one fails the backward as in eager."""
    stacks: dict[int, torch.Tensor] = {}
    made: dict[tuple, torch.Tensor] = {}
    tensors = []
    for out, device in zip(outputs, devices):
        if type(out) is rows.Row:
            stacked = stacks.get(id(out.base))
            if stacked is None:
                stacked = stacks[id(out.base)] = jax_to_tensor(out.base, device)
            row = made.get((id(out.base), out.index))
            if row is not None:
                tensors.append(row.detach())
                continue
            row = made[(id(out.base), out.index)] = device_tensor.over_storage(
                stacked.untyped_storage(),
                out.index * stacked.stride(0),
                stacked.shape[1:],
                stacked.stride()[1:],
                stacked.dtype,
            )
            tensors.append(row)
        else:
            tensors.append(jax_to_tensor(out, device) if is_array(out) else out)
    return tensors


def _block_operands(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the placeholders that `invoke_subgraph` calls take directly."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    used = {
        arg
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is INVOKE_SUBGRAPH
        for arg in n.args[2:]
        if isinstance(arg, torch.fx.Node)
    }
    return tuple(i for i, n in enumerate(placeholders) if n in used)


def _fits(value, slot: _Slot) -> bool:
    return type(value) is ArrayImpl and value.shape == slot.shape and value.dtype == slot.array_dtype


def _store(target: torch.Tensor, value) -> None:
    """The graph's new value of an input tensor, written into it (through views)."""
    if target.device.type == BACKEND_NAME:
        device_tensor.write(target, value)
    else:
        with torch.no_grad():
            target.copy_(jax_to_tensor(value, target.device))


def graph_identity(gm: torch.fx.GraphModule) -> str:
    """What the program of `gm` computes, as text that is the same in every process: each
    node of the graph and its subgraphs in order (op, target, arguments, with nodes
    written by position: names change when a graph is pickled), the dtype and shape
    PyTorch expects of each output (outputs are cast to them), and a hash of each
    constant tensor's bytes. The lowered-program cache's key (`program_cache.py`)."""
    lines = []
    for path, module in gm.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        lines.append(f"graph {path or '<root>'}")
        position = {node: i for i, node in enumerate(module.graph.nodes)}
        for node in module.graph.nodes:
            args, kwargs = (_by_position(value, position) for value in (node.args, node.kwargs))
            line = f"%{position[node]} {node.op} {_target_name(node)} {args!r} {kwargs!r}"
            if node.op == "get_attr":
                line += " " + _constant_digest(module, node.target)
            elif node.op == "output":
                outputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
                metas = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in outputs]
                line += f" {[(m.dtype, tuple(m.shape)) if isinstance(m, torch.Tensor) else repr(m) for m in metas]}"
            lines.append(line)
    return "\n".join(lines)


def _by_position(value, position: dict):
    return torch.fx.node.map_arg(value, lambda node: f"%{position[node]}")


def _target_name(node: torch.fx.Node) -> str:
    if node.op == "placeholder":
        return ""
    target = node.target
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', None) or target}:{target}"


def _constant_digest(module: torch.fx.GraphModule, target: str) -> str:
    value = module
    for part in target.split("."):
        value = getattr(value, part)
    if isinstance(value, torch.fx.GraphModule):
        # its nodes are listed on their own; not its class name, which depends on how it
        # was made (`<lambda>` for a traced cond branch, `GraphModule` once rebuilt)
        return "subgraph"
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    # a fresh row-major copy: `.contiguous()` keeps a stride of 0 on size-1 dimensions
    # (an expanded one-element constant), which `view(torch.uint8)` refuses
    data = torch.empty(value.shape, dtype=value.dtype).copy_(value.detach())
    digest = hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
    return f"{data.dtype} {tuple(data.shape)} {digest}"


def compile_for_tpu(gm: torch.fx.GraphModule, name: str, buckets=_DEFAULT_BUCKETS) -> CompiledGraph:
    """One AOTAutograd graph as a callable on tensors (usable as an AOTAutograd compiler)."""
    from tpu_backend.kernels import fuse_residual_norms

    for module in gm.modules():  # the graph and the blocks it calls (scan_layers' subgraphs)
        if isinstance(module, torch.fx.GraphModule):
            _remove_profiler_marks(module)
            fuse_residual_norms(module)  # `norm(x + r)` -> one Pallas norm kernel doing the add (when kernels are on)
    policy = dynamic.buckets() if buckets is _DEFAULT_BUCKETS else dynamic.as_buckets(buckets)
    written = lift_input_mutations(gm)
    # A graph that writes its inputs runs at exact shapes: padding cannot reach the inputs.
    if policy is not None and not written and dynamic.has_symbolic_sizes(gm):
        return dynamic.BucketedCompiledGraph(dynamic.compile_bucketed(gm, name, policy), gm, _output_devices(gm))
    devices = _output_devices(gm)
    devices = devices[: len(devices) - len(written)]
    # A training forward returns the rows of its scans' stacks as views of one storage
    # each, which the backward takes whole (`rows.py`).
    program = compile_graph(gm, name, rows_as_views=name.endswith(FORWARD))
    program.identity = functools.partial(graph_identity, gm)
    if written:
        offset = 1 if program.needs_rng else 0  # the key is the first array argument
        values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        tensor_inputs = [isinstance(v, torch.Tensor) for v in values]
        # 0-d tensors (AdamW's step counts) are not donated: there is nothing to save, and
        # XLA copies each one in and out around its in-place update (60 more kernels and
        # 1.3x the step time for the small transformer's 30 counts at batch 1).
        donated = [i for i in written if values[i].dim() > 0]
        donate = tuple(offset + sum(tensor_inputs[:i]) for i in donated)
        donating = compile_graph(gm, name, donate=donate, fn=program.graph_fn) if donate else None
        if donating is not None:
            donating.identity = program.identity
        return CompiledGraph(program, devices, written, donating, donated, _input_slots(gm), _scalar_outputs(gm))
    compiled = CompiledGraph(program, devices, slots=_input_slots(gm), scalars=_scalar_outputs(gm))
    if compiles_ahead():
        if program.rows_as_views:
            _FORWARDS[name.removesuffix(FORWARD)] = (
                weakref.ref(program),
                [getattr(n, "name", None) for n in _output_nodes(gm)],
            )
        arguments = _abstract_arguments(gm, program.needs_rng)
        forward, output_names = _FORWARDS.pop(name.removesuffix(BACKWARD), (lambda: None, None))
        forward = forward()
        if arguments is not None and forward is not None and compiled.row_inputs:
            names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
            threading.Thread(
                target=compiled.compile_rows_ahead, args=(forward, output_names, names, arguments), daemon=True
            ).start()
        elif arguments is not None:
            program.compile_ahead(arguments)
    return compiled


_PROFILER_MARKS = (
    torch.ops.profiler._record_function_enter.default,
    torch.ops.profiler._record_function_enter_new.default,
    torch.ops.profiler._record_function_exit.default,
    torch.ops.profiler._record_function_exit._RecordFunction,
)


def _remove_profiler_marks(gm: torch.fx.GraphModule) -> None:
    """Drop `record_function` enters and exits: traced while a profiler runs (a scanned
    block's graph has them), they compute nothing, and the program they are in is one
    event of the trace as a whole (Inductor drops them too)."""
    marks = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _PROFILER_MARKS]
    for node in reversed(marks):  # exits (which use the enters' results) first
        gm.graph.erase_node(node)
    if marks:
        gm.recompile()


# How `backend.tpu` names a training step's two graphs (`torch_compile_3_forward`): a
# training forward returns rows (`rows.py`), and its backward is found by the same prefix.
FORWARD, BACKWARD = "_forward", "_backward"

# The training forward just compiled ahead, by name (`torch_compile_3`), until its backward
# is: the program and its output names, which are the names of the backward's saved values.
_FORWARDS: dict[str, tuple] = {}


def compiles_ahead() -> bool:
    """Whether a graph's program starts compiling when AOTAutograd hands it over, on a
    thread, rather than at its first call (`TPU_COMPILE_AHEAD`: `auto`, the default, is
    on for a TPU; `on`; `off`). The backward graph is handed over with the forward then
    (`backend.tpu`), so XLA compiles the two at once, and the backward also while the
    forward runs. On JAX's CPU backend XLA compiles quickly and the thread would only
    compete with the steps."""
    setting = os.environ.get("TPU_COMPILE_AHEAD", "auto").strip().lower()
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"TPU_COMPILE_AHEAD={setting!r}: expected auto, on or off")
    return setting == "on" or (setting == "auto" and jax.default_backend() == "tpu")


def _abstract_arguments(gm: torch.fx.GraphModule, needs_rng: bool) -> list | None:
    """The program's arguments as the first call will pass them (`CompiledGraph.__call__`:
    each tensor's array, on the default device; a fresh random key first), or None where
    that cannot be known from the graph (numbers, symbolic sizes, another device)."""
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    arguments = []
    if needs_rng:
        key = jax.eval_shape(lambda: jax.random.key(0))
        arguments.append(jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding))
    for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("val")
        if (
            not isinstance(value, torch.Tensor)
            or not all(isinstance(d, int) for d in value.shape)
            or value.device.type not in (BACKEND_NAME, "cpu")
            or (value.device.type == BACKEND_NAME and (value.device.index or 0) != 0)
        ):
            return None
        arguments.append(jax.ShapeDtypeStruct(tuple(value.shape), jax_dtype(value.dtype), sharding=sharding))
    return arguments


def graph_compiler(name: str, buckets=_DEFAULT_BUCKETS):
    """An AOTAutograd `fw_compiler`/`bw_compiler` naming its program `name`."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        return compile_for_tpu(gm, name, buckets)

    compiler.__name__ = f"tpu_compiler_{name}"
    return compiler
