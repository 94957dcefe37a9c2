"""EdgeModel: a converted .tflite model in memory, callable through LiteRT."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from runtimes.litert import LiteRTModel, Signature

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
    and returns numpy: one array for one output, a tuple otherwise.
    """

    def __init__(self, model_content: bytes, *, num_threads: int | None = None):
        if bytes(model_content[4:8]) != TFLITE_IDENTIFIER:
            raise ValueError("these bytes are not a LiteRT/TFLite model (no 'TFL3' file identifier)")
        self._content = bytes(model_content)
        self._num_threads = num_threads
        self._runtime: LiteRTModel | None = None
        self.ir_model = None  # the converter's IR, when this model came from convert()
        self.timings: dict[str, float] = {}
        self.target_report = None  # runtimes.targets report, when converted with target=

    # ---- inspection -------------------------------------------------------------------
    @property
    def runtime(self) -> LiteRTModel:
        """The LiteRT interpreter, created on first use."""
        if self._runtime is None:
            self._runtime = LiteRTModel(self._content, num_threads=self._num_threads)
        return self._runtime

    @property
    def signatures(self) -> list[Signature]:
        """Signatures with input/output names, shapes (-1 = dynamic) and dtypes."""
        return list(self.runtime.signatures)

    def model_content(self) -> bytes:
        return self._content

    def __len__(self) -> int:
        return len(self._content)

    def __repr__(self) -> str:
        sigs = "; ".join(
            f"{s.key}({', '.join(map(str, s.inputs))}) -> ({', '.join(map(str, s.outputs))})"
            for s in self.signatures)
        return f"EdgeModel({len(self._content):,} bytes; {sigs})"

    # ---- running ------------------------------------------------------------------------
    def __call__(self, *args, signature_name: str | None = None, **kwargs):
        """Run the model. Positional inputs fill the signature's inputs in order (nested
        lists/tuples are flattened as torch.export flattens them); keyword inputs are
        matched by name (the forward() argument names)."""
        inputs = [_to_numpy(x) for x in _flatten_inputs(args)]
        if kwargs:
            sig = self.runtime.signature(signature_name)
            names = sig.input_names[len(inputs):]
            flat_kwargs = {}
            for key, value in kwargs.items():
                leaves = _flatten_inputs(value)
                if len(leaves) == 1:
                    flat_kwargs[key] = leaves[0]
                else:  # a nested keyword input: torch.export names its leaves key_0, key_1...
                    flat_kwargs.update({f"{key}_{i}": leaf for i, leaf in enumerate(leaves)})
            unknown = sorted(set(flat_kwargs) - set(names))
            if unknown:
                raise TypeError(f"unexpected keyword input(s) {unknown}; the remaining inputs of "
                                f"signature '{sig.key}' are {names}")
            missing = [n for n in names if n not in flat_kwargs]
            if missing:
                raise TypeError(f"missing input(s) {missing} for signature '{sig.key}'")
            inputs += [_to_numpy(flat_kwargs[n]) for n in names]
        outputs = self.runtime.run(inputs, signature_name)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # ---- saving -------------------------------------------------------------------------
    def export(self, path: str | os.PathLike) -> str:
        """Write the .tflite file atomically (a temporary file in the same folder, then
        `os.replace`): a reader never sees a partial file and a failure leaves nothing."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"cannot write {path}: folder {folder} does not exist (create it first)")
        fd, tmp = tempfile.mkstemp(prefix=".litert_torch-", suffix=".tflite.tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self._content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return path


def load(path: str | os.PathLike, *, num_threads: int | None = None) -> EdgeModel:
    """Load a .tflite file as an EdgeModel."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such .tflite file: {path}")
    with open(path, "rb") as f:
        content = f.read()
    if len(content) < 8 or content[4:8] != TFLITE_IDENTIFIER:
        raise ValueError(f"{path} is not a LiteRT/TFLite model (its bytes 4-8 are {content[4:8]!r}, "
                         f"expected {TFLITE_IDENTIFIER!r})")
    return EdgeModel(content, num_threads=num_threads)
