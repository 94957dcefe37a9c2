"""`litert_torch.convert`: PyTorch module -> EdgeModel (a LiteRT flatbuffer)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from common.messages import a_type
from converter import ir
from converter.errors import ConversionError, ExportError
from converter.pipeline import convert_module, module_tensors
from converter.progress import Progress
from converter.writer import write_flatbuffer_parts
from litert_torch.edge_model import EdgeModel
from runtimes.litert import CalibrationRunner
from runtimes.targets import TargetError


def _sample_args(sample_args) -> tuple:
    """A tuple of positional sample inputs; a lone tensor is wrapped."""
    if isinstance(sample_args, tuple):
        return sample_args
    if isinstance(sample_args, torch.Tensor):
        return (sample_args,)
    if isinstance(sample_args, np.ndarray):
        raise TypeError("sample_args is a numpy array; pass torch tensors: sample_args=(torch.from_numpy(x),)")
    hint = {
        "list": "a tuple of positional inputs, e.g. sample_args=tuple(my_list)",
        "dict": "keyword inputs as sample_kwargs=..., positional ones as a tuple",
    }.get(type(sample_args).__name__, "a tuple of example inputs, e.g. (torch.randn(1, 3, 224, 224),)")
    raise TypeError(
        f"sample_args must be a tuple of example inputs (or one tensor); got {a_type(sample_args)}. Pass {hint}."
    )


@dataclass
class SignatureSpec:
    """One signature of a model: a module and its sample inputs, under a name."""

    name: str
    module: torch.nn.Module
    sample_args: tuple
    sample_kwargs: dict | None = None
    dynamic_shapes: object = None
    output_names: list[str] | None = None  # the signature's output names (default output_0, ...)


def _name_outputs(graph: ir.Graph, spec: SignatureSpec) -> None:
    names = list(spec.output_names)
    if len(names) != len(graph.outputs) or len(set(names)) != len(names):
        raise ValueError(
            f"signature '{spec.name}': output_names must be {len(graph.outputs)} distinct "
            f"names (forward() returns {len(graph.outputs)} tensors), got {names}"
        )
    graph.output_names = names


def _warn_if_bfloat16(spec: SignatureSpec, weights: list[torch.Tensor]) -> None:
    """LiteRT has no bfloat16 kernels: bf16 weights and inputs are stored and computed as
    float32 (twice the bytes, float32 numbers). Say so rather than surprise the user."""
    inputs = [
        t
        for t in torch.utils._pytree.tree_leaves((spec.sample_args, spec.sample_kwargs or {}))
        if isinstance(t, torch.Tensor)
    ]
    if any(t.dtype == torch.bfloat16 for t in weights + inputs):
        warnings.warn(
            f"signature '{spec.name}': the model has bfloat16 weights or inputs; LiteRT has no bfloat16 "
            "kernels, so the file stores and computes them in float32 (inputs and outputs are float32). "
            "Use quant_config (e.g. float16 or int8 weights) for a smaller file.",
            UserWarning,
            stacklevel=4,
        )


def check_prepares(content: bytes, model: ir.Model) -> None:
    """Raise ConversionError unless LiteRT (default delegate) can prepare `content`, the
    file `converter.writer` wrote from `model`, naming the op it refused and the user's
    source line that made it."""
    from runtimes.litert import PrepareError, prepare_model

    try:
        prepare_model(content, verify=False)  # the writer's validate refused what the verifier would
    except PrepareError as e:
        where = ""
        if (
            e.subgraph is not None
            and e.node is not None
            and e.subgraph < len(model.graphs)
            and e.node < len(model.graphs[e.subgraph].ops)
        ):
            graph = model.graphs[e.subgraph]
            op = graph.ops[e.node]
            where = f" at {op.opcode} (op {e.node} of signature '{graph.name}'" + (
                f", from {op.source})" if op.source else ")"
            )
        raise ConversionError(
            f"LiteRT cannot prepare the converted model{where}: {e}\n"
            "The file would not load on a device; this is a converter bug, please report it "
            "with the model."
        ) from e


def convert(
    module: torch.nn.Module,
    sample_args,
    sample_kwargs: dict | None = None,
    *,
    dynamic_shapes=None,
    strict_export: bool = False,
    eval_mode: bool = True,
    quant_config=None,
    calibration_data=None,
    target: str | None = None,
    target_check: str = "error",
    progress: bool | None = None,
    metadata: dict[str, bytes] | None = None,
) -> EdgeModel:
    """Convert `module` to a LiteRT model.

    Args:
        module: the model. It may live on any device; parameters are copied to CPU.
        sample_args: a tuple of example positional inputs (a lone tensor is wrapped).
        sample_kwargs: example keyword inputs.
        dynamic_shapes: passed to `torch.export.export` (e.g. `{"x": {0: Dim("batch")}}`);
            dynamic dimensions become -1 in the model's shape signature. A tuple with one
            entry per positional arg is also accepted with `sample_kwargs` (which stay static).
        strict_export: `torch.export`'s strict (TorchDynamo) tracing; non-strict by default.
        eval_mode: export in eval mode (dropout off, batch norm on running statistics).
            The module's own train/eval flags are restored afterwards.
        quant_config: a quantization scheme (`litert_torch.quantize`); None keeps float32.
        calibration_data: an iterable of sample args, for schemes that need activation
            ranges (full-integer).
        target: a deployment target profile ("android-gpu", "web", "micro", ...): its
            rewrites are applied, then its rules checked (`edge.target_report`).
        target_check: "error" (default) raises TargetError when the model breaks a rule of
            the target; "warn" keeps the model and leaves the report on `edge.target_report`.
        progress: show conversion stages; default: only on an interactive terminal
            (or when LITERT_TORCH_PROGRESS=1).
        metadata: entries written into the file's metadata (name -> bytes), e.g. what a
            runtime needs to drive the model; `runtimes.targets.model_view.metadata_entry`
            reads one back.

    Returns: an EdgeModel (call it, `.export(path)` it, `.model_content()` for bytes).
    Raises: UnsupportedOpsError (lists every op without a lowering), ConversionError.
    """
    spec = SignatureSpec("serving_default", module, _sample_args(sample_args), sample_kwargs, dynamic_shapes)
    return convert_signatures(
        [spec],
        strict_export=strict_export,
        eval_mode=eval_mode,
        quant_config=quant_config,
        calibration_data=calibration_data,
        target=target,
        target_check=target_check,
        progress=progress,
        metadata=metadata,
    )


def convert_signatures(
    specs: list[SignatureSpec],
    *,
    strict_export: bool = False,
    eval_mode: bool = True,
    quant_config=None,
    calibration_data=None,
    target: str | None = None,
    target_check: str = "error",
    progress: bool | None = None,
    metadata: dict[str, bytes] | None = None,
) -> EdgeModel:
    """Convert one or more signatures into one model; constants with equal bytes (shared
    weights) are stored once. The pipeline: validate every option (before any work),
    convert each signature, quantize, apply and check the target, write."""
    if not specs:
        raise ValueError("no signatures to convert")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"signature names must be unique, got {names}")
    for name, payload in (metadata or {}).items():
        if not isinstance(name, str) or not isinstance(payload, bytes) or name == "min_runtime_version":
            raise TypeError(
                f"metadata maps names (str, not min_runtime_version) to bytes; got {name!r}: {type(payload).__name__}"
            )
    for spec in specs:
        if spec.sample_kwargs is not None and not isinstance(spec.sample_kwargs, dict):
            raise TypeError(f"sample_kwargs must be a dict of keyword inputs, got {type(spec.sample_kwargs).__name__}")
    if quant_config is not None:
        from converter.quantize import validate_config

        quant_config = validate_config(quant_config, calibration_data, specs)
    profile = None
    if target is not None:
        from runtimes.targets import CHECK_MODES, get_profile

        profile = get_profile(target)
        if target_check not in CHECK_MODES:
            raise ValueError(f"target_check must be one of {CHECK_MODES}, got {target_check!r}")

    # Without torch's per-node stack traces (about 15% of torch.export's time); an error
    # that names the user's source lines of ops (a ConversionError, a TargetError's op
    # violations) is then made again with them. (A one-shot
    # calibration iterator cannot be read twice: then they are recorded from the start.)
    one_shot = calibration_data is not None and iter(calibration_data) is calibration_data
    options = dict(
        strict_export=strict_export,
        eval_mode=eval_mode,
        quant_config=quant_config,
        calibration_data=calibration_data,
        profile=profile,
        target_check=target_check,
        metadata=dict(metadata or {}),
    )
    try:
        return _convert(specs, Progress(progress), source_lines=one_shot, **options)
    except ExportError:
        raise
    except (ConversionError, TargetError):
        if one_shot:
            raise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (shown by the first attempt)
            return _convert(specs, Progress(False), source_lines=True, **options)


def _convert(
    specs, stages: Progress, *, strict_export, eval_mode, quant_config, calibration_data, profile, target_check,
    metadata: dict[str, bytes], source_lines: bool,
) -> EdgeModel:  # fmt: skip
    """`convert_signatures` after its checks: convert each signature, quantize, apply and
    check the target, write, prepare."""
    graphs = []
    for spec in specs:
        # (not a module: export_module says what is wrong with it)
        tensors = module_tensors(spec.module) if isinstance(spec.module, torch.nn.Module) else None
        _warn_if_bfloat16(spec, tensors or [])
        part = convert_module(
            spec.module,
            spec.sample_args,
            spec.sample_kwargs,
            dynamic_shapes=spec.dynamic_shapes,
            strict_export=strict_export,
            eval_mode=eval_mode,
            progress=stages,
            name=spec.name,
            tensors=tensors,
            source_lines=source_lines,
        )
        if spec.output_names is not None:
            _name_outputs(part.graphs[0], spec)
        graphs += part.graphs
    model = ir.Model(graphs, metadata=metadata)
    if quant_config is None:  # a torch.ao PT2E/QAT model: honour its quantize/dequantize pairs
        from converter.quantize.qdq import has_qdq

        if has_qdq(model):
            from converter.quantize import QuantConfig

            quant_config = QuantConfig("pt2e")
    quant_report = None
    if quant_config is not None:
        from converter.quantize import quantize

        with stages.stage("quantize", str(quant_config)):
            quant_report = quantize(
                model,
                quant_config,
                calibration_data,  # rewrites model in place
                runner=CalibrationRunner,
                progress=stages,
            )
    report = None
    if profile is not None:
        from litert_torch.targets import write_for_target

        with stages.stage("target", profile.name):  # rewrites, the one write, the check
            content, report = write_for_target(model, profile, on_violation=target_check)
    else:
        with stages.stage("write"):
            content = write_flatbuffer_parts(model)  # pieces: large weights are not joined in memory
    stages.note(f"{len(content):,} bytes")
    verified = len(content.pieces) == 1
    if verified:  # over 2 GB the check would join the weights into one more copy
        with stages.stage("prepare"):
            content.pieces[0] = bytes(content.head)  # the one copy: the interpreter and the EdgeModel share it
            check_prepares(content.head, model)
    edge = EdgeModel(content, _verified=verified)
    edge.ir_model = model
    edge.timings = dict(stages.timings)
    edge.cpu_timings = dict(stages.cpu_timings)
    edge.target_report = report
    edge.quant_report = quant_report
    return edge
