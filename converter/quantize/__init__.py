"""Quantization of converted models (the `quant_config=` of `litert_torch.convert`).

`validate_config(config, calibration_data, specs)` runs BEFORE any conversion work and
raises a clear error for a bad scheme, block size, I/O type, keep_float name or
calibration set; it returns the config holding the checked calibration samples.
`quantize(model, config, calibration_data)` rewrites the converted float IR:

| scheme | module |
| --- | --- |
| dynamic_int8, weight_only_int8, weight_only_int4, float16 | `weights.py` |
| full_int8, int16x8 (calibrated) | `calibrate.py` (ranges) + `full_integer.py` |
| pt2e (torch.ao quantize/dequantize pairs) | `qdq.py` + `full_integer.py` |
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from common.messages import a_type
from converter import ir
from converter.quantize.calibrate import calibrated_ranges
from converter.quantize.config import CALIBRATED, IO_TYPES, SCHEMES, AutoConfig, QuantConfig
from converter.quantize.report import FloatOp, QuantizationWarning, QuantReport

__all__ = [
    "QuantConfig",
    "AutoConfig",
    "CalibrationSamples",
    "calibrated_ranges",
    "QuantReport",
    "FloatOp",
    "QuantizationWarning",
    "validate_config",
    "quantize",
    "SCHEMES",
]

_IO_FOR = {"full_int8": ("float", "int8", "uint8"), "int16x8": ("float", "int16"), "pt2e": ("float", "int8")}


def _as_config(config) -> QuantConfig:
    if isinstance(config, (QuantConfig, AutoConfig)):
        return config
    if isinstance(config, str) and config in SCHEMES:
        return QuantConfig(config)
    raise TypeError(
        f"quant_config must be a litert_torch.quantize config, e.g. quantize.dynamic_int8() or "
        f"quantize.full_int8(); got {config!r}. Schemes: {', '.join(SCHEMES)}"
    )


def validate_config(config, calibration_data, specs) -> QuantConfig:
    """Check `config` and `calibration_data` against the signatures; returns the config
    with `samples` = {signature name: [tuple of numpy arrays]}. Raises ValueError/TypeError."""
    from converter.quantize.select import check_keep_float

    config = _as_config(config)
    if isinstance(config, AutoConfig):
        config.check()
        base = validate_config(config.base, calibration_data, specs)
        if len(specs) != 1:
            raise ValueError("auto: mixed precision for a budget takes a model with one signature")
        evals = CalibrationSamples(config.eval_data, specs[0], False)
        if evals.one_shot:
            raise TypeError(
                "auto: eval_data must be a list (or another sequence) of samples: it is evaluated once per candidate"
            )
        return dataclasses.replace(config, base=base, eval_samples={specs[0].name: evals})
    if config.scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {config.scheme!r}; one of {', '.join(SCHEMES)}")
    config.check()
    if config.scheme == "weight_only_int4":
        _check_block_size(config, specs)
    allowed_io = _IO_FOR.get(config.scheme, ("float",))
    if config.io not in allowed_io:
        raise ValueError(
            f"io={config.io!r} is not available for {config.scheme}; choose one of {list(allowed_io)}"
            + ("" if config.io in IO_TYPES else f" (model I/O types: {list(IO_TYPES)})")
        )
    check_keep_float(config.keep_float, [s.module for s in specs])
    samples = None
    if config.scheme in CALIBRATED:
        if calibration_data is None:
            raise ValueError(
                f"{config.scheme} needs calibration_data=: an iterable of sample-args tuples shaped like "
                f"sample_args (a few dozen representative inputs), e.g. "
                f"calibration_data=[(torch.randn(1, 3, 224, 224),) for _ in range(32)]"
            )
        samples = _check_calibration(calibration_data, specs)
    elif calibration_data is not None:
        warnings.warn(
            f"calibration_data is ignored by {config.scheme} (only {', '.join(CALIBRATED)} calibrate)", stacklevel=3
        )
    return dataclasses.replace(config, keep_float=tuple(config.keep_float), samples=samples)


def _check_block_size(config: QuantConfig, specs) -> None:
    from converter.quantize.select import keeps_float

    b = config.block_size
    if not isinstance(b, int) or isinstance(b, bool) or b <= 0 or b % 32:
        raise ValueError(
            f"weight_only_int4: block_size={b!r} must be a positive multiple of 32 "
            f"(XNNPACK's blockwise int4 kernels need it), e.g. 32, 64 or 128"
        )
    for spec in specs:
        for name, module in spec.module.named_modules():
            if isinstance(module, torch.nn.Linear) and module.in_features % b:
                probe = ir.Op("FULLY_CONNECTED", [], [], module=name)
                if keeps_float(probe, config.keep_float):
                    continue
                raise ValueError(
                    f"weight_only_int4: block_size={b} does not divide the {module.in_features} input "
                    f"features of layer {name!r} ({module}); choose a block size that divides every "
                    f"Linear's in_features, or keep_float=[{name!r}]"
                )


def _sample_tuple(sample, where: str) -> tuple:
    if isinstance(sample, (torch.Tensor, np.ndarray)):
        return (sample,)
    if isinstance(sample, list):
        sample = tuple(sample)
    if not isinstance(sample, tuple):
        raise TypeError(
            f"{where} is {a_type(sample)}; each calibration sample must be a tuple of "
            f"positional inputs like sample_args (or one tensor)"
        )
    return sample


def _check_calibration(calibration_data, specs) -> dict[str, "CalibrationSamples"]:
    if isinstance(calibration_data, dict):
        missing = [s.name for s in specs if s.name not in calibration_data]
        unknown = [k for k in calibration_data if k not in {s.name for s in specs}]
        if missing or unknown:
            raise ValueError(
                f"calibration_data by signature: missing {missing}, unknown {unknown}; "
                f"give one iterable of samples per signature {[s.name for s in specs]}"
            )
        per_spec = {s.name: calibration_data[s.name] for s in specs}
    elif len(specs) == 1:
        per_spec = {specs[0].name: calibration_data}
    else:
        raise TypeError(
            f"with several signatures, calibration_data must be a dict "
            f"{{signature name: iterable of samples}} for {[s.name for s in specs]}"
        )
    if isinstance(calibration_data, (torch.Tensor, np.ndarray)):
        raise TypeError(
            "calibration_data is one tensor; pass an iterable of samples, e.g. [(x,) for x in batch.split(1)]"
        )
    out = {}
    for spec in specs:
        if spec.sample_kwargs:
            raise ValueError(
                f"signature '{spec.name}' has keyword inputs; calibration passes inputs "
                f"positionally: convert with every input in sample_args"
            )
        out[spec.name] = CalibrationSamples(per_spec[spec.name], spec, len(specs) > 1)
    return out


class CalibrationSamples:
    """One signature's calibration samples, checked before any conversion work and then
    streamed (each converted to numpy as it is used, none kept).

    A sequence (list, tuple, Dataset-like) is checked whole up front and can be read
    several times; a one-shot iterator (a generator) has its first sample checked up
    front and the others as they stream (an error names the sample)."""

    def __init__(self, source, spec, several: bool):
        self.spec, self.several = spec, several
        if isinstance(source, (str, bytes)) or not hasattr(source, "__iter__"):
            raise TypeError(f"calibration_data must be an iterable of samples, got {type(source).__name__}")
        if isinstance(source, Sequence) or (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            self.source, self.one_shot = source, False
            for k in range(len(source)):
                self._checked(source[k], k)
            count = len(source)
        else:
            iterator = iter(source)
            first = next(iterator, None)
            if first is not None:
                self._checked(first, 0)
            self.source, self.one_shot = (itertools.chain([first], iterator) if first is not None else ()), True
            count = int(first is not None)
        if not count:
            raise ValueError(
                f"calibration_data for '{spec.name}' is empty; give at least one sample "
                f"(a few dozen representative inputs work well)"
            )
        self._used = False

    def __len__(self) -> int:
        if self.one_shot:
            raise TypeError("a one-shot iterator of samples has no known length")
        return len(self.source)

    def __iter__(self):
        if self.one_shot and self._used:
            raise RuntimeError(
                "the calibration samples came from a one-shot iterator (a generator) that "
                "is used up; pass a list (or another sequence) to calibrate more than once"
            )
        self._used = True
        for k, sample in enumerate(self.source):
            yield self._checked(sample, k)

    def _checked(self, sample, k: int) -> tuple:
        where = f"calibration sample {k}" + (f" of signature '{self.spec.name}'" if self.several else "")
        sample = _sample_tuple(sample, where)
        args = self.spec.sample_args
        if len(sample) != len(args):
            raise ValueError(f"{where} has {len(sample)} input(s); the model takes {len(args)} like sample_args")
        return tuple(
            _check_input(x, ref, f"{where}, input {i}", self.spec.dynamic_shapes is not None)
            for i, (x, ref) in enumerate(zip(sample, args))
        )


def _check_input(x, ref, where: str, dynamic: bool) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        dtype = x.dtype
        array = (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    elif isinstance(x, np.ndarray):
        array, dtype = x, None
    else:
        raise TypeError(f"{where} is {a_type(x)}; expected a tensor")
    if isinstance(ref, torch.Tensor):
        want = tuple(ref.shape)
        ref_np = torch.empty(0, dtype=ref.dtype).numpy().dtype if ref.dtype != torch.bfloat16 else np.float32
        if (dtype is not None and dtype != ref.dtype) or (dtype is None and array.dtype != ref_np):
            raise TypeError(f"{where} has dtype {dtype or array.dtype}; sample_args has {ref.dtype}")
        if len(array.shape) != len(want) or (not dynamic and tuple(array.shape) != want):
            raise ValueError(
                f"{where} has shape {tuple(array.shape)}; sample_args has {want}"
                + ("" if dynamic else " (declare dynamic_shapes= to calibrate other sizes)")
            )
    return np.ascontiguousarray(array)


def quantize(
    model: ir.Model, config: QuantConfig, calibration_data=None, *, runner=None, progress=None
) -> QuantReport | None:
    """Apply `config` to the converted float `model` (in place). Full-integer schemes
    return a QuantReport listing every op left in float (and warn about those the user did
    not ask for); weight-only schemes return None.

    runner: for calibrated schemes, model bytes -> an interpreter that keeps every tensor
    (`litert_torch.quantize.calibration_runner`; see `calibrate.py`).
    progress: a converter.progress.Progress showing the calibration samples done."""
    from converter.quantize import full_integer, qdq, weights

    config = _as_config(config)
    if isinstance(config, AutoConfig):
        from converter.quantize.mixed import quantize_for_budget

        return quantize_for_budget(model, config, runner, progress)
    if config.scheme in ("dynamic_int8", "weight_only_int8", "weight_only_int4", "float16"):
        for graph in model.graphs:
            weights.quantize_weights(graph, config.scheme, config.keep_float, config.block_size)
        return None
    fixed = {g.name: qdq.absorb_qdq(g) for g in model.graphs}  # a torch.ao model's own parameters
    activations = "int16" if config.scheme == "int16x8" else "int8"
    ranges = {g.name: {} for g in model.graphs}
    if config.scheme in CALIBRATED:
        ranges = calibrated_ranges(model, config, runner, progress)
    report = QuantReport(str(config))
    if config.scheme in CALIBRATED:
        from converter.quantize.calibrate import OUTPUT_RANGES

        report.output_ranges = OUTPUT_RANGES
    for graph in model.graphs:
        count, float_ops = full_integer.quantize_graph(
            graph,
            ranges[graph.name],
            activations=activations,
            io=config.io,
            keep_float=config.keep_float,
            fixed=fixed[graph.name],
        )
        report.quantized_ops += count
        report.float_ops += float_ops
    report.warn(stacklevel=5)  # the user's call of litert_torch.convert
    return report
