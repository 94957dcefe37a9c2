"""Quantization schemes for `litert_torch.convert(..., quant_config=...)`.

    from litert_torch import quantize
    edge = litert_torch.convert(model, args, quant_config=quantize.dynamic_int8())
    edge = litert_torch.convert(model, args, quant_config=quantize.full_int8(io="int8"),
                                calibration_data=[(x,) for x in samples])

Every scheme takes `keep_float=`: layer names (as `model.named_modules()` spells them,
covering their children) and TFLite op types ("SOFTMAX", "CONV_2D") to keep in float32.
Quantized models are called with float inputs unless integer I/O was asked for.
"""

from __future__ import annotations

from typing import Iterable

from converter.quantize.config import CALIBRATED, CALIBRATIONS, SCHEMES, AutoConfig, QuantConfig
from runtimes.litert import CalibrationRunner

__all__ = [
    "QuantConfig",
    "AutoConfig",
    "SCHEMES",
    "CALIBRATIONS",
    "auto",
    "analyze",
    "dynamic_int8",
    "weight_only_int8",
    "weight_only_int4",
    "float16",
    "full_int8",
    "int16x8",
    "pt2e",
]


def _names(keep_float: Iterable[str] | str | None) -> tuple[str, ...]:
    if keep_float is None:
        return ()
    if isinstance(keep_float, str):
        return (keep_float,)
    return tuple(keep_float)


def dynamic_int8(*, keep_float=None) -> QuantConfig:
    """int8 per-channel weights, float activations quantized on the fly by LiteRT's hybrid
    kernels (FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D). About 4x smaller; no calibration."""
    return QuantConfig("dynamic_int8", _names(keep_float))


def weight_only_int8(*, keep_float=None) -> QuantConfig:
    """int8 per-channel weights dequantized to float when the model loads; float compute.
    About 4x smaller, float accuracy of activations."""
    return QuantConfig("weight_only_int8", _names(keep_float))


def weight_only_int4(block_size: int = 32, *, keep_float=None) -> QuantConfig:
    """int4 weights in blocks of `block_size` inputs (a multiple of 32, dividing every
    Linear's in_features) with float16 scales, in FULLY_CONNECTED; int4 per output channel
    in 1x1 convolutions and per row in embedding tables; other weights int8."""
    return QuantConfig("weight_only_int4", _names(keep_float), block_size=block_size)


def float16(*, keep_float=None) -> QuantConfig:
    """float16 weights dequantized to float32 when the model loads: 2x smaller."""
    return QuantConfig("float16", _names(keep_float))


def full_int8(
    io: str = "float",
    *,
    keep_float=None,
    calibration: str = "minmax",
    percentile: float = 99.99,
    averaging_constant: float = 0.1,
) -> QuantConfig:
    """Full-integer int8: calibrated per-tensor activations, per-channel weights, int32
    biases. Needs `calibration_data=`. `io`: "float" (the model quantizes its inputs and
    dequantizes its outputs), "int8" or "uint8" (microcontrollers, Edge TPU).

    calibration: how each activation's range is estimated from the samples:
        "minmax" (every value representable; outliers widen the range), "percentile"
        (clip the (100 - `percentile`)% most extreme values at each end), "mse" (the
        range minimising the squared quantization error), "moving_average" (moving
        average of each sample's min/max, weight `averaging_constant`).
    Ops that stay float are listed in `edge.quant_report` (and warned about)."""
    return QuantConfig(
        "full_int8",
        _names(keep_float),
        io=io,
        calibration=calibration,
        percentile=percentile,
        averaging_constant=averaging_constant,
    ).check()


def int16x8(
    io: str = "float",
    *,
    keep_float=None,
    calibration: str = "minmax",
    percentile: float = 99.99,
    averaging_constant: float = 0.1,
) -> QuantConfig:
    """int16 activations, int8 weights, int64 biases: more accurate than int8 where the
    ranges are wide. Needs `calibration_data=`; `io` is "float" or "int16"; `calibration`
    as for `full_int8`. (LiteRT runs it with its builtin kernels; XNNPACK has no int16x8.)"""
    return QuantConfig(
        "int16x8",
        _names(keep_float),
        io=io,
        calibration=calibration,
        percentile=percentile,
        averaging_constant=averaging_constant,
    ).check()


def pt2e(io: str = "float", *, keep_float=None) -> QuantConfig:
    """A torch.ao PT2E/QAT model (`convert_pt2e` output): its quantize/dequantize pairs
    decide every parameter; nothing is re-quantized or calibrated. This is also what
    `convert` does by itself when it finds such pairs and no quant_config is given."""
    return QuantConfig("pt2e", _names(keep_float), io=io)


def auto(
    scheme: QuantConfig, *, max_error: float | None = None, min_agreement: float | None = None, eval_data=None
) -> AutoConfig:
    """Mixed precision for an accuracy budget: quantize with `scheme` (full_int8(...) or
    int16x8(...)) but keep in float the fewest layers, most sensitive first, for which
    the model meets `max_error` (relative RMS error of the outputs against the float
    model) or `min_agreement` (top-1 agreement, classifiers) on `eval_data` (a list of
    sample-args tuples). Pass it as `quant_config=` with `calibration_data=`; the choice
    is in `edge.quant_report.auto["keep_float"]`, to pin with `keep_float=` next time (it
    keeps exactly the ops auto measured: "=name" is a layer's own ops without its
    children's, "(model)" the top-level forward's)."""
    return AutoConfig(scheme, max_error, min_agreement, eval_data).check()


def analyze(
    model, sample_args, quant_config: QuantConfig, calibration_data, eval_data=None, *, progress: bool | None = None
):
    """Quantization sensitivity per layer (the model's `named_modules()` names): the
    output error that quantizing each layer alone adds, and each layer's activation error
    in the fully quantized model, measured in LiteRT on `eval_data` (default: the
    calibration samples; then pass those as a list). Returns a
    `converter.quantize.sensitivity.SensitivityReport`: `.print()` (a table),
    `.to_json(path)`, `.plot(path)` (PNG), `.ranking()`."""
    from converter.progress import Progress
    from converter.quantize import CalibrationSamples, calibrated_ranges, sensitivity, validate_config
    from litert_torch.api import SignatureSpec, _sample_args, convert

    spec = SignatureSpec("serving_default", model, _sample_args(sample_args))
    if not isinstance(quant_config, QuantConfig) or quant_config.scheme not in CALIBRATED:
        raise ValueError(
            f"analyze: quant_config must be quantize.full_int8(...) or quantize.int16x8(...), got {quant_config!r}"
        )
    config = validate_config(quant_config, calibration_data, [spec])
    if eval_data is None and config.samples[spec.name].one_shot:
        raise TypeError(
            "analyze: calibration_data is a one-shot iterator; pass eval_data= (a list of samples) "
            "or calibration_data as a list, which is then also the evaluation set"
        )
    evals = config.samples[spec.name] if eval_data is None else CalibrationSamples(eval_data, spec, False)
    stages = Progress(progress)
    float_model = convert(model, spec.sample_args, progress=progress).ir_model
    with stages.stage("analyze", str(config)):
        ranges = calibrated_ranges(float_model, config, calibration_runner, stages)
        return sensitivity.analyze(
            float_model,
            ranges,
            config.activation_dtype,
            str(config),
            list(evals),
            calibration_runner,
            keep_float=config.keep_float,
            progress=stages,
        )


calibration_runner = CalibrationRunner  # what convert() calibrates with (runtimes/litert.py)
