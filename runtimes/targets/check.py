"""Check a .tflite model against a target profile: every op or tensor that breaks a rule,
why, and what to do.

Works on any LiteRT file (it reads the flatbuffer, see `model_view.py`), on our IR (written
first) and on an EdgeModel. One small function per kind of rule; each yields Violations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from runtimes.targets.model_view import ModelView, OpView, SubgraphView, TensorView, read_model
from runtimes.targets.profiles import WEIGHTED_OPS, Profile, get_profile

FLOAT_DTYPES = {"float32", "float16", "float64", "bfloat16"}

# What to do about an op a target lacks, where there is something better to say than
# "replace it".
OP_FIXES = {
    "EXPAND_DIMS": "use RESHAPE instead (convert with this target=... to rewrite it)",
    "SQUEEZE": "use RESHAPE instead (convert with this target=... to rewrite it)",
    "GELU": (
        "no GELU kernel here in either form (the tanh approximation converts to the same GELU op): "
        "use an activation the target has, e.g. nn.ReLU, nn.Hardswish or x * torch.sigmoid(1.702 * x) "
        "(LOGISTIC + MUL), and fine-tune after the change"
    ),
    "DEQUANTIZE": "quantize the whole model to int8 (litert_torch.quantize.full_int8) so no float part remains",
    "CAST": "keep the dtype unchanged in the model (cast outside, in the app)",
    "GATHER": "for embeddings, one-hot @ matrix (FULLY_CONNECTED) maps to the accelerator",
    "BATCH_MATMUL": "for a constant right-hand side, use nn.Linear (FULLY_CONNECTED)",
}


@dataclass
class Violation:
    rule: str  # short id: "unsupported-op", "rank", "io-dtype", "float-op" ...
    severity: str  # "error" or "warning"
    where: str  # "serving_default: op #3 EXPAND_DIMS" or "...: tensor 'x' float32[1, 8]"
    why: str
    fix: str
    source: str = ""  # the op's layer and source line, where the converter knows them (convert(target=...))

    def __str__(self) -> str:
        source = f" ({self.source})" if self.source else ""
        return f"[{self.severity}] {self.where}{source}: {self.why}. Fix: {self.fix}"


@dataclass
class TargetReport:
    """The outcome of checking one model against one profile."""

    target: str
    runtime: str
    violations: list[Violation] = field(default_factory=list)
    ops: int = 0
    tensors: int = 0
    file_size: int = 0
    rewrites: list[str] = field(default_factory=list)  # what prepare_for_target changed

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when nothing stops the model from running on the target as the profile says."""
        return not self.errors

    def summary(self) -> str:
        verdict = "compatible" if self.ok else "NOT compatible"
        return (
            f"{self.target} ({self.runtime}): {verdict}: {len(self.errors)} error(s), "
            f"{len(self.warnings)} warning(s) over {self.ops} ops, {self.tensors} tensors"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  rewrite: {r}" for r in self.rewrites]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<TargetReport {self.summary()}>"

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "runtime": self.runtime,
            "ok": self.ok,
            "ops": self.ops,
            "tensors": self.tensors,
            "file_size": self.file_size,
            "rewrites": list(self.rewrites),
            "violations": [vars(v).copy() for v in self.violations],
        }


class TargetError(ValueError):
    """A model breaks its target's rules; `.report` holds every violation."""

    def __init__(self, report: TargetReport):
        self.report = report
        super().__init__(
            f"{report}\nPass target_check='warn' to keep the model anyway (the report is then on edge.target_report)."
        )


# ---------------------------------------------------------------------------------- helpers


def _where(sg: SubgraphView, thing: OpView | TensorView) -> str:
    return f"{sg.name}: {thing.describe()}"


def _users(sg: SubgraphView) -> dict[int, list[OpView]]:
    users: dict[int, list[OpView]] = {}
    for op in sg.ops:
        for t in [*op.inputs, *op.outputs]:
            if t is not None:
                users.setdefault(t.index, [])
                if op not in users[t.index]:
                    users[t.index].append(op)
    return users


def _op_list(ops: list[OpView], limit: int = 3) -> str:
    names = [f"#{op.index} {op.opcode}" for op in ops[:limit]]
    more = f" and {len(ops) - limit} more" if len(ops) > limit else ""
    return ", ".join(names) + more


def _computed(t: TensorView) -> bool:
    return not t.is_const and not t.is_variable


# ---------------------------------------------------------------------------------- rules


def unsupported_ops(view: ModelView, sg: SubgraphView, p: Profile):
    graph_outputs = {t.index for t in sg.outputs}
    for op in sg.ops:
        if op.opcode.startswith("CUSTOM:"):
            yield Violation(
                "custom-op",
                "error",
                _where(sg, op),
                f"custom op '{op.opcode[7:]}' is not built into {p.runtime}",
                "register its kernel in the app, or express it with builtin ops",
            )
        elif p.ops is not None and op.opcode not in p.ops:
            tail = all(t.index in graph_outputs for t in op.outputs)
            severity = "warning" if tail and op.opcode in ("DEQUANTIZE", "QUANTIZE") else p.unsupported_severity
            effect = "runs on the CPU after the accelerated part" if severity == "warning" else "is not supported"
            yield Violation(
                "unsupported-op",
                severity,
                _where(sg, op),
                f"{op.opcode} {effect} by {p.runtime}",
                OP_FIXES.get(op.opcode, "replace the PyTorch op that produced it with one the target runs"),
            )


def op_options(view: ModelView, sg: SubgraphView, p: Profile):
    for op in sg.ops:
        for rule in p.op_rules:
            if rule.opcode == op.opcode:
                why = rule.broken(op)
                if why:
                    yield Violation(
                        "op-options",
                        rule.severity,
                        _where(sg, op),
                        f"{op.opcode} {why}, which {p.runtime} does not accept",
                        rule.fix,
                    )


def ranks(view: ModelView, sg: SubgraphView, p: Profile):
    if p.max_rank is None:
        return
    users = _users(sg)
    for t in sg.tensors:
        if t.rank > p.max_rank and t.index in users:
            yield Violation(
                "rank",
                "error",
                _where(sg, t),
                f"rank {t.rank} is above {p.runtime}'s limit of {p.max_rank} (used by {_op_list(users[t.index])})",
                f"reshape to rank {p.max_rank} or less (merge leading or unit dimensions)",
            )


def innermost_dims(view: ModelView, sg: SubgraphView, p: Profile):
    if p.innermost_dims is None:
        return
    users = _users(sg)
    for t in sg.tensors:
        outer = t.shape[: -p.innermost_dims] if t.rank > p.innermost_dims else ()
        if any(d > 1 for d in outer) and _computed(t) and t.index in users:
            yield Violation(
                "rank",
                "error",
                _where(sg, t),
                f"only the {p.innermost_dims} innermost dimensions may exceed 1 (used by {_op_list(users[t.index])})",
                "fold the outer dimensions into the inner ones (batch 1, reshape)",
            )


def compute_dtypes(view: ModelView, sg: SubgraphView, p: Profile):
    if p.compute_dtypes is None:
        return
    users = _users(sg)
    for t in sg.tensors:
        if _computed(t) and t.index in users and t.dtype not in p.compute_dtypes:
            if p.integer_only and t.dtype in FLOAT_DTYPES:
                continue  # reported per op by float_ops
            yield Violation(
                "dtype",
                "error",
                _where(sg, t),
                f"{t.dtype} tensors are not computed by {p.runtime} "
                f"(allowed: {', '.join(sorted(p.compute_dtypes))}; used by {_op_list(users[t.index])})",
                "keep this value in a supported dtype (e.g. int32 indices, float32 math)",
            )


def float_ops(view: ModelView, sg: SubgraphView, p: Profile):
    if not p.integer_only:
        return
    for op in sg.ops:
        if op.opcode in ("QUANTIZE", "DEQUANTIZE"):
            continue  # the float<->int boundary ops are integer-model ops
        floats = [t for t in [*op.inputs, *op.outputs] if t is not None and _computed(t) and t.dtype in FLOAT_DTYPES]
        if floats:
            yield Violation(
                "float-op",
                "error",
                _where(sg, op),
                f"computes in {floats[0].dtype} ({floats[0].describe()}); {p.float_reason}",
                "quantize the model fully to int8 (quant_config=litert_torch.quantize.full_int8(...) "
                "with calibration_data)",
            )


def io_dtypes(view: ModelView, sg: SubgraphView, p: Profile):
    if p.io_dtypes is None:
        return
    for kind, tensors in (("input", sg.inputs), ("output", sg.outputs)):
        for t in tensors:
            if t.dtype not in p.io_dtypes:
                yield Violation(
                    "io-dtype",
                    "error",
                    f"{sg.name}: {kind} {t.describe()}",
                    f"{kind}s of type {t.dtype} are not accepted by {p.runtime} "
                    f"(allowed: {', '.join(sorted(p.io_dtypes))})",
                    f"convert with target='{p.name}' (it casts {kind}s to int32) or change the model's {kind} dtype",
                )


def static_shapes(view: ModelView, sg: SubgraphView, p: Profile):
    if not p.static_shapes:
        return
    for t in [*sg.inputs, *sg.outputs]:
        if t.is_dynamic:
            yield Violation(
                "dynamic-shape",
                "error",
                _where(sg, t),
                f"{p.runtime} needs static shapes (dimensions fixed when the model is compiled)",
                "export without dynamic_shapes, or convert with this target (it fixes dims to the sample)",
            )


def constant_weights(view: ModelView, sg: SubgraphView, p: Profile):
    if not p.constant_weights:
        return
    for op in sg.ops:
        for k in WEIGHTED_OPS.get(op.opcode, ()):
            t = op.inputs[k] if k < len(op.inputs) else None
            if t is not None and _computed(t):
                yield Violation(
                    "constant-weights",
                    "warning",
                    _where(sg, op),
                    f"its {'filter' if k == 1 else 'bias'} {t.describe()} is computed at run time; "
                    "XNNPACK only takes constant filters and biases, so this op runs on the slower "
                    "builtin kernels",
                    "make the weights parameters/constants (no ops between the parameter and the layer)",
                )


def xnnpack_int16(view: ModelView, sg: SubgraphView, p: Profile):
    """XNNPACK has no int16x8 kernels (DESIGN: seen with ai-edge-litert 2.3.0): such ops
    run on the builtin reference kernels."""
    if not p.constant_weights:  # the XNNPACK profiles
        return
    for op in sg.ops:
        wide = [t for t in op.outputs if _computed(t) and t.dtype == "int16"]
        if wide:
            yield Violation(
                "int16",
                "warning",
                _where(sg, op),
                f"int16 activations ({wide[0].describe()}): XNNPACK has no int16x8 kernels, so this "
                "op runs on the slower builtin kernels",
                "use full_int8 (or float) for CPU targets; int16x8 suits microcontrollers",
            )


def per_tensor_dequantize(view: ModelView, sg: SubgraphView, p: Profile):
    if not p.per_tensor_dequantize:
        return
    for op in sg.ops:
        src = op.inputs[0] if op.opcode == "DEQUANTIZE" and op.inputs else None
        if src is not None and src.scales > 1:
            yield Violation(
                "dequantize",
                "error",
                _where(sg, op),
                f"dequantizes per-channel ({src.scales} scales); {p.runtime} dequantizes per-tensor only",
                "quantize fully so the weights are consumed as int8, or use per-tensor scales",
            )


def alignment(view: ModelView, sg: SubgraphView, p: Profile):
    if p.buffer_alignment is None or sg.index:
        return  # buffers are shared by subgraphs: check once
    seen = set()
    for s in view.subgraphs:
        for t in s.tensors:
            if t.data_offset is not None and t.data_offset not in seen and t.data_offset % p.buffer_alignment:
                seen.add(t.data_offset)
                yield Violation(
                    "alignment",
                    "error",
                    _where(s, t),
                    f"constant data starts at byte {t.data_offset}, not a multiple of "
                    f"{p.buffer_alignment}; {p.runtime} reads weights in place",
                    "re-export with litert_torch (it aligns weight data) or run tflite-micro's tflite_flatbuffer_align",
                )


def model_limits(view: ModelView, p: Profile):
    """Whole-model rules: size, external data, subgraph count, on-chip cache."""
    if p.max_file_bytes is not None and view.file_size > p.max_file_bytes:
        yield Violation(
            "size",
            "error",
            "model",
            f"{view.file_size:,} bytes exceed {p.runtime}'s limit of {p.max_file_bytes:,}",
            "quantize the weights (int8 weights are 4x smaller) or split the model",
        )
    if not p.external_buffers and view.uses_external_buffers:
        yield Violation(
            "size",
            "error",
            "model",
            f"weights are stored after the flatbuffer (a >2 GB layout); {p.runtime} cannot read it",
            "shrink the model below 2 GB (quantize the weights)",
        )
    if p.max_subgraphs is not None and len(view.subgraphs) > p.max_subgraphs:
        yield Violation(
            "subgraphs",
            "error",
            "model",
            f"{len(view.subgraphs)} subgraphs/signatures; {p.runtime} runs {p.max_subgraphs}",
            "convert one signature per file for this target",
        )
    if p.weight_cache_bytes is not None and view.constant_bytes > p.weight_cache_bytes:
        yield Violation(
            "size",
            "warning",
            "model",
            f"{view.constant_bytes:,} bytes of parameters exceed the "
            f"{p.weight_cache_bytes:,} bytes of on-chip memory; the rest streams from host memory "
            "on every run",
            "use a smaller model",
        )


SUBGRAPH_RULES = (
    unsupported_ops,
    op_options,
    ranks,
    innermost_dims,
    compute_dtypes,
    float_ops,
    io_dtypes,
    static_shapes,
    constant_weights,
    xnnpack_int16,
    per_tensor_dequantize,
    alignment,
)


def check_view(view: ModelView, profile: Profile) -> TargetReport:
    report = TargetReport(
        profile.name,
        profile.runtime,
        ops=sum(len(s.ops) for s in view.subgraphs),
        tensors=sum(len(s.tensors) for s in view.subgraphs),
        file_size=view.file_size,
    )
    report.violations += list(model_limits(view, profile))
    for sg in view.subgraphs:
        for rule in SUBGRAPH_RULES:
            report.violations += list(rule(view, sg, profile))
    return report


def _content(model) -> bytes:
    """Bytes of a path, bytes, or anything with `model_content()` (an EdgeModel)."""
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"no such model file: {model}")
        with open(model, "rb") as f:
            return f.read()
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if hasattr(model, "model_content"):
        return bytes(model.model_content())
    raise TypeError(
        f"check() takes a .tflite path, bytes or an EdgeModel; got {type(model).__name__} "
        "(a converter IR model: pass converter.writer.write_flatbuffer(model))"
    )


def check(path_or_model, target, *, quiet: bool = False) -> TargetReport:
    """Check a model (a .tflite path, bytes or an EdgeModel) against `target`
    ("android-gpu", "web", "micro", ...). Prints the report unless `quiet`; returns it."""
    from runtimes.verify import verify_model

    profile = get_profile(target)
    content = _content(path_or_model)
    # Any file may come here: bounds-check it before following its offsets.
    verify_model(content, str(path_or_model) if isinstance(path_or_model, (str, os.PathLike)) else "the model")
    report = check_view(read_model(content), profile)
    if not quiet:
        print(report)
    return report
