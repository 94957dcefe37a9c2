"""What a full-integer quantization left in float, and why (`edge.quant_report`).

Under full_int8 / int16x8 / pt2e every op that still computes in float32 is listed with
the TFLite op, the user's layer (the nn.Module path from `named_modules()`) and the
reason. Ops kept float on the user's request (`keep_float=`) are listed too, marked as
requested; any other float op is also announced by a warning, so partial quantization is
never silent.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field

from converter.quantize.select import ROOT


@dataclass(frozen=True)
class FloatOp:
    """One op left in float32."""

    op: str  # TFLite builtin, e.g. "CONV_2D"
    layer: str | None  # nn.Module path ("Mixed_6e.branch1x1.conv"), None when unknown
    reason: str
    requested: bool = False  # kept float by keep_float=
    graph: str = "serving_default"

    def __str__(self) -> str:
        return f"{self.op} in {self.layer or ROOT}: {self.reason}"


@dataclass
class QuantReport:
    """Per scheme: how many ops compute in integers, and every op that stays float."""

    scheme: str
    quantized_ops: int = 0
    float_ops: list[FloatOp] = field(default_factory=list)
    # quantize.auto: chosen keep_float, float_layers, layers, error, agreement, met, sensitivity
    auto: dict | None = None
    # calibrated schemes: how the model outputs' ranges were set (calibrate.OUTPUT_RANGES)
    output_ranges: str | None = None

    @property
    def unrequested(self) -> list[FloatOp]:
        """Float ops the user did not ask for."""
        return [f for f in self.float_ops if not f.requested]

    @property
    def fully_quantized(self) -> bool:
        return not self.unrequested

    def to_dict(self) -> dict:
        out = {
            "scheme": self.scheme,
            "quantized_ops": self.quantized_ops,
            "float_ops": [asdict(f) for f in self.float_ops],
        }
        if self.output_ranges is not None:
            out["output_ranges"] = self.output_ranges
        if self.auto is not None:
            out["auto"] = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in self.auto.items()}
        return out

    def __str__(self) -> str:
        head = (
            f"{self.scheme}: {self.quantized_ops} ops quantized, {len(self.float_ops)} float "
            f"({len(self.unrequested)} not requested)"
        )
        lines = [head]
        if self.output_ranges is not None:
            lines.append(f"  model outputs' ranges: {self.output_ranges}")
        if self.auto is not None:
            a = self.auto
            agree = "" if a["agreement"] is None else f", top-1 agreement {a['agreement']:.1%}"
            lines.append(
                f"  auto: {a['float_layers']} of {a['layers']} layers kept float "
                f"(error {a['error']:.4g}{agree}; fully quantized {a['fully_quantized_error']:.4g}): "
                f"keep_float={a['keep_float']}"
            )
        kept: dict[tuple[str, str], list[str]] = {}  # requested ones, one line per layer
        for f in self.float_ops:
            if f.requested:
                kept.setdefault((f.layer or ROOT, f.reason), []).append(f.op)
        lines += [
            f"  [keep_float] {layer}: {len(ops)} op(s) ({', '.join(sorted(set(ops)))}) {reason}"
            for (layer, reason), ops in kept.items()
        ]
        lines += [f"  {f}" for f in self.unrequested]
        return "\n".join(lines)

    def warn(self, stacklevel: int = 2) -> None:
        """One warning listing every float op the user did not ask for (none: silent)."""
        missed = self.unrequested
        if not missed:
            return
        shown = "; ".join(map(str, missed[:8])) + (f"; ... {len(missed) - 8} more" if len(missed) > 8 else "")
        warnings.warn(
            f"{self.scheme}: {len(missed)} op(s) stay float32 ({shown}). See edge.quant_report; "
            f"pass keep_float= to silence this for layers you want in float.",
            QuantizationWarning,
            stacklevel=stacklevel,
        )


class QuantizationWarning(UserWarning):
    """Part of a model was left in float under a full-integer scheme."""
