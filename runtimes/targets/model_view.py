"""A plain, read-only view of any .tflite file: subgraphs, ops, tensors, signatures.

The target checks read this view, never our converter's IR, so they judge any LiteRT
model (ours, the reference converter's, TensorFlow's) by the bytes that ship. It reads
the flatbuffer lazily with the schema module that ships in `ai-edge-litert`; constant
data is never copied (only its size and file offset are noted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Option fields whose integers name enum members; the view gives the member's name.
_ENUM_FIELDS = {
    "fusedActivationFunction": "ActivationFunctionType",
    "padding": "Padding",
    "weightsFormat": "FullyConnectedOptionsWeightsFormat",
}


@dataclass
class TensorView:
    index: int
    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: str  # lower-case schema name: "float32", "int8", "int64" ...
    is_const: bool
    is_variable: bool
    quantized: bool
    scales: int  # how many quantization scales (1: per-tensor, >1: per-channel)
    data_offset: int | None  # where the constant bytes start in the file (None: no data)
    data_size: int
    buffer: int = 0  # index into the model's buffers (0: the empty sentinel)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for d in self.shape_signature)

    def describe(self) -> str:
        dims = ", ".join("?" if d < 0 else str(d) for d in self.shape_signature)
        return f"tensor '{self.name}' {self.dtype}[{dims}]"


@dataclass
class OpView:
    index: int
    opcode: str  # builtin name ("CONV_2D"), or "CUSTOM:<name>"
    version: int
    inputs: list[TensorView | None]
    outputs: list[TensorView]
    options: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"op #{self.index} {self.opcode}"


@dataclass
class SubgraphView:
    index: int
    name: str
    tensors: list[TensorView]
    ops: list[OpView]
    inputs: list[TensorView]
    outputs: list[TensorView]


@dataclass
class SignatureView:
    key: str
    subgraph: int
    inputs: list[tuple[str, TensorView]]  # (the user's name, the tensor)
    outputs: list[tuple[str, TensorView]]


@dataclass
class ModelView:
    subgraphs: list[SubgraphView]
    signatures: dict[str, int]  # signature key -> subgraph index
    file_size: int
    constant_bytes: int
    uses_external_buffers: bool  # data stored after the flatbuffer (files over 2 GB)
    buffer_sizes: list[int] = field(default_factory=list)  # bytes of data per buffer
    signature_defs: list[SignatureView] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)  # short entries as text, others "<n> bytes"
    description: str = ""


def _options(schema, op) -> dict:
    from common.tflite_schema import enum_names

    kind = op.BuiltinOptionsType()
    if not kind or op.BuiltinOptions() is None:
        return {}
    obj = schema.BuiltinOptionsCreator(kind, op.BuiltinOptions())
    options = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    for key, enum_name in _ENUM_FIELDS.items():
        if key in options and hasattr(schema, enum_name):
            options[key] = enum_names(enum_name).get(options[key], options[key])
    return options


def read_model(content: bytes | bytearray | memoryview, *, file_size: int | None = None) -> ModelView:
    """Parse .tflite bytes into a ModelView. Raises ValueError when they are not a LiteRT model.

    `content` may be the flatbuffer part alone of a file whose weights follow it (models
    over 2 GB); `file_size` is then the whole file's size (constant data is never read)."""
    from ai_edge_litert import schema_py_generated as schema

    from common.tflite_schema import TENSOR_TYPE_NAMES as type_names
    from common.tflite_schema import opcode_name

    content = content if isinstance(content, bytes) else bytes(content)
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise ValueError("not a LiteRT/TFLite model: the file identifier 'TFL3' is missing")
    m = schema.Model.GetRootAsModel(content, 0)
    buffers = _buffer_spans(m, content)

    opcodes = []
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        name = opcode_name(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        if name == "CUSTOM":
            name = f"CUSTOM:{(oc.CustomCode() or b'').decode()}"
        opcodes.append((name, oc.Version()))

    subgraphs = []
    for s in range(m.SubgraphsLength()):
        sg = m.Subgraphs(s)
        tensors = []
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
            offset, size, _ = buffers[t.Buffer()] if t.Buffer() < len(buffers) else (None, 0, False)
            q = t.Quantization()
            scales = q.ScaleLength() if q is not None else 0
            tensors.append(
                TensorView(
                    i,
                    (t.Name() or b"").decode(),
                    shape,
                    sig,
                    type_names.get(t.Type(), str(t.Type())).lower(),
                    is_const=size > 0,
                    is_variable=bool(t.IsVariable()),
                    quantized=scales > 0,
                    scales=scales,
                    data_offset=offset,
                    data_size=size,
                    buffer=t.Buffer(),
                )
            )

        def pick(indices, tensors=tensors):
            return [tensors[k] if k >= 0 else None for k in indices]

        ops = []
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            name, version = opcodes[op.OpcodeIndex()]
            ins = pick(op.InputsAsNumpy()) if op.InputsLength() else []
            outs = pick(op.OutputsAsNumpy()) if op.OutputsLength() else []
            ops.append(OpView(i, name, version, ins, [t for t in outs if t is not None], _options(schema, op)))
        inputs = pick(sg.InputsAsNumpy()) if sg.InputsLength() else []
        outputs = pick(sg.OutputsAsNumpy()) if sg.OutputsLength() else []
        subgraphs.append(
            SubgraphView(
                s,
                (sg.Name() or b"").decode() or f"subgraph{s}",
                tensors,
                ops,
                [t for t in inputs if t],
                [t for t in outputs if t],
            )
        )

    signatures, signature_defs = {}, []
    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        key, index = sd.SignatureKey().decode(), sd.SubgraphIndex()
        signatures[key] = index
        if index < len(subgraphs):
            subgraphs[index].name = key
            tensors = subgraphs[index].tensors

            def io(maps, n, tensors=tensors):
                return [(maps(k).Name().decode(), tensors[maps(k).TensorIndex()]) for k in range(n)]

            signature_defs.append(
                SignatureView(key, index, io(sd.Inputs, sd.InputsLength()), io(sd.Outputs, sd.OutputsLength()))
            )
    return ModelView(
        subgraphs,
        signatures,
        len(content) if file_size is None else file_size,
        constant_bytes=sum(size for _, size, _ in buffers),
        uses_external_buffers=any(ext for _, _, ext in buffers),
        buffer_sizes=[size for _, size, _ in buffers],
        signature_defs=signature_defs,
        metadata=_metadata(m, content, buffers),
        description=(m.Description() or b"").decode(),
    )


def _buffer_spans(m, content: bytes) -> list[tuple[int | None, int, bool]]:
    """(file offset or None, size, external) of each buffer of the parsed model `m`."""
    base = np.frombuffer(content, dtype=np.uint8).__array_interface__["data"][0]
    buffers = []
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        if b.DataLength():
            start = b.DataAsNumpy().__array_interface__["data"][0] - base
            buffers.append((start, b.DataLength(), False))
        elif b.Offset() > 1:
            buffers.append((int(b.Offset()), int(b.Size()), True))
        else:
            buffers.append((None, 0, False))
    return buffers


def metadata_entry(content: bytes, name: str) -> bytes | None:
    """The bytes of the metadata entry `name` of a whole .tflite file, or None."""
    from ai_edge_litert import schema_py_generated as schema

    content = content if isinstance(content, bytes) else bytes(content)
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise ValueError("not a LiteRT/TFLite model: the file identifier 'TFL3' is missing")
    m = schema.Model.GetRootAsModel(content, 0)
    buffers = _buffer_spans(m, content)
    for i in range(m.MetadataLength()):
        entry = m.Metadata(i)
        if entry.Name().decode() == name and entry.Buffer() < len(buffers):
            start, size, _ = buffers[entry.Buffer()]
            return b"" if start is None else content[start : start + size]
    return None


def _metadata(m, content: bytes, buffers) -> dict[str, str]:
    """Metadata entries: short ones (version strings) as text, longer ones by size."""
    out = {}
    for i in range(m.MetadataLength()):
        md = m.Metadata(i)
        start, size, _ = buffers[md.Buffer()] if md.Buffer() < len(buffers) else (None, 0, False)
        raw = content[start : start + size] if start is not None and size <= 64 else b""
        out[md.Name().decode()] = raw.rstrip(b"\0").decode(errors="replace") if size <= 64 else f"{size} bytes"
    return out
