"""Which of the device's lowerings a TPU's compiler refuses, or aborts on, per dtype.

Compiles every ATen -> JAX lowering (`tpu_backend/ops/`) for one TPU chip on this machine
(`kernels.tpu.compile_for`: libtpu's whole compiler, no chip needed), on the arguments the
op really receives: PyTorch's OpInfo samples run on CPU under a dispatch mode that records
each ATen call the device's table lowers. Each (op, argument dtypes) is compiled once.

An abort inside XLA kills the process, so the compiles run in a worker process; when the
worker dies, the case it was compiling is recorded as an abort (with XLA's "Check failed"
line) and a new worker carries on after it. Run:

    python tools/tpu_op_sweep.py [--chip v5e] [--dtypes float32,float64,...] [--ops svd,fft]
                                 [--json sweep.json]

It prints one line per case that does not compile, then a table by (family, dtype): "ok"
compiled, "host" runs outside jit (data-dependent ops) or on the host CPU by the device's
policy (`tpu_backend/chip_limits.py`), "raise" is refused by it before XLA, "error" is the
compiler's error, "ABORT" killed the process. Without `--raw` the sweep compiles what the
device compiles on a TPU; `--raw` bypasses the policy and the TPU-only paths of the
lowerings, which shows what XLA does with the plain lowerings.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DTYPES = ("float32", "float64", "complex64", "float16", "bfloat16", "int64", "int16", "uint8", "bool")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument of a recorded call: only its shape and dtype travel."""

    shape: tuple
    dtype: object  # torch.dtype


@dataclass
class Case:
    op: str  # "aten::_linalg_svd.default"
    family: str  # the lowering's module: linalg, spectral, ...
    dtypes: tuple  # the tensor arguments' dtypes, as names
    args: tuple
    kwargs: dict
    source: str  # the OpInfo entry whose sample made the call


# --------------------------------------------------------------------------- capture (no TPU)


def _spec(value):
    import torch

    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return tuple(_spec(v) for v in value)
    if isinstance(value, (torch.device, torch.Generator)):
        return None if isinstance(value, torch.Generator) else value
    return value


def _tensor_dtypes(value, found: list) -> None:
    if isinstance(value, TensorSpec):
        found.append(str(value.dtype).removeprefix("torch."))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensor_dtypes(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _tensor_dtypes(v, found)


def _has_empty(value) -> bool:
    """A zero-size tensor argument: its program compiles trivially and would hide the real one."""
    if isinstance(value, TensorSpec):
        return 0 in value.shape
    if isinstance(value, (list, tuple)):
        return any(_has_empty(v) for v in value)
    if isinstance(value, dict):
        return any(_has_empty(v) for v in value.values())
    return False


# Distinct calls (static arguments, shapes) compiled per (op, argument dtypes).
CASES_PER_DTYPES = 3


def capture(dtype_names, op_filter) -> list[Case]:
    """The distinct (op, argument dtypes) calls OpInfo samples make into the device's table."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._python_dispatch import TorchDispatchMode

    import tpu_backend  # noqa: F401  (registers the table)
    from tpu_backend.eager.variants import functional_variant
    from tpu_backend.ops.registry import _TORCH_TO_JAX, JAX_LOWERINGS

    dtypes = [getattr(torch, name) for name in dtype_names]
    device_dtypes = {str(d).removeprefix("torch.") for d in _TORCH_TO_JAX}  # complex128 never reaches the device
    cases: dict = {}
    per_dtypes: collections.Counter = collections.Counter()
    source = [""]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            target = func if func in JAX_LOWERINGS else functional_variant(func)
            if target is not None and target in JAX_LOWERINGS:
                spec_args = _spec(tuple(args))
                spec_kwargs = {k: _spec(v) for k, v in kwargs.items() if k not in ("out", "generator")}
                if target is not func:  # an out/in-place variant: the functional form's arguments
                    names = {a.name for a in target._schema.arguments}
                    spec_kwargs = {k: v for k, v in spec_kwargs.items() if k in names}
                found: list = []
                _tensor_dtypes((spec_args, spec_kwargs), found)
                by_dtypes = (str(target), tuple(found))
                key = (*by_dtypes, repr((spec_args, spec_kwargs)))
                wanted = found and all(d in device_dtypes for d in found) and not _has_empty((spec_args, spec_kwargs))
                if wanted and key not in cases and per_dtypes[by_dtypes] < CASES_PER_DTYPES:
                    per_dtypes[by_dtypes] += 1
                    family = JAX_LOWERINGS[target].fn.__module__.rsplit(".", 1)[-1]
                    cases[key] = Case(str(target), family, tuple(found), spec_args, spec_kwargs, source[0])
            return func(*args, **kwargs)

    for info in op_db:
        name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if op_filter and not any(f in name for f in op_filter):
            continue
        supported = info.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported:
                continue
            source[0] = f"{name} {str(dtype).removeprefix('torch.')}"
            try:
                samples = list(info.sample_inputs("cpu", dtype, requires_grad=False))[:4]
                with Record():
                    for sample in samples:
                        try:
                            info.op(sample.input, *sample.args, **sample.kwargs)
                        except Exception:
                            pass  # the op itself rejects this sample on CPU: nothing to compile
            except Exception:
                pass
    return list(cases.values())


# --------------------------------------------------------------------------- compile (worker)


def _op(name: str):
    import torch

    namespace, packet, overload = name.split(".")  # str(OpOverload): "aten._linalg_svd.default"
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def compile_case(case: Case, chip: str, raw: bool) -> str:
    """'ok', 'host' (the device runs it outside jit), 'refused: <policy>' or raises the compiler's error."""
    import jax

    from kernels import tpu
    from tpu_backend import chip_limits, random
    from tpu_backend.ops.registry import JAX_LOWERINGS, jax_dtype

    op = _op(case.op)
    lowering = JAX_LOWERINGS[op]
    if lowering.data_dependent or (lowering.data_dependent_when is not None and "bool" in case.dtypes):
        return "host"  # value-dependent shape (nonzero, a bool mask): the device runs it outside jit
    fn = getattr(lowering.fn, "__wrapped__", lowering.fn) if raw else lowering.fn  # raw: without the guard
    arrays: list = []

    def slot(value):
        if isinstance(value, TensorSpec):
            arrays.append(jax.ShapeDtypeStruct(value.shape, jax_dtype(value.dtype)))
            return ("__array__", len(arrays) - 1)
        if isinstance(value, tuple):
            return tuple(slot(v) for v in value)
        return value

    template_args, template_kwargs = slot(case.args), {k: slot(v) for k, v in case.kwargs.items()}
    if lowering.needs_rng:
        key = random.next_key()
        arrays.append(jax.ShapeDtypeStruct(key.shape, key.dtype))
        template_kwargs["key"] = ("__array__", len(arrays) - 1)

    def fill(value, values):
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "__array__":
            return values[value[1]]
        if isinstance(value, tuple):
            return [fill(v, values) for v in value]
        return value

    def program(*values):
        args = [fill(a, values) for a in template_args]
        kwargs = {k: fill(v, values) for k, v in template_kwargs.items()}
        return fn(*args, **kwargs)

    if raw:  # the lowering as written, traced as for any backend: what XLA's TPU compiler does with it
        with chip_limits.platform("cpu"):
            tpu.compile_for(chip, program, *arrays)
        return "ok"
    limit = chip_limits.limit_for(op, case.dtypes, platform="tpu")
    if limit is not None:  # the device never compiles it for a TPU
        return f"{limit.action}: {limit.reason}"
    tpu.compile_for(chip, program, *arrays)
    return "ok"


def worker(cases_path: str, start: int, chip: str, raw: bool) -> None:
    import tpu_backend  # noqa: F401  (jax_enable_x64 on, as on the device)

    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    for index in range(start, len(cases)):
        print(f"START {index}", flush=True)
        began = time.perf_counter()
        try:
            outcome = compile_case(cases[index], chip, raw)
        except Exception as error:  # the compiler's refusal: keep its first line
            lines = [line for line in str(error).splitlines() if line.strip()]
            outcome = f"error: {type(error).__name__}: {lines[0][:240] if lines else ''}"
        seconds = time.perf_counter() - began
        print("DONE " + json.dumps({"index": index, "outcome": outcome, "seconds": round(seconds, 3)}), flush=True)


# --------------------------------------------------------------------------- driver


def _abort_line(stderr: str) -> str:
    for line in stderr.splitlines():
        if "Check failed" in line or "F1" in line[:3] or "Fatal" in line:
            return line.strip()[:240]
    return (stderr.strip().splitlines() or ["(no output)"])[-1][:240]


def sweep(cases: list[Case], chip: str, raw: bool) -> list[dict]:
    """Compile every case in worker processes; an abort costs one restart."""
    results: dict[int, dict] = {}
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as folder:
        cases_path = os.path.join(folder, "cases.pkl")
        with open(cases_path, "wb") as f:
            pickle.dump(cases, f)
        start = 0
        while start < len(cases):
            command = [sys.executable, os.path.abspath(__file__), "--worker", cases_path, "--start", str(start)]
            command += ["--chip", chip] + (["--raw"] if raw else [])
            stderr_path = os.path.join(folder, "stderr.txt")
            with open(stderr_path, "w") as stderr:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
                current = None
                for line in proc.stdout:
                    if line.startswith("START "):
                        current = int(line.split()[1])
                    elif line.startswith("DONE "):
                        done = json.loads(line[5:])
                        results[done["index"]] = done
                        current = None
                        if len(results) % 500 == 0:
                            print(f"... {len(results)} of {len(cases)} compiled", file=sys.stderr, flush=True)
                proc.wait()
            if current is None:
                break
            with open(stderr_path) as f:
                results[current] = {"index": current, "outcome": f"ABORT: {_abort_line(f.read())}", "seconds": None}
            start = current + 1
    rows = []
    for index, case in enumerate(cases):
        result = results.get(index, {"outcome": "not run", "seconds": None})
        rows.append(dict(op=case.op, family=case.family, dtypes=list(case.dtypes), source=case.source, **result))
    return rows


def _kind(outcome: str) -> str:
    return outcome.split(":", 1)[0].split()[0]


def report(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        if _kind(row["outcome"]) not in ("ok", "host"):
            lines.append(f"{row['family']:<11} {row['op']:<48} {','.join(row['dtypes']):<30} {row['outcome']}")
    table = collections.defaultdict(collections.Counter)
    for row in rows:
        main = row["dtypes"][0] if row["dtypes"] else "-"
        table[(row["family"], main)][_kind(row["outcome"])] += 1
    lines.append("")
    lines.append(
        f"{'family':<11} {'dtype':<10} " + " ".join(f"{k:>8}" for k in ("ok", "host", "error", "ABORT", "cpu", "raise"))
    )
    for (family, dtype), counts in sorted(table.items()):
        cells = " ".join(f"{counts.get(k, 0):>8}" for k in ("ok", "host", "error", "ABORT", "cpu", "raise"))
        lines.append(f"{family:<11} {dtype:<10} {cells}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    parser.add_argument("--ops", default="", help="comma-separated substrings of OpInfo names")
    parser.add_argument("--families", default="", help="comma-separated lowering families (linalg,spectral)")
    parser.add_argument("--raw", action="store_true", help="bypass the device's chip policy")
    parser.add_argument("--json", help="write every case's outcome here")
    parser.add_argument("--cases", help="a file of captured calls: read if it exists, else written")
    parser.add_argument("--rerun", help="a --json file of an earlier sweep: compile again only what failed there")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        worker(options.worker, options.start, options.chip, options.raw)
        return
    began = time.perf_counter()
    if options.cases and os.path.exists(options.cases):
        with open(options.cases, "rb") as f:
            cases = pickle.load(f)
    else:
        cases = capture(options.dtypes.split(","), [o for o in options.ops.split(",") if o])
        if options.cases:
            with open(options.cases, "wb") as f:
                pickle.dump(cases, f)
    if options.rerun:
        with open(options.rerun) as f:
            failed = [r for r in json.load(f) if _kind(r["outcome"]) not in ("ok", "host")]
        keys = {(r["op"], tuple(r["dtypes"]), r["source"]) for r in failed}
        cases = [c for c in cases if (c.op, tuple(c.dtypes), c.source) in keys]
    if options.families:
        cases = [c for c in cases if c.family in options.families.split(",")]
    print(f"{len(cases)} distinct (op, dtypes) calls captured in {time.perf_counter() - began:.0f} s", flush=True)
    rows = sweep(cases, options.chip, options.raw)
    print(report(rows))
    print(f"total {time.perf_counter() - began:.0f} s")
    if options.json:
        with open(options.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
