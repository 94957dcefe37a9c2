"""QuantConfig: which quantization scheme to apply, and its options.

Users build these through `litert_torch.quantize` (`dynamic_int8()`, `full_int8(io="int8")`
...); the converter reads them. A config is immutable; `validate_config` returns a copy
holding the calibration samples it checked (so a generator is consumed once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMES = {
    "dynamic_int8": "int8 per-channel weights, float activations (hybrid kernels)",
    "weight_only_int8": "int8 per-channel weights dequantized to float at load (DEQUANTIZE)",
    "weight_only_int4": "int4 blockwise weights (fp16 scales) in FULLY_CONNECTED, int4 per channel in 1x1 CONV_2D "
    "and embeddings (GATHER), int8 per-channel elsewhere",
    "float16": "float16 weights dequantized to float32 at load (DEQUANTIZE)",
    "full_int8": "int8 activations (calibrated, per-tensor) and int8 per-channel weights, int32 biases",
    "int16x8": "int16 activations (symmetric, calibrated) and int8 per-channel weights, int64 biases",
    "pt2e": "the quantize/dequantize pairs of a torch.ao PT2E/QAT model, honoured as they are",
}
CALIBRATED = ("full_int8", "int16x8")
CALIBRATIONS = ("minmax", "moving_average", "percentile", "mse")  # converter/quantize/calibrate.py
IO_TYPES = ("float", "int8", "uint8", "int16")


@dataclass(frozen=True)
class QuantConfig:
    """A quantization scheme.

    scheme: one of SCHEMES.
    keep_float: layer names (nn.Module paths as in `named_modules()`, e.g. "layer4.1.conv2",
        which also cover their children) and TFLite op types ("SOFTMAX", "CONV_2D") to keep
        in float32.
    block_size: int4 block size along the input dimension (weight_only_int4).
    io: model input/output type for the calibrated schemes: "float" (QUANTIZE/DEQUANTIZE
        inside the model), "int8", "uint8" (full_int8) or "int16" (int16x8).
    calibration: the range estimator of the calibrated schemes (CALIBRATIONS, see
        `converter/quantize/calibrate.py`); `percentile` is the "percentile" method's
        percentile, `averaging_constant` the "moving_average" weight of a new sample.
    samples: filled by `validate_config`: the calibration samples, per signature name.
    """

    scheme: str
    keep_float: tuple[str, ...] = ()
    block_size: int = 32
    io: str = "float"
    calibration: str = "minmax"
    percentile: float = 99.99
    averaging_constant: float = 0.1
    samples: dict = field(default=None, compare=False, repr=False)

    def check(self) -> "QuantConfig":
        """Raise ValueError naming the argument of a bad calibration option; returns self."""
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration={self.calibration!r}: choose one of {', '.join(map(repr, CALIBRATIONS))}")
        if (
            isinstance(self.percentile, bool)
            or not isinstance(self.percentile, (int, float))
            or not 50 < self.percentile <= 100
        ):
            raise ValueError(
                f"percentile={self.percentile!r}: a number in (50, 100], e.g. 99.99 "
                f"(the share of values kept inside the range on each side)"
            )
        if (
            isinstance(self.averaging_constant, bool)
            or not isinstance(self.averaging_constant, (int, float))
            or not 0 < self.averaging_constant <= 1
        ):
            raise ValueError(
                f"averaging_constant={self.averaging_constant!r}: a number in (0, 1], "
                f"the weight of each new sample in the moving average (e.g. 0.1)"
            )
        return self

    def __str__(self) -> str:
        extra = {"weight_only_int4": f", block_size={self.block_size}"}.get(self.scheme, "")
        if self.scheme in CALIBRATED:
            extra += f", io={self.io}, calibration={self.calibration}"
            extra += {"percentile": f"({self.percentile:g})", "moving_average": f"({self.averaging_constant:g})"}.get(
                self.calibration, ""
            )
        if self.keep_float:
            extra += f", keep_float={list(self.keep_float)}"
        return f"{self.scheme}{extra}"

    @property
    def activation_dtype(self) -> str | None:
        return {"full_int8": "int8", "int16x8": "int16", "pt2e": "int8"}.get(self.scheme)


@dataclass(frozen=True)
class AutoConfig:
    """Mixed precision for an accuracy budget: `base` (full_int8 or int16x8) with the
    fewest layers kept float that meet `max_error` (relative RMS error of the outputs)
    or `min_agreement` (top-1 agreement with the float model) on `eval_data`, chosen in
    the sensitivity order (`converter/quantize/sensitivity.py`)."""

    base: QuantConfig
    max_error: float | None = None
    min_agreement: float | None = None
    eval_data: object = field(default=None, compare=False, repr=False)
    eval_samples: dict = field(default=None, compare=False, repr=False)  # filled by validate_config

    @property
    def scheme(self) -> str:
        return self.base.scheme

    @property
    def keep_float(self) -> tuple[str, ...]:
        return self.base.keep_float

    @property
    def io(self) -> str:
        return self.base.io

    def check(self) -> "AutoConfig":
        if not isinstance(self.base, QuantConfig) or self.base.scheme not in CALIBRATED:
            raise ValueError(
                f"auto: scheme must be quantize.full_int8(...) or quantize.int16x8(...), got {self.base!r}"
            )
        self.base.check()
        if (self.max_error is None) == (self.min_agreement is None):
            raise ValueError(
                "auto: give exactly one budget, max_error= (relative RMS error of the outputs, e.g. "
                "0.02) or min_agreement= (top-1 agreement with the float model, e.g. 0.99)"
            )
        if self.max_error is not None and not (isinstance(self.max_error, (int, float)) and self.max_error > 0):
            raise ValueError(f"auto: max_error={self.max_error!r} must be a positive number, e.g. 0.02")
        if self.min_agreement is not None and not (
            isinstance(self.min_agreement, (int, float)) and 0 < self.min_agreement <= 1
        ):
            raise ValueError(f"auto: min_agreement={self.min_agreement!r} must be in (0, 1], e.g. 0.99")
        if self.eval_data is None:
            raise ValueError(
                "auto: eval_data= is required: a list of sample-args tuples (representative inputs, "
                "different from the calibration samples) on which the budget is measured"
            )
        return self

    def meets(self, error: float, agreement: float | None) -> bool:
        if self.max_error is not None:
            return error <= self.max_error
        if agreement is None:
            raise ValueError(
                "auto: min_agreement= needs a classifier (first output shaped (batch, classes)); "
                "use max_error= for this model"
            )
        return agreement >= self.min_agreement

    def __str__(self) -> str:
        budget = f"max_error={self.max_error}" if self.max_error is not None else f"min_agreement={self.min_agreement}"
        return f"auto({self.base}, {budget})"
