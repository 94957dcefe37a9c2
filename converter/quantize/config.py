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
    "weight_only_int4": "int4 blockwise weights (fp16 scales) in FULLY_CONNECTED, int8 per-channel elsewhere",
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
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)) \
                or not 50 < self.percentile <= 100:
            raise ValueError(f"percentile={self.percentile!r}: a number in (50, 100], e.g. 99.99 "
                             f"(the share of values kept inside the range on each side)")
        if isinstance(self.averaging_constant, bool) or not isinstance(self.averaging_constant, (int, float)) \
                or not 0 < self.averaging_constant <= 1:
            raise ValueError(f"averaging_constant={self.averaging_constant!r}: a number in (0, 1], "
                             f"the weight of each new sample in the moving average (e.g. 0.1)")
        return self

    def __str__(self) -> str:
        extra = {"weight_only_int4": f", block_size={self.block_size}"}.get(self.scheme, "")
        if self.scheme in CALIBRATED:
            extra += f", io={self.io}, calibration={self.calibration}"
            extra += {"percentile": f"({self.percentile:g})",
                      "moving_average": f"({self.averaging_constant:g})"}.get(self.calibration, "")
        if self.keep_float:
            extra += f", keep_float={list(self.keep_float)}"
        return f"{self.scheme}{extra}"

    @property
    def activation_dtype(self) -> str | None:
        return {"full_int8": "int8", "int16x8": "int16", "pt2e": "int8"}.get(self.scheme)
