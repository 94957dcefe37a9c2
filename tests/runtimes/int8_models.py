"""Small full-int8 models built directly in our IR (no quantizer needed): what a
microcontroller or Edge TPU runs. Weights are seeded; scales are chosen so values use
the int8 range without saturating everywhere."""

from __future__ import annotations

import numpy as np

from converter import ir


def _q(scale: float, zero_point: int = 0) -> ir.QuantParams:
    return ir.QuantParams(np.asarray([scale], np.float32), np.asarray([zero_point], np.int64))


def int8_mlp(seed: int = 0, float_io: bool = False) -> ir.Model:
    """int8 [1, 16] -> FULLY_CONNECTED(+RELU) [1, 32] -> FULLY_CONNECTED [1, 8], per-tensor
    scales; with float_io a QUANTIZE in front and a DEQUANTIZE behind."""
    rng = np.random.default_rng(seed)
    x = ir.Tensor("x", (1, 16), np.int8, quant=_q(0.05, -3))
    w1 = ir.Tensor("w1", (32, 16), np.int8, data=rng.integers(-127, 128, (32, 16), dtype=np.int8), quant=_q(0.01))
    b1 = ir.Tensor("b1", (32,), np.int32, data=rng.integers(-500, 500, 32, dtype=np.int32), quant=_q(0.05 * 0.01))
    h = ir.Tensor("h", (1, 32), np.int8, quant=_q(0.08, -128))
    w2 = ir.Tensor("w2", (8, 32), np.int8, data=rng.integers(-127, 128, (8, 32), dtype=np.int8), quant=_q(0.02))
    b2 = ir.Tensor("b2", (8,), np.int32, data=rng.integers(-300, 300, 8, dtype=np.int32), quant=_q(0.08 * 0.02))
    y = ir.Tensor("y", (1, 8), np.int8, quant=_q(0.25, 5))
    fc = {"fusedActivationFunction": "NONE", "weightsFormat": "DEFAULT", "keepNumDims": False}
    ops = [
        ir.Op("FULLY_CONNECTED", [x, w1, b1], [h], {**fc, "fusedActivationFunction": "RELU"}),
        ir.Op("FULLY_CONNECTED", [h, w2, b2], [y], dict(fc)),
    ]
    inputs, outputs = [x], [y]
    if float_io:
        xf = ir.Tensor("x_float", (1, 16), np.float32)
        yf = ir.Tensor("y_float", (1, 8), np.float32)
        ops = [ir.Op("QUANTIZE", [xf], [x])] + ops + [ir.Op("DEQUANTIZE", [y], [yf])]
        inputs, outputs = [xf], [yf]
    graph = ir.Graph("serving_default", inputs, outputs, ops, ["x"], ["y"])
    return ir.Model([graph])


def int8_conv(seed: int = 1) -> ir.Model:
    """int8 NHWC [1, 8, 8, 3] -> CONV_2D 3x3 (+RELU6) [1, 8, 8, 4] -> MAX_POOL 2x2 -> RESHAPE [1, 64]."""
    rng = np.random.default_rng(seed)
    x = ir.Tensor("x", (1, 8, 8, 3), np.int8, quant=_q(0.04, 0))
    w = ir.Tensor(
        "w",
        (4, 3, 3, 3),
        np.int8,
        data=rng.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8),
        quant=ir.QuantParams(np.asarray([0.01, 0.02, 0.015, 0.01], np.float32), np.zeros(4, np.int64), 0),
    )
    b = ir.Tensor(
        "b",
        (4,),
        np.int32,
        data=rng.integers(-200, 200, 4, dtype=np.int32),
        quant=ir.QuantParams(np.asarray([0.0004, 0.0008, 0.0006, 0.0004], np.float32), np.zeros(4, np.int64), 0),
    )
    c = ir.Tensor("c", (1, 8, 8, 4), np.int8, quant=_q(6 / 255, -128))
    p = ir.Tensor("p", (1, 4, 4, 4), np.int8, quant=_q(6 / 255, -128))
    shape = ir.Tensor("shape", (2,), np.int32, data=np.asarray([1, 64], np.int32))
    y = ir.Tensor("y", (1, 64), np.int8, quant=_q(6 / 255, -128))
    ops = [
        ir.Op(
            "CONV_2D",
            [x, w, b],
            [c],
            {
                "padding": "SAME",
                "strideH": 1,
                "strideW": 1,
                "dilationHFactor": 1,
                "dilationWFactor": 1,
                "fusedActivationFunction": "RELU6",
            },
        ),
        ir.Op(
            "MAX_POOL_2D",
            [c],
            [p],
            {
                "padding": "VALID",
                "strideH": 2,
                "strideW": 2,
                "filterHeight": 2,
                "filterWidth": 2,
                "fusedActivationFunction": "NONE",
            },
        ),
        ir.Op("RESHAPE", [p, shape], [y], {"newShape": [1, 64]}),
    ]
    return ir.Model([ir.Graph("serving_default", [x], [y], ops, ["x"], ["y"])])
