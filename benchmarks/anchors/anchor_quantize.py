"""Quantize zoo models (and the bench's transformer classifiers) with the anchor (PyPI `litert-torch` 0.10.0 + `ai-edge-quantizer`) in ITS environment.

Run by `quant_bench.py --anchor-python ...`, never imported by it (the anchor's import name
`litert_torch` is ours too). For each model: the anchor converts the float model, then
ai-edge-quantizer applies the recipe matching each of our schemes:

| our scheme | ai-edge-quantizer recipe |
| --- | --- |
| dynamic_int8 | `dynamic_wi8_afp32` (int8 channelwise weights, hybrid kernels) |
| weight_only_int8 | `weight_only_wi8_afp32` (int8 channelwise + DEQUANTIZE) |
| weight_only_int4 | dynamic int4, BLOCKWISE_32 (its weight-only int4 blockwise leaves models unchanged) |
| float16 | `float_casting` to 16 bits, explicit DEQUANTIZE |
| full_int8 | `static_wi8_ai8`, calibrated on the same samples |
| int16x8 | `static_wi8_ai16`, calibrated on the same samples |

    /tmp/anchor-venv/bin/python benchmarks/anchors/anchor_quantize.py --out-dir DIR --schemes dynamic_int8,full_int8 resnet18

Prints one JSON line per (model, scheme): {"model", "scheme", "ok", "tflite"} or {"ok": false, "error"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import torch

if __package__:  # imported by quant_bench for calibration_inputs
    from .zoo_loader import load_zoo
else:  # run by the anchor's python, as a script: nothing of this repository but the zoo
    from zoo_loader import load_zoo


def _recipe(scheme: str):
    from ai_edge_quantizer import qtyping, recipe, recipe_manager

    if scheme == "dynamic_int8":
        return recipe.dynamic_wi8_afp32()
    if scheme == "weight_only_int8":
        return recipe.weight_only_wi8_afp32()
    if scheme == "weight_only_int4":
        manager = recipe_manager.RecipeManager()
        manager.add_dynamic_config(
            regex=".*",
            operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            num_bits=4,
            granularity=qtyping.QuantGranularity.BLOCKWISE_32,
        )
        return manager.get_quantization_recipe()
    if scheme == "float16":
        return [
            {
                "regex": ".*",
                "operation": "*",
                "algorithm_key": "float_casting",
                "op_config": {
                    "weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
                    "compute_precision": "FLOAT",
                    "explicit_dequantize": True,
                },
            }
        ]
    if scheme == "full_int8":
        return recipe.static_wi8_ai8()
    if scheme == "int16x8":
        return recipe.static_wi8_ai16()
    raise ValueError(f"unknown scheme {scheme}")


def calibration_inputs(zoo, name: str, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples quant_bench.py uses too: seeded inputs shaped like the model's."""
    entry = zoo.ZOO[name]
    out = []
    for i in range(count):
        generator = torch.Generator().manual_seed(10_000 + seed + i)
        if entry.make_inputs is not None:
            out.append(tuple(entry.make_inputs(generator)))
        else:
            out.append(tuple(torch.randn(shape, generator=generator) for shape in entry.inputs))
    return out


def build(zoo, name: str, seed: int):
    """(model, sample args, calibration inputs) for a zoo model or one of the bench's
    transformer classifiers (`benchmarks/zoo/classifiers.py`), with quant_bench.py's samples."""
    import importlib

    classifiers = importlib.import_module(zoo.__name__ + ".classifiers")
    if name not in classifiers.CLASSIFIERS:
        model, args = zoo.build(name, seed=seed)
        return model, args, lambda count: calibration_inputs(zoo, name, count, seed)
    factory, make_inputs = classifiers.CLASSIFIERS[name]
    args = make_inputs(torch.Generator().manual_seed(0))
    return factory(), args, lambda count: classifiers.samples(name, count, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--schemes", required=True)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    options.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with contextlib.redirect_stdout(sys.stderr):
        from ai_edge_quantizer import quantizer

        import litert_torch
    zoo = load_zoo()
    for name in options.models:
        model, args, calibration_samples = build(zoo, name, options.seed)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                float_model = litert_torch.convert(model, args).model_content()
        except Exception as error:  # noqa: BLE001
            for scheme in options.schemes.split(","):
                print(
                    json.dumps(
                        {
                            "model": name,
                            "scheme": scheme,
                            "ok": False,
                            "error": f"float conversion: {type(error).__name__}: {error}"[:400],
                        }
                    ),
                    flush=True,
                )
            continue
        for scheme in options.schemes.split(","):
            path = options.out_dir / f"{name}.{scheme}.anchor.tflite"
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    q = quantizer.Quantizer(float_model)
                    q.load_quantization_recipe(_recipe(scheme))
                    calibration = None
                    if scheme in ("full_int8", "int16x8"):
                        from ai_edge_litert.interpreter import Interpreter

                        runner = Interpreter(model_content=float_model).get_signature_runner()
                        details = runner.get_input_details()
                        names = sorted(details)  # args_0, args_1 ...; token ids are int32 in the anchor's files
                        samples = [
                            {n: t.numpy().astype(details[n]["dtype"]) for n, t in zip(names, sample)}
                            for sample in calibration_samples(options.calibration)
                        ]
                        calibration = q.calibrate({"serving_default": samples})
                    content = q.quantize(calibration).quantized_model
                path.write_bytes(content)
                print(json.dumps({"model": name, "scheme": scheme, "ok": True, "tflite": str(path)}), flush=True)
            except Exception as error:  # noqa: BLE001
                print(
                    json.dumps(
                        {
                            "model": name,
                            "scheme": scheme,
                            "ok": False,
                            "error": f"{type(error).__name__}: {error}".splitlines()[0][:400],
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
