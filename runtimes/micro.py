"""TensorFlow Lite Micro: run a model in the `tflite-micro` Python interpreter, measure its
tensor arena, and export it as C source (`.h` + `.cc`, an `alignas(16)` byte array).

TFLM aborts the whole process when its arena is too small, so runs with a given arena
happen in a child Python process; runs with the generous default arena happen here. The
arena is read from TFLM's own RecordingMicroAllocator report ("Arena allocation total N
bytes"). The host is 64-bit:
its arena is an upper bound for a 32-bit microcontroller (pointers are smaller there).

    from runtimes.micro import run_micro, export_c_source
    result = run_micro(content, [x_int8])        # outputs + arena_bytes
    export_c_source(content, "person_detect", "out/", arena_bytes=result.arena_bytes)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from common.files import write_atomic
from runtimes.litert import captured_c_stderr

HOST_ARENA = 64 << 20  # generous arena for the measuring run
ARENA_MARGIN = 1024  # headroom added to the measured arena in the exported header

_WORKER = r"""
import sys, numpy as np
from tflite_micro.python.tflite_micro import runtime
model_path, inputs_path, outputs_path, arena, n_outputs = sys.argv[1:6]
data = open(model_path, "rb").read()
it = runtime.Interpreter.from_bytes(data, arena_size=int(arena))
inputs = np.load(inputs_path)
for i in range(len(inputs.files)):
    it.set_input(inputs[f"arr_{i}"], i)
it.invoke()
outputs = [np.array(it.get_output(i)) for i in range(int(n_outputs))]
np.savez(outputs_path, *outputs)
sys.stdout.flush()
it.print_allocations()
"""


class MicroError(RuntimeError):
    """TFLM could not load or run the model; the message holds its log."""


@dataclass
class MicroResult:
    outputs: list[np.ndarray]
    arena_bytes: int  # measured by TFLM's recording allocator (host, 64-bit)


def micro_unavailable() -> str | None:
    try:
        import tflite_micro  # noqa: F401
    except ImportError:
        return "tflite-micro is not installed (pip install tflite-micro; it is in the dev extra)"
    return None


def run_micro(model_content: bytes, inputs, *, arena_size: int | None = None, timeout: float = 300) -> MicroResult:
    """Run the model once in TFLM on `inputs` (numpy, in order); returns its outputs and
    the arena it used. With the default (generous) arena it runs in this process; with an
    explicit `arena_size` in a child process, since TFLM aborts the process when the
    arena is too small. Raises MicroError with TFLM's log."""
    why = micro_unavailable()
    if why:
        raise MicroError(why)
    inputs = [np.asarray(x) for x in inputs]
    if arena_size is None:
        return _run_here(bytes(model_content), inputs)
    return _run_isolated(bytes(model_content), inputs, int(arena_size), timeout)


def _run_here(content: bytes, inputs: list[np.ndarray]) -> MicroResult:
    from tflite_micro.python.tflite_micro import runtime

    n_outputs = len(_signature_io(content)[1])
    try:
        interpreter = runtime.Interpreter.from_bytes(content, arena_size=HOST_ARENA)
        for i, x in enumerate(inputs):
            interpreter.set_input(x, i)
        interpreter.invoke()
    except RuntimeError as e:
        raise MicroError(
            f"TFLM failed: {e} (run the model through runtimes.check(..., 'micro') "
            "for the ops and tensors it cannot take)"
        ) from e
    outputs = [np.array(interpreter.get_output(i)) for i in range(n_outputs)]
    # The allocation report goes to the C stderr: catch file descriptor 2.
    with captured_c_stderr() as report:
        interpreter.print_allocations()
    return MicroResult(outputs, _arena_total(report.decode(errors="replace")))


def _arena_total(log: str) -> int:
    found = re.search(r"Arena allocation total (\d+) bytes", log)
    if not found:
        raise MicroError(f"TFLM ran but printed no arena report:\n{log[-2000:]}")
    return int(found.group(1))


def _run_isolated(content: bytes, inputs: list[np.ndarray], arena_size: int, timeout: float) -> MicroResult:
    with tempfile.TemporaryDirectory(prefix="litert_micro_") as tmp:
        model_path = os.path.join(tmp, "model.tflite")
        with open(model_path, "wb") as f:
            f.write(content)
        np.savez(os.path.join(tmp, "inputs.npz"), *inputs)
        out_path = os.path.join(tmp, "outputs.npz")
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                _WORKER,
                model_path,
                os.path.join(tmp, "inputs.npz"),
                out_path,
                str(arena_size),
                str(len(_signature_io(content)[1])),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0 or not os.path.isfile(out_path):
            raise MicroError(
                f"TFLM failed (exit code {proc.returncode}) with arena {arena_size:,} bytes:\n{log[-4000:]}"
            )
        with np.load(out_path) as saved:
            outputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return MicroResult(outputs, _arena_total(log))


def measure_arena(model_content: bytes, inputs=None) -> int:
    """The tensor arena the model needs, in bytes, measured by running it once in TFLM
    (zeros of the input shapes when `inputs` is None) and confirmed by a second run with
    exactly that arena plus ARENA_MARGIN."""
    if inputs is None:
        inputs = zero_inputs(model_content)
    measured = run_micro(model_content, inputs).arena_bytes
    size = _round_up(measured + ARENA_MARGIN, 16)
    run_micro(model_content, inputs, arena_size=size)  # raises if it does not fit
    return size


def _signature_io(model_content: bytes):
    from runtimes.targets.model_view import read_model

    sg = read_model(model_content).subgraphs[0]  # TFLM runs subgraph 0
    return sg.inputs, sg.outputs


def zero_inputs(model_content: bytes) -> list[np.ndarray]:
    return [np.zeros(t.shape, dtype=np.dtype(t.dtype)) for t in _signature_io(model_content)[0]]


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


# ---------------------------------------------------------------------------------- C export

# TFLM resolver method names that plain CamelCase of the builtin name gets wrong.
_RESOLVER_NAMES = {
    "PADV2": "PadV2",
    "BATCH_MATMUL": "BatchMatMul",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTM",
}


def resolver_method(opcode: str) -> str:
    """`MicroMutableOpResolver` method registering `opcode` ("CONV_2D" -> "AddConv2D")."""
    return "Add" + _RESOLVER_NAMES.get(
        opcode, "".join(p.capitalize() if not p[0].isdigit() else p.upper() for p in opcode.split("_"))
    )


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit():
        ident = "model_" + ident
    return ident


def c_source(model_content: bytes, name: str, arena_bytes: int | None) -> tuple[str, str]:
    """(header, source) text for `model_content` as a C array named g_<name>_model."""
    from runtimes.targets.model_view import read_model

    ident = _identifier(name)
    data = bytes(model_content)
    ops = sorted({op.opcode for sg in read_model(data).subgraphs for op in sg.ops})
    camel = "".join(p.capitalize() for p in ident.split("_"))
    guard = f"{ident.upper()}_MODEL_H_"
    adds = "\n".join(
        f"  if (resolver.{resolver_method(op)}() != kTfLiteOk) return kTfLiteError;"
        for op in ops
        if not op.startswith("CUSTOM:")
    )
    arena_line = (
        f"// Tensor arena measured by running the model in the tflite-micro interpreter\n"
        f"// (64-bit host, plus {ARENA_MARGIN} bytes of headroom).\n"
        f"constexpr size_t k{camel}ArenaSize = {arena_bytes};\n"
        if arena_bytes
        else ""
    )
    header = f"""// Generated by litert-torch: the LiteRT model '{name}' for TensorFlow Lite Micro.
// {len(data):,} bytes; ops: {", ".join(ops)}.
#ifndef {guard}
#define {guard}

#include <cstddef>

extern const unsigned char g_{ident}_model[];
extern const unsigned int g_{ident}_model_len;

{arena_line}constexpr int k{camel}OpCount = {len(ops)};

#if __has_include("tensorflow/lite/micro/micro_mutable_op_resolver.h")
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
// Registers exactly the ops this model uses.
template <unsigned int N>
inline TfLiteStatus Register{camel}Ops(tflite::MicroMutableOpResolver<N>& resolver) {{
  static_assert(N >= k{camel}OpCount, "resolver too small for this model");
{adds}
  return kTfLiteOk;
}}
#endif

#endif  // {guard}
"""
    rows = []
    for i in range(0, len(data), 12):
        rows.append("  " + ", ".join(f"0x{b:02x}" for b in data[i : i + 12]) + ",")
    source = (
        f'#include "{ident}_model.h"\n\n'
        f"// 16-byte aligned: TFLM reads weights in place.\n"
        f"alignas(16) const unsigned char g_{ident}_model[] = {{\n" + "\n".join(rows) + "\n};\n"
        f"const unsigned int g_{ident}_model_len = {len(data)};\n"
    )
    return header, source


def export_c_source(
    model_content: bytes, name: str, out_dir: str, *, arena_bytes: int | None = None, measure: bool = True
) -> tuple[str, str]:
    """Write `<name>_model.h` and `<name>_model.cc` into `out_dir`. The arena size is
    measured in TFLM unless given (or `measure=False`). Returns the two paths."""
    if arena_bytes is None and measure:
        arena_bytes = measure_arena(model_content)
    header, source = c_source(model_content, name, arena_bytes)
    os.makedirs(out_dir, exist_ok=True)
    ident = _identifier(name)
    paths = (os.path.join(out_dir, f"{ident}_model.h"), os.path.join(out_dir, f"{ident}_model.cc"))
    write_atomic(paths[0], [header.encode()])
    write_atomic(paths[1], [source.encode()])
    return paths
