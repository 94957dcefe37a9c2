"""Quantized export on the model zoo: size, accuracy and LiteRT latency per scheme, ours vs the anchor.

For each zoo model and scheme (`litert_torch.quantize`), converts with our converter and,
with `--anchor-python`, with litert-torch 0.10.0 + ai-edge-quantizer (`anchor_quantize.py`),
then measures both files in this process:

| column | meaning |
| --- | --- |
| size x | file size / our float32 file size (target for int8 schemes: <= 0.27) |
| max err, mean err | over `--samples` seeded random inputs: max and mean of abs(quantized - torch float), divided by max abs(torch) per input |
| top-1 | classifiers (2-D logits): share of inputs where the argmax agrees with PyTorch (target for int8: >= 97%) |
| ms | median latency, 1 thread, XNNPACK (the interpreter's default); ours and the anchor's runs interleaved; wall time, or with `--cpu-time` the invoking thread's CPU time (for a loaded machine) |
| lat x | ours / anchor (target <= 1.05) |
| float io | whether the file takes float inputs; integer-I/O files are fed quantized inputs and their outputs dequantized |

    python -m benchmarks.converter.quant_bench                                       # default models, all schemes
    python -m benchmarks.converter.quant_bench --models resnet18 --schemes full_int8 --samples 50
    python -m benchmarks.converter.quant_bench --anchor-python /tmp/anchor-venv/bin/python --json /tmp/quant.json

Calibration (full_int8, int16x8): `--calibration` seeded samples, different from the
evaluation inputs, the same for both converters. `--methods minmax,percentile,mse` adds
one row per calibration method for the calibrated schemes (scheme shown as
`full_int8:mse`; the anchor row is its own static recipe, measured once per scheme).
`float ops` counts the ops our full-integer files left in float (`edge.quant_report`).
`percentile=99.0` in `--methods` sets the percentile (default 99.99).

    python -m benchmarks.converter.quant_bench --schemes full_int8 --methods minmax,percentile,mse,moving_average \
        --samples 500 --anchor-python /tmp/anchor-venv/bin/python --json /tmp/quant.json

Transformer classifiers: the zoo's transformers return hidden states, so the bench adds
two classifiers of its own (`benchmarks/zoo/classifiers.py`, random weights, nothing downloads):
`bert_classifier` (BertForSequenceClassification on token ids) and `vit_classifier`
(ViTForImageClassification on 32x32 images), 10 classes each.

`--auto 0.99` adds, per calibrated scheme and method, a row `full_int8:mse+auto`:
`quantize.auto(min_agreement=0.99)` decides on `--auto-eval` inputs of their own (seed
2, distinct from the evaluation inputs), and the row is measured on the evaluation
inputs; `float layers` is how many layers auto kept float, of how many.

    python -m benchmarks.converter.quant_bench --models bert_classifier,vit_classifier --schemes full_int8 \
        --methods minmax,percentile,mse --samples 500
    python -m benchmarks.converter.quant_bench --models convnext_nano --schemes full_int8 --methods mse \
        --samples 200 --auto 0.99 --auto-eval 200

`--bytes` prints where each file's bytes go (`byte_breakdown`): int8 weights, int32
biases, per-channel float32 scales and int64 zero points of weights and biases, the rest.

    python -m benchmarks.converter.quant_bench --models mobilenet_v2 --schemes full_int8 --samples 20 --bytes

`--models cnns` stands for every CNN classifier of the zoo (`cnn_classifiers`). Long
sweeps: `--json-dir DIR` writes one JSON per model (`DIR/<model>.json`, after every row,
`"complete": true` once all its rows are done) and skips models already complete there,
so a cut run resumes; `--isolate` runs each model in its own process (a crash or the
memory of one model does not touch the others) and prints the table of all of them.

    python -m benchmarks.converter.quant_bench --models cnns --schemes full_int8 --methods mse,percentile,minmax \
        --samples 500 --runs 5 --json-dir /tmp/qcnn --isolate

In the JSON, classifier rows whose output is dequantized from int8 carry `grid_ceiling`:
the top-1 agreement the output grid alone allows (the float logits rounded to that
grid), with `grid_step` and `margin_below_step` (share of top-2 margins below one step).
`--keep-float LAYERS` passes `keep_float=` to the calibrated schemes (rows `...+float(LAYERS)`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import litert_torch
from benchmarks import anchors
from benchmarks.anchors.anchor_quantize import calibration_inputs
from benchmarks.anchors.zoo_loader import load_zoo
from benchmarks.converter.litert_measure import LoadedModel
from benchmarks.harness import module_command, repo_env
from litert_torch import quantize

DEFAULT_MODELS = ["mlp_mixer", "hf_vit", "hf_bert", "hf_gpt2", "mobilenet_v2", "efficientnet_b0", "resnet18"]
SCHEMES = {
    "dynamic_int8": quantize.dynamic_int8,
    "weight_only_int8": quantize.weight_only_int8,
    "weight_only_int4": lambda: quantize.weight_only_int4(32),
    "float16": quantize.float16,
    "full_int8": quantize.full_int8,  # (calibration=...) for --methods
    "int16x8": quantize.int16x8,
}
INT8_SCHEMES = ("dynamic_int8", "weight_only_int8", "full_int8")


def classifiers(zoo) -> dict:
    """`benchmarks/zoo/classifiers.py`'s CLASSIFIERS (a module of the zoo package, not an entry)."""
    return importlib.import_module(zoo.__name__ + ".classifiers").CLASSIFIERS


def cnn_classifiers(zoo) -> list[str]:
    """Every CNN classifier of the zoo, in registration order: the "cnn" family (torchvision-
    style and timm), and the audio and video models whose output is 2-D logits."""
    names = []
    for entry in zoo.ZOO.values():
        if entry.family in ("audio", "video"):
            model, args = zoo.build(entry.name)
            with torch.no_grad():
                if _first_output(model(*args)).ndim != 2:
                    continue
        elif entry.family != "cnn":
            continue
        names.append(entry.name)
    return names


def build(zoo, name: str):
    """(eval-mode model, sample args) for a zoo model or one of the classifiers."""
    if name not in classifiers(zoo):
        return zoo.build(name)
    factory, make_inputs = classifiers(zoo)[name]
    return factory(), make_inputs(torch.Generator().manual_seed(0))


def make_samples(zoo, name: str, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Seeded inputs for `name`: calibration (seed 0), evaluation (seed 1), the set
    `quantize.auto` decides on (seed 2); the three never overlap."""
    if name in classifiers(zoo):
        return importlib.import_module(zoo.__name__ + ".classifiers").samples(name, count, seed)
    return calibration_inputs(zoo, name, count, 0) if seed == 0 else eval_inputs(zoo, name, count, seed)


def eval_inputs(zoo, name: str, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    entry = zoo.ZOO[name]
    out = []
    for i in range(count):
        generator = torch.Generator().manual_seed(seed * 7919 + i)
        if entry.make_inputs is not None:
            out.append(tuple(entry.make_inputs(generator)))
        else:
            out.append(tuple(torch.randn(shape, generator=generator) for shape in entry.inputs))
    return out


def _quant_params(detail) -> tuple[float, int]:
    scale, zero = detail["quantization"]
    return float(scale), int(zero)


def feed(model: LoadedModel, sample) -> list[np.ndarray]:
    """Inputs for `model`: float as is; integer-quantized inputs are quantized with the
    file's own parameters (token ids stay ids)."""
    arrays = []
    for detail, x in zip(model.inputs, sample):
        x = x.numpy()
        scale, zero = _quant_params(detail)
        if scale and np.dtype(detail["dtype"]) != x.dtype and np.issubdtype(x.dtype, np.floating):
            info = np.iinfo(detail["dtype"])
            x = np.clip(np.round(x / scale) + zero, info.min, info.max)
        arrays.append(x.astype(detail["dtype"]))
    return arrays


def outputs_as_float(model: LoadedModel, outputs) -> list[np.ndarray]:
    result = []
    for detail, y in zip(model.outputs, outputs):
        scale, zero = _quant_params(detail)
        result.append((y.astype(np.float64) - zero) * scale if scale else y.astype(np.float64))
    return result


def byte_breakdown(content: bytes) -> dict[str, int]:
    """Where a quantized file's bytes go: constant data by role (weights: input 1 of an op,
    bias: input 2), the quantization vectors (float32 scales, int64 zero points; each
    distinct vector counted once, as the writer shares equal ones) by role and
    granularity, and the rest (tensor/op tables, names, alignment padding)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(content, 0)
    parts: dict[str, int] = {}
    seen_buffers, seen_vectors = set(), set()
    for graph in model.subgraphs:
        roles: dict[int, set[int]] = {}
        for op in graph.operators:
            for position, index in enumerate(op.inputs):
                roles.setdefault(int(index), set()).add(position)
        for index, tensor in enumerate(graph.tensors):
            positions = roles.get(index, set())
            role = "bias" if 2 in positions else ("weights" if 1 in positions else "activation")
            data = model.buffers[tensor.buffer].data
            if data is not None and len(data) and tensor.buffer not in seen_buffers:
                seen_buffers.add(tensor.buffer)
                dtype = {0: "float32", 2: "int32", 9: "int8", 17: "int4"}.get(tensor.type, f"type {tensor.type}")
                key = f"{role if role != 'activation' else 'other'} data {dtype}"
                parts[key] = parts.get(key, 0) + len(data)
            q = tensor.quantization
            if q is None or q.scale is None:
                continue
            granularity = "per-channel" if len(q.scale) > 1 else "per-tensor"
            for name, values in (
                ("scales", np.asarray(q.scale, np.float32)),
                ("zero points", np.asarray(q.zeroPoint, np.int64)),
            ):
                if (name, values.tobytes()) not in seen_vectors:
                    seen_vectors.add((name, values.tobytes()))
                    key = f"{role} {name} {granularity}"
                    parts[key] = parts.get(key, 0) + values.nbytes + 4  # + the vector's length
    parts["rest: tables, names, padding"] = len(content) - sum(parts.values())
    return parts


def accuracy(model: LoadedModel, samples, references) -> dict:
    max_err, mean_errs, agree, classifier = 0.0, [], 0, True
    for sample, expected in zip(samples, references):
        actual = outputs_as_float(model, model.run(feed(model, sample)))[0]
        scale = max(float(np.abs(expected).max()), 1e-12)
        diff = np.abs(actual.reshape(expected.shape) - expected) / scale
        max_err = max(max_err, float(diff.max()))
        mean_errs.append(float(diff.mean()))
        classifier = expected.ndim == 2
        if classifier:
            agree += int(np.argmax(actual.reshape(expected.shape), -1)[0] == np.argmax(expected, -1)[0])
    return {
        "max_err": max_err,
        "mean_err": float(np.mean(mean_errs)),
        "top1": agree / len(samples) if classifier else None,
    }


def output_grid_ceiling(model: LoadedModel, references) -> dict | None:
    """The top-1 agreement the int8 output grid alone allows: the float logits rounded to
    the grid of the int8 tensor the (float) output is dequantized from (ties go to the
    lower index, as in argmax); None unless the first output is such a classifier."""
    outputs = {d["index"] for d in model.outputs[:1]}
    producer = [op for op in model.interpreter._get_ops_details() if set(op["outputs"]) & outputs]
    if not producer or producer[0]["op_name"] != "DEQUANTIZE" or references[0].ndim != 2:
        return None
    detail = model.interpreter._get_tensor_details(int(producer[0]["inputs"][0]), 0)
    scale, zero = _quant_params(detail)
    logits = np.concatenate(references)
    grid = np.clip(np.round(logits / scale) + zero, -128, 127)
    top2 = np.sort(logits, -1)[:, -2:]
    return {
        "grid_ceiling": float(np.mean(grid.argmax(-1) == logits.argmax(-1))),
        "grid_step": scale,
        "margin_below_step": float(np.mean(top2[:, 1] - top2[:, 0] < scale)),
    }


def run_anchor(python: str, models, schemes, out_dir: Path, calibration: int) -> dict:
    cmd = [
        python,
        anchors.script("anchor_quantize"),
        "--out-dir",
        str(out_dir),
        "--schemes",
        ",".join(schemes),
        "--calibration",
        str(calibration),
        *models,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=anchors.DIR)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[(record["model"], record["scheme"])] = record
    if not results:
        print(f"anchor failed: {proc.stderr[-2000:]}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--samples", type=int, default=200, help="evaluation inputs per model")
    parser.add_argument(
        "--int16-samples",
        type=int,
        default=20,
        help="evaluation inputs for int16x8, which runs on LiteRT's slow reference kernels",
    )
    parser.add_argument("--calibration", type=int, default=16, help="calibration samples (full_int8, int16x8)")
    parser.add_argument(
        "--methods",
        default="minmax",
        help="calibration methods for full_int8/int16x8, comma-separated (minmax, percentile, mse, moving_average; "
        "percentile=99.0 sets the percentile)",
    )
    parser.add_argument(
        "--auto",
        type=float,
        default=None,
        metavar="MIN_AGREEMENT",
        help="also run quantize.auto(min_agreement=...) per calibrated scheme and method",
    )
    parser.add_argument("--auto-eval", type=int, default=200, help="inputs quantize.auto decides on (seed 2)")
    parser.add_argument(
        "--keep-float",
        default=None,
        metavar="LAYERS",
        help="comma-separated layer names the calibrated schemes keep float (keep_float=); rows get a +float suffix",
    )
    parser.add_argument(
        "--bytes", action="store_true", help="print where each quantized file's bytes go (x the float file)"
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="latency as the invoking thread's CPU time (time.thread_time; 1-thread XNNPACK runs on it), "
        "not wall time: on a shared, loaded machine wall time mostly measures the other processes",
    )
    parser.add_argument("--anchor-python", default=None)
    parser.add_argument(
        "--anchor-dir",
        type=Path,
        default=None,
        help="reuse <model>.<scheme>.anchor.tflite files an earlier run kept (--keep) instead of re-running the anchor",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--json-dir", type=Path, default=None, help="one JSON per model; models complete there are skipped (resume)"
    )
    parser.add_argument("--isolate", action="store_true", help="each model in its own process")
    parser.add_argument("--keep", type=Path, default=None, help="keep the .tflite files here")
    options = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # the PyTorch references on one thread, like the interpreters: on a loaded machine two
    # intra-op threads made a ResNet-18 forward 4-10x slower (4.2 s vs 0.4 s at load 12)
    torch.set_num_threads(1)
    models, schemes = options.models.split(","), options.schemes.split(",")
    zoo = load_zoo()
    if models == ["cnns"]:
        models = cnn_classifiers(zoo)
    listed = models
    if options.json_dir:
        options.json_dir.mkdir(parents=True, exist_ok=True)
        done = [m for m in models if _model_json(options, m).get("complete")]
        if done:
            print(f"complete in {options.json_dir}, skipped: {', '.join(done)}", file=sys.stderr)
        models = [m for m in models if m not in done]
    if options.isolate:
        _run_isolated(options, models, listed)
        return
    out_dir = options.keep or Path(tempfile.mkdtemp(prefix="quant_bench_"))
    out_dir.mkdir(parents=True, exist_ok=True)

    anchor = {}
    if options.anchor_dir:
        for name in models:
            for scheme in schemes:
                path = options.anchor_dir / f"{name}.{scheme}.anchor.tflite"
                anchor[(name, scheme)] = (
                    {"ok": True, "tflite": str(path)}
                    if path.exists()
                    else {"ok": False, "error": "no anchor file (its quantizer failed)"}
                )
    elif options.anchor_python:
        start = time.perf_counter()
        anchor = run_anchor(options.anchor_python, models, schemes, out_dir, options.calibration)
        print(f"anchor: {len(anchor)} results in {time.perf_counter() - start:.0f} s", file=sys.stderr)

    rows = []
    for name in models:
        model, args = build(zoo, name)
        samples = make_samples(zoo, name, options.samples, seed=1)
        with torch.no_grad():
            references = [np.asarray(_first_output(model(*s)), np.float64) for s in samples]
        float_content = litert_torch.convert(model, args).model_content()
        float_size = len(float_content)
        float_parts = byte_breakdown(float_content) if options.bytes else None
        calibration = make_samples(zoo, name, options.calibration, seed=0)
        variants = [
            (scheme, method, use_auto)
            for scheme in schemes
            for method in (options.methods.split(",") if scheme in ("full_int8", "int16x8") else [None])
            for use_auto in ([False, True] if options.auto is not None and method is not None else [False])
        ]
        auto_eval = make_samples(zoo, name, options.auto_eval, seed=2) if options.auto is not None else None
        for scheme, method, use_auto in variants:
            label = (scheme if method is None else f"{scheme}:{method}") + ("+auto" if use_auto else "")
            kept = options.keep_float.split(",") if options.keep_float and method is not None else None
            label += f"+float({options.keep_float})" if kept else ""
            row = {"model": name, "scheme": label, "float_bytes": float_size}
            count = options.int16_samples if scheme == "int16x8" else len(samples)
            row["samples"] = count
            try:
                start = time.perf_counter()
                config = (
                    SCHEMES[scheme]() if method is None else SCHEMES[scheme](**_calibration(method), keep_float=kept)
                )
                if use_auto:
                    config = quantize.auto(config, min_agreement=options.auto, eval_data=auto_eval)
                edge = litert_torch.convert(
                    model,
                    args,
                    quant_config=config,
                    calibration_data=calibration if scheme in ("full_int8", "int16x8") else None,
                )
                row["convert_s"] = time.perf_counter() - start
                if edge.quant_report is not None:
                    row["float_ops"] = len(edge.quant_report.unrequested)
                    row["float_op_list"] = [str(f) for f in edge.quant_report.unrequested[:5]]
                    chosen = edge.quant_report.auto
                    if chosen is not None:
                        row.update(
                            float_layers=f"{chosen['float_layers']}/{chosen['layers']}",
                            keep_float=list(chosen["keep_float"]),
                            auto_agreement=chosen["agreement"],
                            # per k float layers: (error, agreement) on the decision set
                            auto_measured={k: list(v) for k, v in chosen["measured"].items()},
                            # the sensitivity report's top layers: (name, error alone, agreement alone)
                            sensitivity_top=[
                                (s.name, s.alone, s.alone_agreement) for s in chosen["sensitivity"].ranking()[:8]
                            ],
                        )
                content = edge.model_content()
                (out_dir / f"{name}.{label.replace(':', '.')}.tflite").write_bytes(content)
                ours = LoadedModel(content)
                if options.bytes:
                    row["bytes_breakdown"] = byte_breakdown(content)
                    row["float_breakdown"] = float_parts
                row.update(
                    bytes=len(content),
                    size_x=len(content) / float_size,
                    float_io=_float_io(ours),
                    **accuracy(ours, samples[:count], references[:count]),
                )
                row.update(output_grid_ceiling(ours, references[:count]) or {})
            except Exception as error:  # noqa: BLE001  (report and go on)
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                continue
            theirs = None
            first = method in (None, options.methods.split(",")[0]) and not use_auto
            record = anchor.get((name, scheme)) if first else None
            if record and record.get("ok"):
                try:
                    theirs = LoadedModel(Path(record["tflite"]).read_bytes())
                    a = accuracy(theirs, samples[:count], references[:count])
                    row.update(
                        anchor_bytes=len(theirs.content),
                        anchor_size_x=len(theirs.content) / float_size,
                        anchor_max_err=a["max_err"],
                        anchor_mean_err=a["mean_err"],
                        anchor_top1=a["top1"],
                        anchor_float_io=_float_io(theirs),
                    )
                except Exception as error:  # noqa: BLE001
                    row["anchor_error"] = f"runs: {type(error).__name__}: {error}".splitlines()[0][:200]
                    theirs = None
            elif record:
                row["anchor_error"] = record.get("error", "")[:200]
            pair = [ours] + ([theirs] if theirs is not None else [])
            latencies = _latencies(pair, samples[0], options.runs, time.thread_time if options.cpu_time else None)
            row["ms"] = latencies[0] * 1e3
            if theirs is not None:
                row["anchor_ms"] = latencies[1] * 1e3
                row["lat_x"] = latencies[0] / latencies[1]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if options.json:  # after every row: a crash in one model keeps the others
                _write_json(options, rows)
            if options.json_dir:
                _write_model_json(options, name, rows, complete=False)
        if options.json_dir:
            _write_model_json(options, name, rows, complete=True)
    _print_table(rows)
    if options.bytes:
        _print_bytes(rows)
    if options.json:
        _write_json(options, rows)


def _calibration(method: str) -> dict:
    """`--methods` entry -> calibration keywords: "mse" or "percentile=99.0"."""
    name, _, value = method.partition("=")
    return {"calibration": name, **({name: float(value)} if value else {})}


def _write_json(options, rows) -> None:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()}
    settings["load_average"] = os.getloadavg()
    options.json.write_text(json.dumps({"rows": rows, "settings": settings}, indent=1, default=str))


def _model_json(options, name: str) -> dict:
    path = options.json_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_model_json(options, name: str, rows, complete: bool) -> None:
    """`DIR/<name>.json`: this model's rows so far; written to a temporary file and renamed,
    so a run cut mid-write leaves the previous version."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()}
    settings["load_average"] = os.getloadavg()
    record = {"model": name, "complete": complete, "rows": [r for r in rows if r["model"] == name]}
    path = options.json_dir / f"{name}.json"
    path.with_suffix(".tmp").write_text(json.dumps({**record, "settings": settings}, indent=1, default=str))
    path.with_suffix(".tmp").replace(path)


def _run_isolated(options, models, listed) -> None:
    """One child process per model in `models` (the same options, `--models <name>`), then
    the table of every model in `listed` (with `--json-dir`, those skipped as complete too)."""
    args = [a for a in sys.argv[1:] if a != "--isolate"]
    rows = []
    for name in listed:
        out = Path(tempfile.mkdtemp(prefix="quant_bench_")) / "rows.json"
        if name in models:
            proc = subprocess.run(
                module_command(__spec__.name, *args, "--json", str(out), "--models", name), env=repo_env()
            )
            if proc.returncode:
                print(f"{name}: the process exited with {proc.returncode}", file=sys.stderr)
        if options.json_dir:
            out = options.json_dir / f"{name}.json"
        if out.exists():
            rows += json.loads(out.read_text())["rows"]
    _print_table(rows)
    if options.json:
        _write_json(options, rows)


def _float_io(model: LoadedModel) -> bool:
    """True unless an input or output is an integer-quantized tensor (token ids do not count)."""
    return not any(_quant_params(d)[0] for d in model.inputs + model.outputs)


def _first_output(out):
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return leaves[0].detach().float().numpy()


def _latencies(models: list[LoadedModel], sample, runs: int, clock=None) -> list[float]:
    """Median seconds per invoke (wall time, or `clock()` differences, e.g. CPU time); each
    model gets inputs in its own I/O type. Models take turns in blocks of 5 invokes (ABBA
    order): switching models on every invoke made the first of each pair up to 9x slower
    here (caches), blocks keep the comparison fair."""
    import statistics

    for m in models:
        m.set_inputs(feed(m, sample))
        m.interpreter.invoke()
    times = [[] for _ in models]
    for i in range(max(1, runs // 5)):
        order = range(len(models)) if i % 2 == 0 else reversed(range(len(models)))
        for k in order:
            models[k].set_inputs(feed(models[k], sample))
            models[k].interpreter.invoke()  # re-warm after the other model ran
            times[k] += [models[k].invoke_seconds() if clock is None else _timed(models[k], clock) for _ in range(5)]
    return [statistics.median(t) for t in times]


def _timed(model: LoadedModel, clock) -> float:
    start = clock()
    model.interpreter.invoke()
    return clock() - start


def _print_table(rows) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="quantized export: ours vs litert-torch 0.10.0 + ai-edge-quantizer")
    for col in (
        "model",
        "scheme",
        "size x",
        "max err",
        "mean err",
        "top-1",
        "ms",
        "float io",
        "float ops",
        "float layers",
        "anchor size x",
        "anchor max err",
        "anchor top-1",
        "anchor ms",
        "lat x",
        "note",
    ):
        table.add_column(col)

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        table.add_row(
            r["model"],
            r["scheme"],
            f(r.get("size_x"), ".3f"),
            f(r.get("max_err"), ".4f"),
            f(r.get("mean_err"), ".5f"),
            f(r.get("top1"), ".1%"),
            f(r.get("ms"), ".2f"),
            str(r.get("float_io", "-")),
            str(r.get("float_ops", "-")),
            str(r.get("float_layers", "-")),
            f(r.get("anchor_size_x"), ".3f"),
            f(r.get("anchor_max_err"), ".4f"),
            f(r.get("anchor_top1"), ".1%"),
            f(r.get("anchor_ms"), ".2f"),
            f(r.get("lat_x"), ".2f"),
            (
                r.get("error")
                or r.get("anchor_error")
                or ("anchor: integer I/O only" if r.get("anchor_float_io") is False else "")
            )[:60],
        )
    Console(width=240).print(table)


def _print_bytes(rows) -> None:
    """One line per file and part: bytes and bytes / float file, and the float file's rest."""
    for r in rows:
        if "bytes_breakdown" not in r:
            continue
        print(f"{r['model']} {r['scheme']}: {r['bytes']} B = {r['size_x']:.4f}x of {r['float_bytes']} B")
        for part, count in sorted(r["bytes_breakdown"].items(), key=lambda kv: -kv[1]):
            print(f"    {part:38s} {count:10d}  {count / r['float_bytes']:.4f}x")
        rest = r["float_breakdown"]["rest: tables, names, padding"]
        print(f"    {'(float file: rest)':38s} {rest:10d}  {rest / r['float_bytes']:.4f}x")


if __name__ == "__main__":
    main()
