"""Run .tflite models in the LiteRT interpreter (`ai_edge_litert`), by signature.

A thin layer over `ai_edge_litert.interpreter.Interpreter`: XNNPACK is on by default
(the interpreter applies it unless told otherwise), `num_threads` is passed through, and
signatures are run with numpy inputs IN ORDER and return numpy outputs IN ORDER (the
interpreter's own runner takes and returns dicts keyed by name). Interpreters are created
and allocated under `without_xnnpack_notice`, so a run prints nothing of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    shape_signature: tuple[int, ...] | None = None

    def __str__(self) -> str:
        shape = self.shape_signature if self.shape_signature is not None else self.shape
        dims = ", ".join("?" if d < 0 else str(d) for d in shape)
        return f"{self.name}: {np.dtype(self.dtype).name}[{dims}]"

    __repr__ = __str__


@dataclass(frozen=True)
class Signature:
    key: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def __str__(self) -> str:
        """`serving_default(ids: int64[?, ?]) -> (output_0: float32[?, ?, 768])` (? is a dynamic dim)."""
        return f"{self.key}({', '.join(map(str, self.inputs))}) -> ({', '.join(map(str, self.outputs))})"

    __repr__ = __str__

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


_STDERR_LOCK = threading.RLock()  # file descriptor 2 is the process's: one capture at a time
_XNNPACK_NOTICE = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
_xnnpack_notice_seen = False


@contextlib.contextmanager
def captured_c_stderr():
    """Capture file descriptor 2 (where C++ libraries write, past `sys.stderr`) for the block;
    yields a bytearray that holds what was written once the block ends."""
    captured = bytearray()
    with _STDERR_LOCK, tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            captured.extend(log.read())


@contextlib.contextmanager
def without_xnnpack_notice():
    """Create and allocate interpreters in this block to drop LiteRT's `INFO: Created TensorFlow
    Lite XNNPACK delegate for CPU.`, which its C++ runtime writes to stderr once per process,
    at the first allocation with XNNPACK, with no setting to turn it off. Everything else
    written meanwhile (real errors) still reaches stderr, after the block. Once the notice
    has been dropped the block captures nothing."""
    global _xnnpack_notice_seen
    if _xnnpack_notice_seen:
        yield
        return
    try:
        with captured_c_stderr() as captured:
            yield
    finally:  # also when creation failed: its messages are the user's to see
        lines = bytes(captured).splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith(_XNNPACK_NOTICE)]
        _xnnpack_notice_seen = _xnnpack_notice_seen or len(kept) < len(lines)
        if kept:
            os.write(2, b"".join(kept))


def _signature_order(model_content: bytes) -> dict[str, dict[str, list[str]]]:
    """signature key -> {"inputs": [...], "outputs": [...]} in the file's order."""
    from ai_edge_litert import schema_py_generated as schema

    m = schema.Model.GetRootAsModel(bytes(model_content), 0)
    order = {}
    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        order[sd.SignatureKey().decode()] = {
            "inputs": [sd.Inputs(k).Name().decode() for k in range(sd.InputsLength())],
            "outputs": [sd.Outputs(k).Name().decode() for k in range(sd.OutputsLength())],
        }
    return order


class LiteRTModel:
    """One .tflite model loaded in the LiteRT interpreter."""

    def __init__(
        self,
        model_content: bytes,
        *,
        num_threads: int | None = None,
        use_xnnpack: bool = True,
        preserve_all_tensors: bool = False,
    ):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        from runtimes.verify import verify_model

        verify_model(model_content)  # some malformed files crash the interpreter (runtimes/verify.py)
        kwargs = {}
        if not use_xnnpack:
            kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self._runners: dict[str, object] = {}
        self._order = _signature_order(model_content)
        self._use_xnnpack = use_xnnpack
        with self._quiet():
            self._interpreter = Interpreter(
                model_content=bytes(model_content),
                num_threads=num_threads,
                experimental_preserve_all_tensors=preserve_all_tensors,
                **kwargs,
            )
            self.signatures: list[Signature] = [self._signature(key) for key in self._signature_keys()]

    @property
    def interpreter(self):
        return self._interpreter

    def _quiet(self):
        """Where this interpreter may allocate (XNNPACK is applied at its first allocation,
        in a runner's first call): without LiteRT's notice (`without_xnnpack_notice`)."""
        return without_xnnpack_notice() if self._use_xnnpack else contextlib.nullcontext()

    def _signature_keys(self) -> list[str]:
        keys = list(self._interpreter.get_signature_list())
        return [k for k in self._order if k in keys] + [k for k in keys if k not in self._order]

    def _runner(self, key: str):
        if key not in self._runners:
            self._runners[key] = self._interpreter.get_signature_runner(key)
        return self._runners[key]

    def _signature(self, key: str) -> Signature:
        runner = self._runner(key)
        # The interpreter lists names sorted; the file keeps the SignatureDef's own order.
        order = self._order.get(key) or self._interpreter.get_signature_list()[key]

        def specs(details: dict, names: list[str]) -> tuple[TensorSpec, ...]:
            out = []
            for name in names:
                d = details[name]
                sig = tuple(int(x) for x in d.get("shape_signature", d["shape"]))
                out.append(
                    TensorSpec(
                        name, tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]), sig if -1 in sig else None
                    )
                )
            return tuple(out)

        inputs = specs(runner.get_input_details(), order["inputs"])
        outputs = specs(runner.get_output_details(), order["outputs"])
        return Signature(key, inputs, outputs)

    def signature(self, key: str | None = None) -> Signature:
        """The signature named `key` (the only one when `key` is None)."""
        if key is None:
            if len(self.signatures) != 1:
                raise ValueError(
                    f"the model has {len(self.signatures)} signatures "
                    f"({[s.key for s in self.signatures]}); pass signature_name="
                )
            return self.signatures[0]
        for s in self.signatures:
            if s.key == key:
                return s
        raise KeyError(f"no signature named {key!r}; the model has {[s.key for s in self.signatures]}")

    def run(self, inputs, signature_key: str | None = None) -> list[np.ndarray]:
        """Run a signature with numpy `inputs` in the signature's input order; returns
        its outputs, as numpy arrays, in its output order."""
        sig = self.signature(signature_key)
        inputs = list(inputs)
        if len(inputs) != len(sig.inputs):
            raise ValueError(
                f"signature '{sig.key}' takes {len(sig.inputs)} input(s) "
                f"({', '.join(map(str, sig.inputs))}), got {len(inputs)}"
            )
        feed = {}
        for spec, value in zip(sig.inputs, inputs):
            array = _input_array(spec, value)
            _check_shape(spec, array.shape)
            feed[spec.name] = np.ascontiguousarray(array)  # the runner resizes dynamic inputs
        with self._quiet():  # a no-op once the notice has been dropped
            results = self._runner(sig.key)(**feed)
        return [np.asarray(results[spec.name]) for spec in sig.outputs]


def _input_array(spec, value) -> np.ndarray:
    """`value` in the input's dtype. Casts that keep every value are made, as PyTorch's own
    model would take the input: int64 token ids to the int32 the converter narrowed them to
    (checked to fit), float64 to float32 (rounded, like `torch.from_numpy(x).float()`; the
    documented cast). Integers into a floating-point input are refused, as PyTorch's model
    refuses them, and floats into an integer one."""
    array = np.asarray(value)
    want, got = spec.dtype, array.dtype
    if got == want:
        return array
    if (want.kind == "f" and got.kind in "iub") or not np.can_cast(got, want, casting="same_kind"):
        raise TypeError(f"input '{spec.name}' expects {want.name}, got {got.name}")
    if want.kind in "iu" and array.size:
        low, high = np.iinfo(want).min, np.iinfo(want).max
        if array.min() < low or array.max() > high:
            bad = array.min() if array.min() < low else array.max()
            raise ValueError(
                f"input '{spec.name}' holds {bad}, outside the {want.name} range the converted model takes "
                f"({low} to {high})"
            )
    return array.astype(want)


class CalibrationRunner:
    """The float model in LiteRT's builtin kernels (no XNNPACK), every intermediate kept:
    what `converter.quantize` calibrates with (`litert_torch.quantize.calibration_runner`)."""

    def __init__(self, model_content: bytes):
        self._model = LiteRTModel(model_content, use_xnnpack=False, preserve_all_tensors=True)

    def run(self, inputs, signature: str):
        return self._model.run(inputs, signature)

    def get_tensor(self, index: int, subgraph: int):
        return self._model.interpreter.get_tensor(index, subgraph)


class PrepareError(RuntimeError):
    """LiteRT refused to prepare (allocate) a model. `subgraph`/`node` locate the refused
    op in the file (None when the runtime did not say), `opcode` names it."""

    def __init__(self, message: str, subgraph: int | None, node: int | None, opcode: str | None):
        super().__init__(message)
        self.subgraph, self.node, self.opcode = subgraph, node, opcode


_FAILED_NODE = re.compile(r"Node number (\d+) \((\w+)\) failed to prepare")


def _prepare_all(model_content: bytes, use_xnnpack: bool) -> list[tuple[int, int, tuple, tuple]]:
    """Create the interpreter and allocate every signature's subgraph (raises PrepareError).

    Returns the tensors whose shape stored in the file differs from the shape the kernels
    computed while preparing: (subgraph, node that writes it or -1, stored, computed). The
    builtin kernels recompute every shape and accept such a file; the XNNPACK delegate
    trusts some stored shapes (RESHAPE's output) and may not."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kwargs = {} if use_xnnpack else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    subgraph = None
    mismatches = []
    try:
        with without_xnnpack_notice():  # (only the XNNPACK pass applies it)
            interpreter = Interpreter(model_content=model_content, num_threads=1, **kwargs)
            wrapper = interpreter._interpreter  # allocation by subgraph index has no public API
            for key in interpreter.get_signature_list() or [None]:
                subgraph = 0 if key is None else wrapper.GetSubgraphIndexFromSignature(key)
                stored = [_tensor_shape(wrapper, i, subgraph) for i in range(wrapper.NumTensors(subgraph))]
                wrapper.AllocateTensors(subgraph)
                changed = [i for i, shape in enumerate(stored) if _tensor_shape(wrapper, i, subgraph) != shape]
                if changed and subgraph == 0:
                    writers = {t: n for n in range(wrapper.NumNodes()) for t in wrapper.NodeOutputs(n)}
                for i in changed:
                    node = writers.get(i, -1) if subgraph == 0 else -1
                    mismatches.append((subgraph, node, stored[i], _tensor_shape(wrapper, i, subgraph)))
    except (RuntimeError, ValueError) as e:
        text = " ".join(str(e).split())
        found = _FAILED_NODE.search(text)
        raise PrepareError(
            text, subgraph, int(found.group(1)) if found else None, found.group(2) if found else None
        ) from e
    return mismatches


def _tensor_shape(wrapper, index: int, subgraph: int) -> tuple[int, ...] | None:
    """The tensor's current shape (None for one that has none, e.g. an omitted input)."""
    try:
        return tuple(wrapper.TensorSize(index, subgraph).tolist())  # (per element: 3x slower)
    except ValueError:
        return None


def prepare_model(model_content: bytes, *, verify: bool = True) -> None:
    """Check that LiteRT can load and prepare `model_content`: every signature's tensors
    allocated as a user's interpreter would. No inputs are fed and nothing runs.

    The builtin kernels go first: they name the op they refuse, and they recompute every
    tensor's shape. When each computed shape equals the one stored in the file, the
    XNNPACK delegate (the default) sees the same shapes, and its preparation, which packs
    every weight (0.3 s on ResNet-50, half of a torch.export), is skipped. Otherwise
    XNNPACK prepares too, because it trusts stored shapes the builtin kernels recompute
    (RESHAPE's output), and its refusal is the error.
    Raises PrepareError locating the op that failed.

    `verify=False` skips `runtimes.verify` (most of this check's time on small models), for
    files our writer just wrote: `converter.writer` builds every offset and index itself
    and its `validate` refuses each IR that would write what the verifier refuses."""
    if verify:
        from runtimes.verify import verify_model

        verify_model(model_content)  # some malformed files crash the interpreter instead of raising
    mismatches = _prepare_all(model_content, use_xnnpack=False)
    if not mismatches:
        return
    try:
        _prepare_all(model_content, use_xnnpack=True)
    except PrepareError as delegated:
        subgraph, node, stored, computed = mismatches[0]
        raise PrepareError(
            f"the XNNPACK delegate refused the model (the builtin kernels accept it): {delegated}; "
            f"the first tensor whose stored shape {list(stored)} differs from the computed "
            f"{list(computed)} is written by node {node}",
            subgraph,
            None if node < 0 else node,
            None,
        ) from delegated


def _check_shape(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    """An input must match the model's shape except where its signature says -1 (dynamic):
    LiteRT would otherwise resize a static dim and fail (or compute garbage) deep inside a kernel."""
    expected = spec.shape_signature if spec.shape_signature is not None else spec.shape
    if len(shape) != len(expected) or any(e != -1 and e != d for e, d in zip(expected, shape)):
        dims = ", ".join("?" if e == -1 else str(e) for e in expected)
        hint = (
            " (only the ? dims may change)"
            if -1 in expected
            else "; the model has static shapes: convert with dynamic_shapes= (torch.export.Dim) to vary them"
        )
        raise ValueError(f"input '{spec.name}' has shape {tuple(shape)}, the model expects [{dims}]{hint}")


def max_relative_error(actual, expected) -> float:
    """The project's one error metric: max|actual - expected| / max(max|expected|, 1e-12).

    The worst absolute difference scaled by the reference's largest magnitude (element-wise
    ratios blow up near zero)."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if not b.size:
        return 0.0
    return float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-12)
