"""The compiled dispatch path: a small C++ extension for what needs no Python per op.

`_tpu_native.cpp` holds the device guard, the view kernels (`as_strided`, `view`,
`_reshape_alias`, `unfold`) and `flatten_args` (an op's arguments -> dynamic JAX values
and static template, the common cases; the rest calls back into
`tpu_backend/eager/arguments.py`), and each table op's PrivateUse1 kernel: a call the
op's Python kernel (registered behind it, on PrivateUse2) has already run is run in C++,
straight into the op's jitted lowering (strict) or `fused.record` (fused), results
wrapped into tensors there; fused mode's `record` itself (`fused_record`, the steps
of `fused.python_record`); and a compiled graph's input read (`whole_arrays`, the steps
of `compile.compiled_graph.python_read_inputs`: a decode step reads ~245 inputs). The
lowerings, the payload table and fused mode's sync point stay in Python: the one
`Lowering` record per op is still the single source of truth.

Built by `tools/setup.sh` (`python -m tpu_backend.native build`) with the compiler and
flags `torch.utils.cpp_extension` gives, into `tpu_backend/native/build/`, one file per
(source, torch, Python) so that a stale build is never loaded. `import tpu_backend` loads
it when it is there; otherwise, or with `TPU_NATIVE=0`, the pure-Python path runs (the
same semantics, more C++ -> Python crossings) and says so once. `TPU_NATIVE=build`
builds it at import when missing (about a minute).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import warnings

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tpu_native.cpp")
# TPU_NATIVE_BUILD_DIR: another folder for the build (a CI cache, a read-only checkout)
BUILD_DIR = os.environ.get("TPU_NATIVE_BUILD_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "build")
MODULE_NAME = "tpu_backend.native._tpu_native"

module = None  # the loaded extension, or None on the Python path
reason = "not loaded yet"  # why the Python path runs (for `status()`)
_tried = False


def _fingerprint() -> str:
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(f"{torch.__version__}|{sys.version}|{sys.platform}".encode())
    return digest.hexdigest()[:16]


def library_path() -> str:
    """Where the build for this source, torch and Python lives."""
    return os.path.join(BUILD_DIR, f"_tpu_native_{_fingerprint()}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}")


def compile_command(output: str) -> list[str]:
    from torch.utils import cpp_extension

    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libraries = cpp_extension.library_paths()
    compiler = os.environ.get("CXX", "c++")
    return [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        "-std=c++17",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *[f"-I{path}" for path in includes],
        SOURCE,
        "-o",
        output,
        *[f"-L{path}" for path in libraries],
        *[f"-Wl,-rpath,{path}" for path in libraries],
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
    ]


def build(verbose: bool = True) -> str:
    """Compile the extension for this torch and Python (if not already built); returns its path."""
    output = library_path()
    if os.path.exists(output):
        return output
    os.makedirs(BUILD_DIR, exist_ok=True)
    partial = f"{output}.{os.getpid()}.tmp"
    command = compile_command(partial)
    if verbose:
        print(f"tpu_backend.native: building {os.path.basename(output)}", file=sys.stderr)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise RuntimeError(f"no C++ compiler ({command[0]}): install g++ or set CXX") from error
    if done.returncode != 0:
        raise RuntimeError(f"building the tpu native extension failed:\n{' '.join(command)}\n{done.stderr[-4000:]}")
    os.replace(partial, output)  # atomic: a concurrent import never sees half a file
    for stale in os.listdir(BUILD_DIR):
        if stale.startswith("_tpu_native_") and os.path.join(BUILD_DIR, stale) != output:
            try:
                os.remove(os.path.join(BUILD_DIR, stale))
            except OSError:
                pass
    return output


def _load_library(path: str):
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, path)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    loaded = importlib.util.module_from_spec(spec)
    loader.exec_module(loaded)
    return loaded


def requested() -> bool:
    """Whether TPU_NATIVE asks for the compiled path (anything but 0/false/off/no)."""
    return os.environ.get("TPU_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def load():
    """The extension module, or None (the reason is kept in `reason` and said once)."""
    global module, reason, _tried
    if _tried:
        return module
    _tried = True
    if not requested():
        reason = "TPU_NATIVE=0"
        # asked for: said once at INFO level (a warning would be noise in every such run)
        logging.getLogger("tpu_backend").info("tpu_backend: TPU_NATIVE=0, using the pure-Python dispatch path")
        return None
    path = library_path()
    try:
        if not os.path.exists(path):
            if os.environ.get("TPU_NATIVE", "").strip().lower() != "build":
                raise FileNotFoundError(
                    "not built for this torch/Python (run tools/setup.sh, or python -m tpu_backend.native build)"
                )
            build()
        module = _load_library(path)
    except Exception as error:  # noqa: BLE001 - any failure means the Python path, said once
        reason = str(error).splitlines()[0]
        warnings.warn(
            f"tpu_backend: the compiled dispatch path is off ({reason}); using the pure-Python path "
            "(same results, more host time per op). TPU_NATIVE=0 silences this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    reason = ""
    return module


def install(what: str, installer: str):
    """Run the extension's `installer` (which registers `what` with PyTorch); returns the
    module, or None (no extension, or the installer failed: said once, and the caller
    keeps its Python version of `what`)."""
    compiled = load()
    if compiled is None:
        return None
    try:
        getattr(compiled, installer)()
    except Exception as error:  # noqa: BLE001 - e.g. a torch whose schemas moved: the Python path still works
        warnings.warn(
            f"tpu_backend: the compiled {what} could not be installed ({error}); using the Python one",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return compiled


def status() -> str:
    """'native' or 'python (<why>)': which dispatch path this process runs."""
    return "native" if module is not None else f"python ({reason})"
