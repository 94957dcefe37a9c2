"""EdgeModel: a converted .tflite model in memory, callable through LiteRT."""

from __future__ import annotations

import os

import numpy as np

from common.files import check_output_path, write_atomic
from runtimes.litert import LiteRTModel, Signature
from runtimes.verify import verify_model

TFLITE_IDENTIFIER = b"TFL3"


def _to_numpy(value) -> np.ndarray:
    try:
        import torch

        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu")
            if t.dtype == torch.bfloat16:
                t = t.float()
            return t.numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return np.asarray(value)


def _flatten_inputs(args) -> list:
    """Flatten nested lists/tuples/dicts of inputs in the order torch.export flattens them,
    keeping tensors and arrays (plain numbers are specialized into the graph)."""
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(args)
    return [x for x in leaves if isinstance(x, (torch.Tensor, np.ndarray))]


class EdgeModel:
    """A LiteRT model: its bytes, its signatures, and a call that runs it.

    `model(*args)` takes torch tensors or numpy arrays in the signature's input order
    and returns numpy: one array for one output, a tuple otherwise. With several
    signatures, `signature_name` (here or per call) says which one runs.
    """

    def __init__(
        self,
        model_content: bytes,
        *,
        num_threads: int | None = None,
        signature_name: str | None = None,
        _verified: bool = False,
    ):
        # A converter.writer.ModelParts (the writer's pieces: a model with weights after
        # the flatbuffer is kept as views of those weights, joined only when needed).
        from_writer = hasattr(model_content, "pieces")
        pieces = list(model_content.pieces if from_writer else [model_content])
        head = pieces[0]
        if bytes(head[4:8]) != TFLITE_IDENTIFIER:
            raise ValueError("these bytes are not a LiteRT/TFLite model (no 'TFL3' file identifier)")
        # Offsets and indices are checked before the interpreter sees the bytes (some
        # malformed files crash it): raises runtimes.verify.InvalidModelError (a ValueError).
        # `_verified`: convert() has just checked and prepared these very bytes.
        if not _verified:
            verify_model(head, "this model", size=sum(len(p) for p in pieces))
        # anything else is copied: a caller's bytearray could change after verification
        self._pieces = [head if from_writer or isinstance(head, bytes) else bytes(head)] + pieces[1:]
        self._num_threads = num_threads
        self._runtime: LiteRTModel | None = None
        self.ir_model = None  # the converter's IR, when this model came from convert()
        self.timings: dict[str, float] = {}  # convert()'s stages: wall seconds
        self.cpu_timings: dict[str, float] = {}  # ... and process CPU seconds
        self.target_report = None  # runtimes.targets report, when converted with target=
        self.quant_report = None  # converter.quantize.QuantReport: ops a full-integer scheme left float
        self.signature_name = signature_name  # the default signature of calls (checked on set)

    # ---- inspection -------------------------------------------------------------------
    @property
    def runtime(self) -> LiteRTModel:
        """The LiteRT interpreter, created on first use."""
        if self._runtime is None:
            self._runtime = LiteRTModel(self.model_content(), num_threads=self._num_threads)
        return self._runtime

    @property
    def signature_name(self) -> str | None:
        """The signature that calls without `signature_name=` run (None: the only one)."""
        return self._signature_name

    @signature_name.setter
    def signature_name(self, name: str | None) -> None:
        if name is not None:
            self.runtime.signature(name)  # raises KeyError naming the model's signatures
        self._signature_name = name

    @property
    def signatures(self) -> list[Signature]:
        """Signatures with input/output names, shapes (-1 = dynamic) and dtypes."""
        return list(self.runtime.signatures)

    def model_content(self) -> bytes:
        """The .tflite bytes. For a model whose weights live after the flatbuffer (over
        2 GB) this joins them into one new bytes object: `export` does not need to."""
        if len(self._pieces) > 1:
            return b"".join(self._pieces)
        if not isinstance(self._pieces[0], bytes):  # the writer's view: become bytes once
            self._pieces[0] = bytes(self._pieces[0])
        return self._pieces[0]

    def __len__(self) -> int:
        return sum(len(p) for p in self._pieces)

    def __repr__(self) -> str:
        sigs = "; ".join(map(str, self.signatures))
        return f"EdgeModel({len(self):,} bytes; {sigs})"

    # ---- running ------------------------------------------------------------------------
    def __call__(self, *args, signature_name: str | None = None, **kwargs):
        """Run the model. Positional inputs fill the signature's inputs in order (nested
        lists/tuples are flattened as torch.export flattens them); keyword inputs are
        matched by name (the forward() argument names)."""
        if signature_name is None:
            signature_name = self._signature_name
        inputs = [_to_numpy(x) for x in _flatten_inputs(args)]
        if kwargs:
            sig = self.runtime.signature(signature_name)
            names = sig.input_names[len(inputs) :]
            flat_kwargs = {}
            for key, value in kwargs.items():
                leaves = _flatten_inputs(value)
                if len(leaves) == 1:
                    flat_kwargs[key] = leaves[0]
                else:  # a nested keyword input: torch.export names its leaves key_0, key_1...
                    flat_kwargs.update({f"{key}_{i}": leaf for i, leaf in enumerate(leaves)})
            unknown = sorted(set(flat_kwargs) - set(names))
            if unknown:
                raise TypeError(
                    f"unexpected keyword input(s) {unknown}; the remaining inputs of signature '{sig.key}' are {names}"
                )
            missing = [n for n in names if n not in flat_kwargs]
            if missing:
                raise TypeError(f"missing input(s) {missing} for signature '{sig.key}'")
            inputs += [_to_numpy(flat_kwargs[n]) for n in names]
        outputs = self.runtime.run(inputs, signature_name)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # ---- saving -------------------------------------------------------------------------
    def export(self, path: str | os.PathLike) -> str:
        """Write the .tflite file atomically: the bytes go to a hidden temporary file in
        the same folder, are flushed to disk, then `os.replace` it over `path`. A reader
        never sees a partial `path`; a failure (disk full, an exception, Ctrl-C) leaves
        nothing behind. (A process killed outright can leave its hidden
        `.litert_torch-*.tflite.tmp`, never a partial `path`.) The file's mode follows the
        umask (`common.files.write_atomic`)."""
        path = os.fspath(path)
        check_output_path(path)
        # weights after the flatbuffer are written from their own memory
        write_atomic(path, self._pieces, prefix=".litert_torch-", suffix=".tflite.tmp")
        return path


def load(path: str | os.PathLike, *, num_threads: int | None = None, signature_name: str | None = None) -> EdgeModel:
    """Load a .tflite file as an EdgeModel (`signature_name`: the default signature of calls)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such .tflite file: {path}")
    with open(path, "rb") as f:
        content = f.read()
    if len(content) < 8 or content[4:8] != TFLITE_IDENTIFIER:
        raise ValueError(
            f"{path} is not a LiteRT/TFLite model (its bytes 4-8 are {content[4:8]!r}, expected {TFLITE_IDENTIFIER!r})"
        )
    verify_model(content, path)  # names the file in the error
    return EdgeModel(content, num_threads=num_threads, signature_name=signature_name)
