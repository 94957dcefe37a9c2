"""Graph rewrites a deployment target asks for, applied to our IR before it is written.

A target profile (`runtimes.targets.profiles`) names the rewrites it needs
(`Profile.rewrites`); `apply_target_rewrites(model, profile.rewrites)` runs them in that
order. Each rewrite is a function `(ir.Model) -> list[str]` that edits the model in place
and returns one line per change (they land in the target report's `rewrites`). A rewrite
never changes what the model computes: it swaps ops for equivalents the target runs, or
moves dtype conversions to the model's edges.
"""

from __future__ import annotations

import numpy as np

from common.tflite_schema import ELEMENTWISE_SAME_SHAPE, tensor_type_name
from converter import ir


def reshape_for_expand_squeeze(model: ir.Model) -> list[str]:
    """EXPAND_DIMS / SQUEEZE -> RESHAPE to the output's shape (GPU delegates have no kernel
    for either; RESHAPE is supported everywhere)."""
    changes = []
    for graph in model.graphs:
        for i, op in enumerate(graph.ops):
            if op.opcode not in ("EXPAND_DIMS", "SQUEEZE"):
                continue
            out = op.outputs[0]
            new_shape = list(out.shape_signature or out.shape)
            if sum(d < 0 for d in new_shape) > 1:
                continue  # two dynamic dims: RESHAPE cannot express it statically
            shape = ir.Tensor(f"{out.name}/shape", (len(new_shape),), np.int32, data=np.asarray(new_shape, np.int32))
            graph.ops[i] = ir.Op("RESHAPE", [op.inputs[0], shape], [out], {"newShape": new_shape}, op.source)
            changes.append(f"{graph.name}: op #{i} {op.opcode} -> RESHAPE {new_shape}")
    return changes


def _cast(x: ir.Tensor, y: ir.Tensor) -> ir.Op:
    return ir.Op("CAST", [x], [y], {"inDataType": tensor_type_name(x.dtype), "outDataType": tensor_type_name(y.dtype)})


# Web I/O dtypes LiteRT.js cannot pass, and what to pass instead.
WEB_IO = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.bool_): np.dtype(np.uint8)}


def web_io_dtypes(model: ir.Model) -> list[str]:
    """int64 inputs/outputs -> int32 (bool -> uint8), with a CAST inside the model, so
    LiteRT.js can feed and read them (it has no int64 or bool tensors)."""
    changes = []
    for graph in model.graphs:
        for k, x in enumerate(graph.inputs):
            if x.dtype in WEB_IO:
                outer = ir.Tensor(x.name, x.shape, WEB_IO[x.dtype], shape_signature=x.shape_signature)
                x.name = f"{x.name}/{x.dtype.name}"
                graph.inputs[k] = outer
                graph.ops.insert(0, _cast(outer, x))
                changes.append(f"{graph.name}: input {k} {x.dtype.name} -> {outer.dtype.name} (CAST inside)")
        for k, y in enumerate(graph.outputs):
            if y.dtype in WEB_IO:
                outer = ir.Tensor(
                    f"{y.name}/{WEB_IO[y.dtype].name}", y.shape, WEB_IO[y.dtype], shape_signature=y.shape_signature
                )
                graph.ops.append(_cast(y, outer))
                graph.outputs[k] = outer
                changes.append(f"{graph.name}: output {k} {y.dtype.name} -> {outer.dtype.name} (CAST inside)")
    return changes


def static_shapes(model: ir.Model) -> list[str]:
    """Fix every dynamic dimension to the sample's size (micro and Edge TPU plan memory
    once, for fixed shapes)."""
    changes = []
    for graph in model.graphs:
        dynamic = [t for t in graph.tensors() if t.is_dynamic]
        for t in dynamic:
            t.shape_signature = None
        for op in graph.ops:
            if op.opcode == "RESHAPE" and -1 in op.options.get("newShape", []):
                op.options["newShape"] = list(op.outputs[0].shape)
        if dynamic:
            changes.append(
                f"{graph.name}: {len(dynamic)} dynamic tensor(s) fixed to the sample shapes "
                f"(inputs {[list(t.shape) for t in graph.inputs]})"
            )
    return changes


GPU_MAX_RANK = 4


def _reshaped(x: ir.Tensor, shape: tuple[int, ...], name: str) -> tuple[ir.Tensor, ir.Op]:
    y = ir.Tensor(name, shape, x.dtype, quant=x.quant)
    target = ir.Tensor(f"{name}/shape", (len(shape),), np.int32, data=np.asarray(shape, np.int32))
    return y, ir.Op("RESHAPE", [x, target], [y], {"newShape": list(shape)})


def _fold_reshape_chains(graph: ir.Graph) -> int:
    """RESHAPE(RESHAPE(x)) -> RESHAPE(x), identity RESHAPEs bypassed, then RESHAPEs nobody
    reads dropped; returns how many RESHAPEs went away."""
    removed = 0
    producers = graph.producers()
    for op in graph.ops:
        if op.opcode != "RESHAPE":
            continue
        src = producers.get(op.inputs[0].id)
        if src is not None and src.opcode == "RESHAPE":
            op.inputs = [src.inputs[0], *op.inputs[1:]]
    outputs = {t.id for t in graph.outputs}
    for op in graph.ops:  # identity reshapes: readers take the input itself
        if (
            op.opcode == "RESHAPE"
            and op.inputs[0].shape == op.outputs[0].shape
            and op.outputs[0].id not in outputs
            and not op.inputs[0].is_dynamic
        ):
            graph.replace_uses(op.outputs[0], op.inputs[0])
    consumers = graph.consumers()
    kept = []
    for op in graph.ops:
        out = op.outputs[0] if op.outputs else None
        if op.opcode == "RESHAPE" and out.id not in outputs and not consumers.get(out.id):
            removed += 1
            continue
        kept.append(op)
    graph.ops = kept
    return removed


def reduce_rank(model: ir.Model) -> list[str]:
    """Elementwise ops on same-shape tensors of rank above 4 run on rank-4 views (leading
    dimensions merged) between RESHAPEs; chains of RESHAPEs then fold, so the rank-5
    tensors disappear where only reshapes and elementwise ops touch them (GPU delegates
    reject rank 5 and above). Broadcasting and other ops are left for the check to report."""
    changes = []
    for graph in model.graphs:
        rewritten, ops = 0, []
        for op in graph.ops:
            tensors = [t for t in [*op.inputs, *op.outputs] if t is not None and not t.is_const]
            shapes = {t.shape for t in tensors}
            if (
                op.opcode not in ELEMENTWISE_SAME_SHAPE
                or len(shapes) != 1
                or any(t.is_dynamic for t in tensors)
                or len(next(iter(shapes))) <= GPU_MAX_RANK
                or any(t.is_const and t.nbytes > t.dtype.itemsize for t in op.inputs if t is not None)
            ):
                ops.append(op)
                continue
            shape = next(iter(shapes))
            merge = len(shape) - GPU_MAX_RANK + 1
            small = (int(np.prod(shape[:merge])), *shape[merge:])
            inputs = []
            for k, t in enumerate(op.inputs):
                if t is None or t.is_const:
                    inputs.append(t)
                    continue
                view, reshape = _reshaped(t, small, f"{t.name}/rank{GPU_MAX_RANK}_{op.outputs[0].name}_{k}")
                ops.append(reshape)
                inputs.append(view)
            out = op.outputs[0]
            view = ir.Tensor(f"{out.name}/rank{GPU_MAX_RANK}", small, out.dtype, quant=out.quant)
            ops.append(ir.Op(op.opcode, inputs, [view], op.options, op.source))
            back = ir.Tensor(f"{out.name}/shape", (len(shape),), np.int32, data=np.asarray(shape, np.int32))
            ops.append(ir.Op("RESHAPE", [view, back], [out], {"newShape": list(shape)}))
            rewritten += 1
        graph.ops = ops
        if rewritten:
            folded = _fold_reshape_chains(graph)
            changes.append(
                f"{graph.name}: {rewritten} elementwise op(s) of rank > {GPU_MAX_RANK} run on rank-"
                f"{GPU_MAX_RANK} views ({folded} reshape(s) folded)"
            )
    return changes


REWRITES = {f.__name__: f for f in (reshape_for_expand_squeeze, reduce_rank, web_io_dtypes, static_shapes)}


def apply_target_rewrites(model: ir.Model, names) -> list[str]:
    """Run the rewrites `names` (a profile's `rewrites`, in order) on `model` in place;
    returns one line per change."""
    unknown = [n for n in names if n not in REWRITES]
    if unknown:
        raise ValueError(f"unknown target rewrite(s) {unknown}; known: {sorted(REWRITES)}")
    changes = []
    for name in names:
        changes += REWRITES[name](model)
    return changes
