"""The `litert-torch` command line: one entry point (`main`), one exit-code convention.

    litert-torch convert my_pkg.models:build --args 1,3,224,224 -o model.tflite
    litert-torch convert my_pkg.models:build --args 1,3,224,224 -o int8.tflite \
        --quantize full_int8 --calibration-data calib.npz --target micro
    litert-torch inspect model.tflite
    litert-torch check model.tflite --target android-gpu     (litert_torch/runtime_commands.py)
    litert-torch bench model.tflite --json out.json          (litert_torch/runtime_commands.py)
    litert-torch quantize-report my_pkg.models:build --args 1,3,224,224 --json r.json --png r.png

`convert` imports `module:factory`; the factory returns an nn.Module, or a
(module, sample_args) pair; without sample args from the factory, `--args` gives one
input shape per flag (random normal tensors of `--dtype`). `--quantize` and `--target`
build the API's `quant_config` / `target` (`_quant_config`, `load_calibration_data`), so
bad settings are the API's own errors.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import sys
import time

from litert_torch.cli_report import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    model_file_error,
    output_path_error,
    print_violations,
)
from litert_torch.runtime_commands import add_commands


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--args expects comma-separated integers like 1,3,224,224, got {text!r}"
        ) from None
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"--args needs positive dimensions, got {text!r}")
    return shape


def _load_factory(spec: str):
    if ":" not in spec:
        raise SystemExit(f"error: expected MODULE:FACTORY (e.g. my_pkg.models:build), got {spec!r}")
    module_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the user resolve
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(f"error: cannot import {module_name!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"error: {module_name!r} has no attribute {attr!r}") from None


def _model_and_args(factory, shapes, dtype_name: str):
    import torch

    made = factory if isinstance(factory, torch.nn.Module) else factory()
    sample_args = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made, sample_args = made
    if not isinstance(made, torch.nn.Module):
        raise SystemExit(
            f"error: the factory returned {type(made).__name__}; it must return an nn.Module or (module, sample_args)"
        )
    if shapes:
        dtype = getattr(torch, dtype_name)
        make = (
            (lambda s: torch.randn(s, dtype=dtype))
            if dtype.is_floating_point
            else (lambda s: torch.randint(0, 10, s, dtype=dtype))
        )
        sample_args = tuple(make(s) for s in shapes)
    if sample_args is None:
        raise SystemExit(
            "error: no sample inputs: pass --args SHAPE (once per input) or "
            "return (module, sample_args) from the factory"
        )
    if not isinstance(sample_args, tuple):
        sample_args = (sample_args,)
    return made, sample_args


# `--quantize` schemes: the `litert_torch.quantize` functions the API takes as quant_config.
QUANT_SCHEMES = ("dynamic_int8", "weight_only_int8", "weight_only_int4", "float16", "full_int8", "int16x8")
CALIBRATED_SCHEMES = ("full_int8", "int16x8")


def _quant_config(ns):
    """The API's quant_config for the `convert` flags (its own ValueErrors on bad settings)."""
    from litert_torch import quantize

    if ns.quantize is None:
        for flag, value in (("--calibration-data", ns.calibration_data), ("--keep-float", ns.keep_float)):
            if value:
                raise ValueError(f"{flag} needs --quantize SCHEME ({', '.join(QUANT_SCHEMES)})")
        return None
    keep_float = ns.keep_float or None
    if ns.quantize in CALIBRATED_SCHEMES:
        return getattr(quantize, ns.quantize)(
            ns.io, keep_float=keep_float, calibration=ns.calibration, percentile=ns.percentile
        )
    if ns.io != "float":
        raise ValueError(f"--io {ns.io} is for the calibrated schemes ({', '.join(CALIBRATED_SCHEMES)})")
    if ns.quantize == "weight_only_int4":
        return quantize.weight_only_int4(ns.block_size, keep_float=keep_float)
    return getattr(quantize, ns.quantize)(keep_float=keep_float)


def load_calibration_data(paths, sample_args) -> list[tuple]:
    """Calibration samples (tuples like `sample_args`) from .npy / .npz files.

    A .npy file holds the one input of a single-input model; a .npz file one array per
    input, in `sample_args` order (`np.savez(f, a, b)`: arr_0, arr_1, ... or any names, in
    the order saved). An array with one more dim than its sample input is a stack of
    samples (`[N, *sample.shape]`); one with the same rank is cut along dim 0 into samples
    of the sample's batch size. Samples of all files are used, in order."""
    import numpy as np
    import torch

    samples = []
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"--calibration-data: no such file: {path}")
        try:
            loaded = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001  (numpy raises ValueError/OSError/zipfile errors)
            raise ValueError(f"--calibration-data: {path} is not a .npy or .npz file numpy can read: {e}") from None
        arrays = [loaded[key] for key in loaded.files] if isinstance(loaded, np.lib.npyio.NpzFile) else [loaded]
        if len(arrays) != len(sample_args):
            raise ValueError(
                f"--calibration-data: {path} holds {len(arrays)} array(s); the model takes {len(sample_args)} input(s)"
                " (a .npz file with one array per input, in order)"
            )
        per_input = [_split_samples(a, x, path, i) for i, (a, x) in enumerate(zip(arrays, sample_args))]
        counts = {len(s) for s in per_input}
        if len(counts) != 1:
            raise ValueError(f"--calibration-data: {path}: the inputs have different sample counts {sorted(counts)}")
        samples += [tuple(torch.from_numpy(np.ascontiguousarray(s[k])) for s in per_input) for k in range(counts.pop())]
    return samples


def _split_samples(array, sample, path, index):
    shape = tuple(sample.shape)
    if array.ndim == len(shape) + 1:
        return list(array)
    if array.ndim == len(shape) and shape and shape[0] and array.shape[0] % shape[0] == 0:
        return [array[i : i + shape[0]] for i in range(0, array.shape[0], shape[0])]
    raise ValueError(
        f"--calibration-data: {path}, input {index}: an array of shape {tuple(array.shape)} is not samples of an"
        f" input shaped {shape}: give [N, *{list(shape)}], or [N * {shape[0] if shape else 1}, ...] cut along dim 0"
    )


def cmd_convert(ns) -> int:
    from rich.console import Console

    import litert_torch
    from runtimes.targets import TargetError

    console = Console(stderr=True, width=max(150, Console(stderr=True).width))  # room for a violations table
    if (problem := output_path_error(ns.output)) is not None:
        console.print(f"error: {problem}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_USAGE
    model, sample_args = _model_and_args(_load_factory(ns.factory), ns.args, ns.dtype)
    start = time.perf_counter()
    try:
        quant_config = _quant_config(ns)
        calibration = load_calibration_data(ns.calibration_data, sample_args) if ns.calibration_data else None
        edge = litert_torch.convert(
            model,
            sample_args,
            strict_export=ns.strict_export,
            quant_config=quant_config,
            calibration_data=calibration,
            target=ns.target,
            target_check=ns.target_check,
            progress=False if ns.quiet else None,
        )
    except litert_torch.ConversionError as e:
        console.print("[red]conversion failed[/red]")
        console.print(str(e), markup=False, highlight=False, soft_wrap=True)  # messages hold [shapes]
        return EXIT_FAILED
    except TargetError as e:
        console.print(f"[red]{e.report.summary()}[/red]", highlight=False)
        print_violations(console, e.report.violations)
        console.print("--target-check warn keeps the model anyway (nothing was written)")
        return EXIT_FAILED
    except (ValueError, TypeError) as e:  # the API's checks of the settings, before converting
        hint = " (from the command line: --calibration-data FILE.npy|.npz)" if "calibration_data=" in str(e) else ""
        console.print(f"error: {e}{hint}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_USAGE
    seconds = time.perf_counter() - start
    edge.export(ns.output)
    if not ns.quiet:
        console.print(f"wrote {ns.output} ({len(edge):,} bytes) in {seconds:.2f} s")
        report = getattr(edge, "target_report", None)
        if report is not None and report.violations:
            console.print(report.summary(), highlight=False)
            print_violations(console, report.violations)
    if ns.check:
        return _check(model, sample_args, edge, console)
    return EXIT_OK


def _check(model, sample_args, edge, console) -> int:
    """Run PyTorch and LiteRT on the sample inputs; print each output's max relative error,
    after what constant folding removed (a model smaller than expected says why)."""
    import torch

    from converter.passes import folding_summary
    from runtimes.litert import max_relative_error

    if (folded := folding_summary(edge.ir_model)) is not None:
        console.print(folded, highlight=False)

    model.eval()
    with torch.no_grad():
        expected, _ = torch.utils._pytree.tree_flatten(model(*sample_args))
    actual = edge(*sample_args)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for i, (a, b) in enumerate(zip(actual, expected)):
        b = b.detach().to("cpu").float().numpy()
        console.print(f"output {i} {list(b.shape)}: max relative error {max_relative_error(a, b):.3g}")
    return EXIT_OK


def cmd_quantize_report(ns) -> int:
    """Per-layer quantization sensitivity: a table, and optionally JSON and a PNG plot."""
    import torch
    from rich.console import Console

    from litert_torch import quantize

    console = Console()
    model, sample_args = _model_and_args(_load_factory(ns.factory), ns.args, ns.dtype)
    make = quantize.int16x8 if ns.scheme == "int16x8" else quantize.full_int8
    try:
        config = make(calibration=ns.calibration, percentile=ns.percentile)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None

    def samples(count: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(count):
            out.append(
                tuple(
                    torch.randn(x.shape, generator=gen, dtype=x.dtype) if x.is_floating_point() else x.clone()
                    for x in sample_args
                )
            )
        return out

    report = quantize.analyze(
        model,
        sample_args,
        config,
        samples(ns.samples, 0),
        samples(ns.eval_samples, 1),
        progress=False if ns.quiet else None,
    )
    report.print(top=ns.top, console=console)
    if ns.json:
        report.to_json(ns.json)
        console.print(f"wrote {ns.json}")
    if ns.png:
        report.plot(ns.png, top=ns.top)
        console.print(f"wrote {ns.png}")
    return EXIT_OK


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def inspect_model(content: bytes) -> dict:
    """A summary of a .tflite file: ops, tensors, signatures, buffers (plain data), read
    through `runtimes.targets.read_model` (the project's one flatbuffer reader)."""
    from runtimes.targets.model_view import read_model

    view = read_model(content)
    ops = collections.Counter((op.opcode, op.version) for sg in view.subgraphs for op in sg.ops)
    tensors = [
        {"subgraph": sg.index, "name": t.name, "shape": list(t.shape_signature), "dtype": t.dtype, "buffer": t.buffer}
        for sg in view.subgraphs
        for t in sg.tensors
    ]

    def io(pairs):
        return [{"name": name, "shape": list(t.shape_signature), "dtype": t.dtype} for name, t in pairs]

    signatures = [
        {"key": s.key, "subgraph": s.subgraph, "inputs": io(s.inputs), "outputs": io(s.outputs)}
        for s in view.signature_defs
    ]
    return {
        "ops": ops,
        "tensors": tensors,
        "signatures": signatures,
        "buffer_sizes": view.buffer_sizes,
        "metadata": view.metadata,
        "total_bytes": view.file_size,
        "description": view.description,
    }


def cmd_inspect(ns) -> int:
    from rich.console import Console
    from rich.table import Table

    path = ns.model
    if (problem := model_file_error(path)) is not None:
        print(f"error: {problem[1]}", file=sys.stderr)
        return problem[0]
    with open(path, "rb") as f:
        content = f.read()
    info = inspect_model(content)
    console = Console(width=max(100, Console().width))

    sig_table = Table(title="Signatures")
    for col in ("signature", "kind", "name", "shape", "dtype"):
        sig_table.add_column(col)
    for s in info["signatures"]:
        for kind in ("inputs", "outputs"):
            for t in s[kind]:
                dims = ", ".join("?" if d < 0 else str(d) for d in t["shape"])
                sig_table.add_row(s["key"], kind[:-1], t["name"], f"[{dims}]", t["dtype"])
    console.print(sig_table)

    op_table = Table(title=f"Operators ({sum(info['ops'].values())})")
    op_table.add_column("op")
    op_table.add_column("version", justify="right")
    op_table.add_column("count", justify="right")
    for (name, version), count in sorted(info["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        op_table.add_row(name, str(version), str(count))
    console.print(op_table)

    sizes = info["buffer_sizes"]
    named = {}
    for t in info["tensors"]:
        named.setdefault(t["buffer"], t)
    buf_table = Table(title=f"Largest buffers ({sum(1 for s in sizes if s)} with data)")
    for col, justify in (
        ("buffer", "right"),
        ("bytes", "right"),
        ("tensor", "left"),
        ("shape", "left"),
        ("dtype", "left"),
    ):
        buf_table.add_column(col, justify=justify)
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i])[: ns.top]:
        if not sizes[index]:
            break
        t = named.get(index, {})
        buf_table.add_row(
            str(index), f"{sizes[index]:,}", t.get("name", "(metadata)"), str(t.get("shape", "")), t.get("dtype", "")
        )
    console.print(buf_table)

    dtypes = collections.Counter(t["dtype"] for t in info["tensors"])
    console.print(f"tensors: {len(info['tensors'])} ({', '.join(f'{k} {v}' for k, v in dtypes.most_common())})")
    for key, value in info["metadata"].items():
        console.print(f"metadata {key}: {value}")
    console.print(
        f"constant data: {_human(sum(sizes))}; file: {_human(info['total_bytes'])} ({info['total_bytes']:,} bytes)"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="litert-torch", description="Convert PyTorch models to LiteRT.")
    sub = parser.add_subparsers(dest="command", required=True)

    conv = sub.add_parser("convert", help="convert MODULE:FACTORY to a .tflite file")
    conv.add_argument("factory", help="MODULE:FACTORY; the factory returns a module or (module, sample_args)")
    conv.add_argument(
        "--args",
        action="append",
        type=_parse_shape,
        default=[],
        metavar="SHAPE",
        help="shape of one sample input, e.g. 1,3,224,224 (repeat per input)",
    )
    conv.add_argument("--dtype", default="float32", help="dtype of the --args inputs (default float32)")
    conv.add_argument("-o", "--output", required=True, help="the .tflite file to write")
    conv.add_argument("--strict-export", action="store_true", help="torch.export in strict mode")
    conv.add_argument("--check", action="store_true", help="run both models and print the max relative error")
    quant = conv.add_argument_group('quantization (litert_torch.quantize; docs/export.md, "Quantized export")')
    quant.add_argument("--quantize", choices=QUANT_SCHEMES, metavar="SCHEME", help=f"one of {', '.join(QUANT_SCHEMES)}")
    quant.add_argument(
        "--calibration-data",
        action="append",
        default=[],
        metavar="FILE",
        help="calibration samples for full_int8 / int16x8: .npy (one input: [N, *shape] or [N*batch, ...]) or .npz "
        "(one array per input, in order); repeat to add files",
    )
    quant.add_argument(
        "--io", default="float", choices=["float", "int8", "uint8", "int16"], help="I/O dtype (calibrated schemes)"
    )
    quant.add_argument("--calibration", default="minmax", help="minmax, percentile, mse or moving_average")
    quant.add_argument("--percentile", type=float, default=99.99, help="for --calibration percentile")
    quant.add_argument("--block-size", type=int, default=32, help="weight_only_int4 block size (a multiple of 32)")
    quant.add_argument(
        "--keep-float", action="append", default=[], metavar="NAME", help="a layer or op kept in float (repeat)"
    )
    conv.add_argument(
        "--target",
        help="a deployment target (android-cpu, android-gpu, ios-cpu, ios-gpu, web, web-gpu, micro, edgetpu)",
    )
    conv.add_argument(
        "--target-check",
        choices=["error", "warn"],
        default="error",
        help="error (default): a broken target rule fails and writes nothing; warn: write it and list the rules",
    )
    conv.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    conv.set_defaults(run=cmd_convert)

    insp = sub.add_parser("inspect", help="summarize a .tflite file")
    insp.add_argument("model", help="the .tflite file")
    insp.add_argument("--top", type=int, default=10, help="how many of the largest buffers to list")
    insp.set_defaults(run=cmd_inspect)

    rep = sub.add_parser(
        "quantize-report",
        help="per-layer quantization sensitivity of MODULE:FACTORY",
        description="Which layers cost accuracy under full-integer quantization: each layer "
        "quantized alone, and each layer's error in the fully quantized model, "
        "measured in LiteRT. Calibration and evaluation inputs are seeded random "
        "normal tensors shaped like the sample inputs (integer inputs are reused as "
        "given); for real data call litert_torch.quantize.analyze.",
    )
    rep.add_argument("factory", help="MODULE:FACTORY; the factory returns a module or (module, sample_args)")
    rep.add_argument(
        "--args",
        action="append",
        type=_parse_shape,
        default=[],
        metavar="SHAPE",
        help="shape of one sample input, e.g. 1,3,224,224 (repeat per input)",
    )
    rep.add_argument("--dtype", default="float32", help="dtype of the --args inputs (default float32)")
    rep.add_argument("--scheme", choices=["full_int8", "int16x8"], default="full_int8")
    rep.add_argument("--calibration", default="minmax", help="minmax, percentile, mse or moving_average")
    rep.add_argument("--percentile", type=float, default=99.99, help="for --calibration percentile")
    rep.add_argument("--samples", type=int, default=16, help="calibration samples")
    rep.add_argument("--eval-samples", type=int, default=8, help="evaluation samples")
    rep.add_argument("--top", type=int, default=20, help="layers shown (most sensitive first)")
    rep.add_argument("--json", help="write the report as JSON here")
    rep.add_argument("--png", help="write a per-layer error plot here")
    rep.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    rep.set_defaults(run=cmd_quantize_report)

    add_commands(sub)  # check, bench (litert_torch/runtime_commands.py)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return ns.run(ns)


if __name__ == "__main__":
    sys.exit(main())
