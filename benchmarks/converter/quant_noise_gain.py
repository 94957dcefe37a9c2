"""How much a float model amplifies activation rounding, apart from any quantizer.

In PyTorch float (weights float, no converter): round the input, and/or every Conv2d/Linear
output, to a 256-step grid over that tensor's own min/max, and compare with the plain
float model on seeded evaluation inputs (quant_bench's seed 1). Columns as quant_bench's:
mean err = mean abs(rounded - float) / max abs(float), top-1 = argmax agreement. A model
that loses top-1 here loses it under any int8 quantizer, whatever the calibration.

    python -m benchmarks.converter.quant_noise_gain timm_rexnet_100 efficientnet_b0 --samples 100
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter import quant_bench


def round_to_grid(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to 256 steps spanning its own min/max (and 0), as int8 asymmetric would."""
    lo, hi = min(float(t.min()), 0.0), max(float(t.max()), 0.0)
    step = (hi - lo) / 255 or 1e-8
    return torch.round((t - lo) / step) * step + lo


def noise_gain(model: torch.nn.Module, inputs: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """{"input" | "layers" | "input+layers": (mean err, top-1 agreement)}."""
    state = {"layers": False}
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            module.register_forward_hook(lambda m, i, o: round_to_grid(o) if state["layers"] else None)
    result = {}
    with torch.no_grad():
        for kind in ("input", "layers", "input+layers"):
            errors, agree = [], 0
            for x in inputs:
                state["layers"] = False
                expected = model(x)
                state["layers"] = "layers" in kind
                actual = model(round_to_grid(x) if "input" in kind else x)
                errors.append(float((actual - expected).abs().mean() / expected.abs().max()))
                agree += int(torch.equal(actual.argmax(-1), expected.argmax(-1)))
            result[kind] = (float(np.mean(errors)), agree / len(inputs))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--samples", type=int, default=100)
    options = parser.parse_args()
    zoo = load_zoo()
    for name in options.models:
        model, _ = quant_bench.build(zoo, name)
        inputs = [s[0] for s in quant_bench.make_samples(zoo, name, options.samples, seed=1)]
        row = noise_gain(model.eval(), inputs)
        print(name, "  ".join(f"{k}: mean err {e:.4f} top-1 {a:.1%}" for k, (e, a) in row.items()), flush=True)


if __name__ == "__main__":
    main()
