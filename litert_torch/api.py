"""`litert_torch.convert`: PyTorch module -> EdgeModel (a LiteRT flatbuffer)."""

from __future__ import annotations

import numpy as np
import torch

from converter.pipeline import convert_module
from converter.progress import Progress
from converter.writer import write_flatbuffer
from litert_torch.edge_model import EdgeModel


def _sample_args(sample_args) -> tuple:
    """A tuple of positional sample inputs; a lone tensor is wrapped."""
    if isinstance(sample_args, tuple):
        return sample_args
    if isinstance(sample_args, torch.Tensor):
        return (sample_args,)
    if isinstance(sample_args, np.ndarray):
        raise TypeError("sample_args is a numpy array; pass torch tensors: "
                        "sample_args=(torch.from_numpy(x),)")
    what = "None" if sample_args is None else f"a {type(sample_args).__name__}"
    hint = {
        "list": "a tuple of positional inputs, e.g. sample_args=tuple(my_list)",
        "dict": "keyword inputs as sample_kwargs=..., positional ones as a tuple",
    }.get(type(sample_args).__name__, "a tuple of example inputs, e.g. (torch.randn(1, 3, 224, 224),)")
    raise TypeError(f"sample_args must be a tuple of example inputs (or one tensor); got {what}. Pass {hint}.")


def convert(module: torch.nn.Module, sample_args, sample_kwargs: dict | None = None, *,
            dynamic_shapes=None, strict_export: bool = False, eval_mode: bool = True,
            progress: bool | None = None) -> EdgeModel:
    """Convert `module` to a LiteRT model.

    Args:
        module: the model. It may live on any device; parameters are copied to CPU.
        sample_args: a tuple of example positional inputs (a lone tensor is wrapped).
        sample_kwargs: example keyword inputs.
        dynamic_shapes: passed to `torch.export.export` (e.g. `{"x": {0: Dim("batch")}}`);
            dynamic dimensions become -1 in the model's shape signature.
        strict_export: `torch.export`'s strict (TorchDynamo) tracing; non-strict by default.
        eval_mode: export in eval mode (dropout off, batch norm on running statistics).
            The module's own train/eval flags are restored afterwards.
        progress: show conversion stages; default: only on an interactive terminal
            (or when LITERT_TORCH_PROGRESS=1).

    Returns: an EdgeModel (call it, `.export(path)` it, `.model_content()` for bytes).
    Raises: UnsupportedOpsError (lists every op without a lowering), ConversionError.
    """
    args = _sample_args(sample_args)
    if sample_kwargs is not None and not isinstance(sample_kwargs, dict):
        raise TypeError(f"sample_kwargs must be a dict of keyword inputs, got {type(sample_kwargs).__name__}")
    stages = Progress(progress)
    model = convert_module(module, args, sample_kwargs, dynamic_shapes=dynamic_shapes,
                           strict_export=strict_export, eval_mode=eval_mode, progress=stages)
    with stages.stage("write"):
        content = write_flatbuffer(model)
    stages.note(f"{len(content):,} bytes")
    edge = EdgeModel(content)
    edge.ir_model = model
    edge.timings = dict(stages.timings)
    return edge
