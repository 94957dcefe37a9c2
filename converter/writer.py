"""Write an IR `Model` as a LiteRT (.tflite) flatbuffer.

Packs each table with the `flatbuffers` builder and the field functions of the schema
module shipped in ai-edge-litert (`schema_py_generated`; its object API only for op
options and quantization), in the object API's order: the same bytes as building a
`ModelT` tree and packing it, without the tree. What this module guarantees, beyond
the schema:

- file identifier `TFL3`, model version 3, buffer 0 the empty sentinel;
- both op-code fields set (`deprecated_builtin_code = min(code, 127)`), so ops numbered
  127 and above (GELU...) resolve;
- each op stamped with its MINIMUM version (`converter.op_versions`), and the model's
  `min_runtime_version` metadata (16 bytes, NUL padded) derived from them;
- constant data 16-byte aligned inside the file (the Python builder aligns byte vectors to
  1; XNNPACK's mmap paths and microcontrollers expect 16);
- every constant is written once, straight into the file's bytes: the flatbuffer is
  packed with each buffer's data only reserved, then one `bytes` object of the file's
  size is filled: the structure between the buffers copied, each array copied and each
  `ir.LazyConstant` (a transposed and/or batch-norm-scaled weight) computed in place;
- constants with identical dtype, shape and bytes share ONE buffer (found without
  computing lazy weights: a sample of their values, then a full comparison);
- one SignatureDef per graph with the user's input/output names;
- models whose constants do not fit the 2 GB flatbuffer limit keep `Buffer.data` empty
  and store bytes after the flatbuffer, referenced by `Buffer.offset/size` (16-byte
  aligned, 16 spare bytes at the end);
- a malformed IR raises `ConversionError` naming the graph, op and field, never an
  internal error from deep inside the builder.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import struct
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import flatbuffers
import flatbuffers.builder
import flatbuffers.packer
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from common.tflite_schema import BUILTIN_CODES, DTYPE_TYPE_CODES, MAX_TENSOR_BYTES, OPTIONAL_INPUT_OPS
from converter import ir
from converter.errors import ConversionError
from converter.op_versions import min_runtime_version, op_version
from converter.quantize.numerics import pack_int4

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
DATA_ALIGNMENT = 16
# Above this many bytes of constants, data moves out of the flatbuffer (which cannot
# exceed 2 GiB). The margin leaves room for the graph structure itself.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26

# ---- schema name tables --------------------------------------------------------------------

_BUILTIN_OPTIONS: dict[str, int] = {k: v for k, v in vars(schema.BuiltinOptions).items() if not k.startswith("_")}

# Ops whose options table is not named after the op.
_OPTIONS_EXCEPTIONS = {
    "MAX_POOL_2D": "Pool2DOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "LOCAL_RESPONSE_NORMALIZATION": "LocalResponseNormalizationOptions",
}
_OPTIONS_BY_FOLDED_NAME = {name.lower(): name for name in _BUILTIN_OPTIONS if name != "NONE"}


def options_table_name(opcode: str) -> str | None:
    """The BuiltinOptions member of `opcode` ("CONV_2D" -> "Conv2DOptions"), or None
    for ops without options (RELU, LOGISTIC, ...)."""
    if opcode in _OPTIONS_EXCEPTIONS:
        return _OPTIONS_EXCEPTIONS[opcode]
    folded = opcode.replace("_", "").lower() + "options"
    return _OPTIONS_BY_FOLDED_NAME.get(folded)


# Enum-valued option fields: string values ("SAME", "RELU") name members of these enums.
_FIELD_ENUMS = {
    "fusedActivationFunction": schema.ActivationFunctionType,
    "padding": schema.Padding,
    "mode": schema.MirrorPadMode,
    "weightsFormat": schema.FullyConnectedOptionsWeightsFormat,
    "kernelType": schema.LSTMKernelType,
    "combiner": schema.CombinerType,
    "outType": schema.TensorType,
    "outputType": schema.TensorType,
    "idxOutType": schema.TensorType,
    "inDataType": schema.TensorType,
    "outDataType": schema.TensorType,
    "quantizedBiasType": schema.TensorType,
}

TENSOR_TYPES = DTYPE_TYPE_CODES  # numpy dtype -> TensorType code


def _align(n: int, to: int = DATA_ALIGNMENT) -> int:
    return (n + to - 1) // to * to


# ---- buffers ---------------------------------------------------------------------------------


Payload = np.ndarray | ir.LazyConstant | bytes  # what a buffer holds until written into the file


def _payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else payload.nbytes


def _write_payload(out: np.ndarray, payload: Payload) -> None:
    """Put `payload`'s bytes into `out` (a uint8 slice of the file, 16-byte aligned)."""
    if isinstance(payload, bytes):
        out[:] = np.frombuffer(payload, np.uint8)
        return
    target = out.view(payload.dtype).reshape(payload.shape)
    if isinstance(payload, ir.LazyConstant):
        payload.write(target)  # computed here, once
    else:
        np.copyto(target, payload)


def _payload_bytes(payload: Payload) -> bytes | memoryview:
    """`payload` as bytes-like (external data: a lazy weight is computed into its own array)."""
    return payload if isinstance(payload, bytes) else ir.byte_view(ir.constant_values(payload))


class _Buffer:
    """One Buffer table: its payload (inside the flatbuffer) or, for external data, the
    offset and size of its bytes in the file."""

    __slots__ = ("payload", "offset", "size")

    def __init__(self, payload: Payload | None = None):
        self.payload, self.offset, self.size = payload, 0, 0


_UOFFSET, _SOFFSET = flatbuffers.packer.uoffset, flatbuffers.packer.soffset


class _Builder(flatbuffers.Builder):
    """A flatbuffers Builder over uninitialised memory that leaves weight data out.

    Its arena is `np.empty` (the stock Builder zero-fills a bytearray: every page of the
    weights touched once for nothing) and buffer data vectors are only reserved in it,
    their (offset from the end, payload) recorded in `payloads`; `_finish` then writes
    the structure around them and each payload into the file's bytes.
    `shared_vectors` holds the quantization vectors written so far, by content."""

    __slots__ = ("payloads", "shared_vectors", "_arena")

    def __init__(self, size: int):
        super().__init__(0)
        self._arena = np.empty(size, np.uint8)
        _advise_pages(self._arena.ctypes.data, size, huge=False)
        self.Bytes = memoryview(self._arena)  # slice assignment and struct.pack_into work on it
        self.head = size
        self.payloads: list[tuple[int, Payload]] = []
        self.shared_vectors: dict[tuple[str, bytes], int] = {}

    # The stock hot paths, minus the per-value `enforce_number` checks (struct.pack_into
    # still refuses an out-of-range value) and the growth loop while the arena has room:
    # packing is pure Python, and these are most of its time. Same bytes, same layout.

    def Prep(self, size, additionalBytes):
        head = self.head
        align = (head - len(self.Bytes) - additionalBytes) & (size - 1)
        if head < align + size + additionalBytes:
            return super().Prep(size, additionalBytes)  # grows the arena
        if size > self.minalign:
            self.minalign = size
        if align:
            self.Bytes[head - align : head] = bytes(align)
            self.head = head - align

    def Place(self, x, flags):
        self.head -= flags.bytewidth
        flags.packer_type.pack_into(self.Bytes, self.head, x)

    def Prepend(self, flags, off):
        self.Prep(flags.bytewidth, 0)
        self.head -= flags.bytewidth
        flags.packer_type.pack_into(self.Bytes, self.head, off)

    def PrependSlot(self, flags, o, x, d):
        if x != d or (self.forceDefaults and d is not None):
            self.Prepend(flags, x)
            self.current_vtable[o] = len(self.Bytes) - self.head

    def PrependUOffsetTRelativeSlot(self, o, x, d):
        if x != d or self.forceDefaults:
            self.PrependUOffsetTRelative(x)
            self.current_vtable[o] = len(self.Bytes) - self.head

    def StartVector(self, elemSize, numElems, alignment):
        self.nested = True
        self.vectorNumElems = numElems
        self.Prep(4, elemSize * numElems)
        self.Prep(alignment, elemSize * numElems)
        return len(self.Bytes) - self.head

    def EndVector(self):
        self.nested = False
        self.head -= 4
        _UOFFSET.pack_into(self.Bytes, self.head, self.vectorNumElems)
        return len(self.Bytes) - self.head

    def PrependUOffsetTRelative(self, off):
        self.Prep(4, 0)
        here = len(self.Bytes) - self.head
        if off > here:
            raise flatbuffers.builder.OffsetArithmeticError("flatbuffers: Offset arithmetic error.")
        self.head -= 4
        _UOFFSET.pack_into(self.Bytes, self.head, here - off + 4)

    def EndObject(self):
        """The stock EndObject/WriteVtable in one: the object's vtable (its size, the
        table's size, each field's offset, trailing unset fields dropped) written in one
        `pack_into`, or an equal earlier one reused."""
        self.nested = False
        self.Prep(4, 0)
        self.head -= 4  # the table's offset to its vtable, written below
        table = len(self.Bytes) - self.head
        fields = self.current_vtable
        n = len(fields)
        while n and not fields[n - 1]:
            n -= 1
        vtable = (4 + 2 * n, table - self.objectEnd, *[table - f if f else 0 for f in fields[:n]])
        found = self.vtables.get(vtable)
        if found is None:
            self.Prep(2, 2 * len(vtable))  # (never pads: the table ends 4-aligned)
            self.head -= 2 * len(vtable)
            struct.pack_into(f"<{len(vtable)}H", self.Bytes, self.head, *vtable)
            found = self.vtables[vtable] = len(self.Bytes) - self.head
        _SOFFSET.pack_into(self.Bytes, len(self.Bytes) - table, found - table)
        self.current_vtable = None
        return table

    def PlaceUOffsetT(self, x):
        self.head -= 4
        _UOFFSET.pack_into(self.Bytes, self.head, x)

    def PlaceSOffsetT(self, x):
        self.head -= 4
        _SOFFSET.pack_into(self.Bytes, self.head, x)


class _BufferTable:
    """Buffers of the model: index 0 is the empty sentinel; equal constants share one."""

    def __init__(self):
        self.buffers: list[_Buffer] = [_Buffer()]
        self.payloads: list[Payload | None] = [None]
        self._by_key: dict[tuple, list[int]] = {}

    def add_constant(self, constant: np.ndarray | ir.LazyConstant) -> int:
        """The buffer index holding `constant`: an existing one when an earlier constant
        has the same dtype, shape and bytes. Candidates are found by a cheap fingerprint
        (dtype, shape, a strided sample of the values) and then compared in full, so
        unique weights are never hashed (nor computed) and equality is exact."""
        key = (constant.dtype.str, tuple(constant.shape), ir.fingerprint(constant))
        for index in self._by_key.get(key, ()):
            if ir.same_bytes(self.payloads[index], constant):
                return index
        index = self.add_bytes(constant)
        self._by_key.setdefault(key, []).append(index)
        return index

    def add_bytes(self, payload: Payload) -> int:
        self.buffers.append(_Buffer(payload))
        self.payloads.append(payload)
        return len(self.buffers) - 1

    def add_empty(self) -> int:
        """A buffer for a non-constant tensor: TFLite accepts index 0 for all of them."""
        return 0

    @property
    def total_bytes(self) -> int:
        return sum(_payload_size(p) for p in self.payloads if p is not None)


# ---- validation -------------------------------------------------------------------------------


def _where(graph: ir.Graph, index: int, op: ir.Op) -> str:
    src = f" (from {op.source})" if op.source else ""
    return f"graph '{graph.name}', op #{index} {op.opcode}{src}"


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, ir.Tensor):
        raise ConversionError(f"{what} is {type(t).__name__}, expected an ir.Tensor")
    if t.dtype not in TENSOR_TYPES:
        raise ConversionError(
            f"{what}: tensor %{t.name} has dtype {t.dtype}, which TFLite cannot store; "
            f"supported: {', '.join(sorted(d.name for d in TENSOR_TYPES))}"
        )
    if any(d < 0 for d in t.shape):
        raise ConversionError(
            f"{what}: tensor %{t.name} has a negative dimension in its shape "
            f"{t.shape}; put -1 in shape_signature instead"
        )
    if t.shape_signature is not None and (
        len(t.shape_signature) != len(t.shape) or any(d < -1 for d in t.shape_signature)
    ):
        raise ConversionError(
            f"{what}: tensor %{t.name} has shape {t.shape} but shape_signature {t.shape_signature}: "
            "of another rank, or a dimension below -1 (-1 marks a dynamic one)"
        )
    if math.prod(t.shape) * t.dtype.itemsize > MAX_TENSOR_BYTES:
        raise ConversionError(f"{what}: tensor %{t.name} of shape {t.shape} is larger than any runtime can address")
    if t.quant is not None and not t.quant.block_size:
        _check_quantization(t, what)
    constant = t.constant
    if constant is not None:
        if not isinstance(constant, (np.ndarray, ir.LazyConstant)):
            raise ConversionError(f"{what}: constant %{t.name} holds {type(constant).__name__}, expected numpy")
        if constant.dtype != t.dtype or tuple(constant.shape) != t.shape:
            raise ConversionError(
                f"{what}: constant %{t.name} is declared {t.dtype.name}{list(t.shape)} but holds "
                f"{constant.dtype.name}{list(constant.shape)}"
            )


def _check_quantization(t: ir.Tensor, what: str) -> None:
    scales, zero_points = np.size(t.quant.scale), np.size(t.quant.zero_point)
    if scales > 1 and not (0 <= t.quant.axis < len(t.shape) and t.shape[t.quant.axis] == scales):
        raise ConversionError(
            f"{what}: tensor %{t.name} of shape {t.shape} has {scales} quantization scales along "
            f"axis {t.quant.axis}; per-channel scales need one per element of that axis"
        )
    if zero_points != scales:
        raise ConversionError(
            f"{what}: tensor %{t.name} has {scales} quantization scales but {zero_points} zero points"
        )


def validate(model: ir.Model) -> list[list[tuple[int, Any]]]:
    """Raise ConversionError naming the first malformed graph, op, tensor or option.
    Returns each op's (BuiltinOptions type, options table), by graph, for the writer."""
    if not model.graphs:
        raise ConversionError("the model has no graphs to write")
    keys = [g.name for g in model.graphs]
    if len(set(keys)) != len(keys):
        raise ConversionError(f"signature names must be unique, got {keys}")
    checked: set[int] = set()  # each tensor is checked where it is first seen

    def check(t: Any, what: str) -> None:
        if not (isinstance(t, ir.Tensor) and t.id in checked):
            _check_tensor(t, what)
            checked.add(t.id)

    options = []
    for graph in model.graphs:
        options.append([])
        available: set[int] = set()
        for i, t in enumerate(graph.inputs):
            check(t, f"graph '{graph.name}' input {i}")
            available.add(t.id)
        for n, names in (("input", graph.input_names), ("output", graph.output_names)):
            tensors = graph.inputs if n == "input" else graph.outputs
            if names and len(names) != len(tensors):
                raise ConversionError(f"graph '{graph.name}' has {len(tensors)} {n}s but {len(names)} {n}_names")
        for index, op in enumerate(graph.ops):
            where = _where(graph, index, op)
            if op.opcode not in BUILTIN_CODES:
                raise ConversionError(f"{where}: '{op.opcode}' is not a TFLite builtin operator")
            if not op.outputs:
                raise ConversionError(f"{where}: the op has no outputs")
            for k, t in enumerate(op.inputs):
                if t is None:
                    if k == 0 or op.opcode not in OPTIONAL_INPUT_OPS:  # its kernel would read tensor -1
                        raise ConversionError(f"{where}: input {k} is None (no tensor), which {op.opcode} cannot take")
                    continue
                check(t, f"{where}, input {k}")
                if not t.is_const and not t.is_variable and t.id not in available:
                    raise ConversionError(
                        f"{where}: input {k} %{t.name} is not a graph input, a constant or the "
                        f"output of an earlier op (ops must be in topological order)"
                    )
            for k, t in enumerate(op.outputs):
                check(t, f"{where}, output {k}")
                if t.is_const:
                    raise ConversionError(f"{where}: output {k} %{t.name} is a constant")
                available.add(t.id)
            options[-1].append(_build_options(op, where))  # raises on an unknown field or enum value
        for i, t in enumerate(graph.outputs):
            check(t, f"graph '{graph.name}' output {i}")
            if not t.is_const and t.id not in available:
                raise ConversionError(f"graph '{graph.name}' output {i} %{t.name} is never produced")
    return options


# ---- options -------------------------------------------------------------------------------


def _enum_value(field: str, value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    enum = _FIELD_ENUMS.get(field)
    if enum is None:
        raise ConversionError(f"{where}: option '{field}' got the string {value!r} but is not an enum field")
    try:
        return getattr(enum, value.upper())
    except AttributeError:
        members = [k for k in vars(enum) if not k.startswith("_")]
        raise ConversionError(f"{where}: option {field}={value!r} is not one of {members}") from None


def _build_options(op: ir.Op, where: str) -> tuple[int, Any]:
    """(BuiltinOptions type, options object or None) for `op`."""
    table = options_table_name(op.opcode)
    if table is None:
        if op.options:
            raise ConversionError(f"{where}: {op.opcode} takes no options, got {sorted(op.options)}")
        return schema.BuiltinOptions.NONE, None
    options = getattr(schema, table + "T")()
    fields = [k for k in vars(options)]
    for key, value in op.options.items():
        if key not in fields:
            raise ConversionError(f"{where}: {table} has no field '{key}'; fields: {fields}")
        value = _enum_value(key, value, where)
        if isinstance(value, (list, tuple, np.ndarray)):
            value = [_enum_value(key, v, where) for v in value]
        if isinstance(value, np.generic):
            value = value.item()
        setattr(options, key, value)
    return _BUILTIN_OPTIONS[table], options


# ---- model assembly ---------------------------------------------------------------------------


class _SharedQuantizationT(schema.QuantizationParametersT):
    """Quantization parameters whose scale and zero-point vectors are written once per
    distinct content and shared by offset (flatbuffers allow it). Per-channel weights
    repeat all-zero int64 zero points, 8 bytes per channel: as much as a 3x3 depthwise
    filter's int8 weights, about 5% of an int8 MobileNetV2 if each tensor had its own."""

    def Pack(self, builder):  # noqa: N802 (schema naming)
        shared = builder.shared_vectors

        def vector(values):
            values = np.ascontiguousarray(values)
            key = (values.dtype.str, values.tobytes())
            if key not in shared:
                shared[key] = builder.CreateNumpyVector(values)
            return shared[key]

        scale = vector(np.asarray(self.scale, np.float32)) if self.scale is not None else None
        zero_point = vector(np.asarray(self.zeroPoint, np.int64)) if self.zeroPoint is not None else None
        details = self.details.Pack(builder) if self.details is not None else None
        schema.QuantizationParametersStart(builder)
        if scale is not None:
            schema.QuantizationParametersAddScale(builder, scale)
        if zero_point is not None:
            schema.QuantizationParametersAddZeroPoint(builder, zero_point)
        schema.QuantizationParametersAddDetailsType(builder, self.detailsType)
        if details is not None:
            schema.QuantizationParametersAddDetails(builder, details)
        schema.QuantizationParametersAddQuantizedDimension(builder, self.quantizedDimension)
        return schema.QuantizationParametersEnd(builder)


def _quantization(q: ir.QuantParams | None, scales_index=None) -> schema.QuantizationParametersT | None:
    """The tensor's quantization table. Blockwise weights carry no scale/zeroPoint of their
    own: `BlockwiseQuantization` points at a float16 scales tensor (`scales_index`)."""
    if q is None:
        return None
    out = _SharedQuantizationT()
    if q.block_size:
        details = schema.BlockwiseQuantizationT()
        details.scales, details.zeroPoints, details.blockSize = scales_index, -1, int(q.block_size)
        out.detailsType = schema.QuantizationDetails.BlockwiseQuantization
        out.details = details
        return out
    out.scale = [float(s) for s in np.atleast_1d(q.scale)]
    out.zeroPoint = [int(z) for z in np.atleast_1d(q.zero_point)]
    out.quantizedDimension = int(q.axis)
    return out


# Each table is packed as the schema's object API (`TensorT.Pack` ...) packs it: children
# first, in the same order, then the fields; fields at their default value are left out
# (the builder would skip them). Same bytes, without building the object tree first.


def _int32_vector(b: _Builder, values) -> int:
    n = len(values)
    b.StartVector(4, n, 4)
    b.head -= 4 * n
    struct.pack_into(f"<{n}i", b.Bytes, b.head, *values)
    return b.EndVector()


def _offset_vector(b: _Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _pack_buffer(b: _Builder, buffer: _Buffer) -> int:
    """A Buffer whose data vector starts on a 16-byte boundary of the file, only reserved
    here (`_finish` writes the payload once, into the file's bytes). Flatbuffers are built
    back to front and the finished buffer's size is a multiple of the largest alignment
    used, so aligning the vector's start relative to the end aligns it in the file too."""
    n = 0 if buffer.payload is None else _payload_size(buffer.payload)
    if n:
        b.StartVector(1, n, DATA_ALIGNMENT)
        b.head -= n
        b.payloads.append((b.Offset(), buffer.payload))
        data = b.EndVector()
    schema.BufferStart(b)
    if n:
        schema.BufferAddData(b, data)
    schema.BufferAddOffset(b, buffer.offset)
    schema.BufferAddSize(b, buffer.size)
    return schema.BufferEnd(b)


class _TensorRow(NamedTuple):
    tensor: ir.Tensor
    type: int
    buffer: int
    quantization: schema.QuantizationParametersT | None


def _pack_tensor(b: _Builder, row: _TensorRow) -> int:
    t = row.tensor
    shape = _int32_vector(b, t.shape)
    name = b.CreateString(t.name)
    quantization = row.quantization.Pack(b) if row.quantization is not None else None
    signature = _int32_vector(b, t.shape_signature) if t.shape_signature is not None else None
    schema.TensorStart(b)
    schema.TensorAddShape(b, shape)
    schema.TensorAddType(b, row.type)
    schema.TensorAddBuffer(b, row.buffer)
    schema.TensorAddName(b, name)
    if quantization is not None:
        schema.TensorAddQuantization(b, quantization)
    if t.is_variable:
        schema.TensorAddIsVariable(b, True)
    if signature is not None:
        schema.TensorAddShapeSignature(b, signature)
    return schema.TensorEnd(b)


class _OperatorRow(NamedTuple):
    opcode_index: int
    inputs: list[int]
    outputs: list[int]
    options_type: int
    options: Any  # the options table (object API) or None


def _pack_operator(b: _Builder, row: _OperatorRow) -> int:
    inputs = _int32_vector(b, row.inputs)
    outputs = _int32_vector(b, row.outputs)
    options = row.options.Pack(b) if row.options is not None else None
    schema.OperatorStart(b)
    schema.OperatorAddOpcodeIndex(b, row.opcode_index)
    schema.OperatorAddInputs(b, inputs)
    schema.OperatorAddOutputs(b, outputs)
    schema.OperatorAddBuiltinOptionsType(b, row.options_type)
    if options is not None:
        schema.OperatorAddBuiltinOptions(b, options)
    return schema.OperatorEnd(b)


class _GraphRows(NamedTuple):
    """One graph's tables: its SubGraph and its SignatureDef."""

    name: str
    tensors: list[_TensorRow]
    inputs: list[int]
    outputs: list[int]
    operators: list[_OperatorRow]
    input_maps: list[tuple[str, int]]  # signature name, tensor index
    output_maps: list[tuple[str, int]]


def _pack_subgraph(b: _Builder, g: _GraphRows) -> int:
    tensors = _offset_vector(b, [_pack_tensor(b, row) for row in g.tensors])
    inputs = _int32_vector(b, g.inputs)
    outputs = _int32_vector(b, g.outputs)
    operators = _offset_vector(b, [_pack_operator(b, row) for row in g.operators])
    name = b.CreateString(g.name)
    schema.SubGraphStart(b)
    schema.SubGraphAddTensors(b, tensors)
    schema.SubGraphAddInputs(b, inputs)
    schema.SubGraphAddOutputs(b, outputs)
    schema.SubGraphAddOperators(b, operators)
    schema.SubGraphAddName(b, name)
    return schema.SubGraphEnd(b)


def _pack_tensor_map(b: _Builder, name: str, tensor_index: int) -> int:
    name = b.CreateString(name)
    schema.TensorMapStart(b)
    schema.TensorMapAddName(b, name)
    schema.TensorMapAddTensorIndex(b, tensor_index)
    return schema.TensorMapEnd(b)


def _pack_signature(b: _Builder, g: _GraphRows, subgraph_index: int) -> int:
    inputs = _offset_vector(b, [_pack_tensor_map(b, *m) for m in g.input_maps])
    outputs = _offset_vector(b, [_pack_tensor_map(b, *m) for m in g.output_maps])
    key = b.CreateString(g.name)
    schema.SignatureDefStart(b)
    schema.SignatureDefAddInputs(b, inputs)
    schema.SignatureDefAddOutputs(b, outputs)
    schema.SignatureDefAddSignatureKey(b, key)
    schema.SignatureDefAddSubgraphIndex(b, subgraph_index)
    return schema.SignatureDefEnd(b)


def _pack_operator_code(b: _Builder, code: int, version: int) -> int:
    schema.OperatorCodeStart(b)
    schema.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES))
    schema.OperatorCodeAddVersion(b, version)
    schema.OperatorCodeAddBuiltinCode(b, code)
    return schema.OperatorCodeEnd(b)


def _pack_metadata(b: _Builder, name: str, buffer: int) -> int:
    name = b.CreateString(name)
    schema.MetadataStart(b)
    schema.MetadataAddName(b, name)
    schema.MetadataAddBuffer(b, buffer)
    return schema.MetadataEnd(b)


class _ModelBuilder:
    """The model's tables, collected from the IR (tensor and buffer indices assigned,
    operator codes and versions chosen), then packed by `pack`."""

    def __init__(self, model: ir.Model, options: list[list[tuple[int, Any]]]):
        self.model = model
        self.buffers = _BufferTable()
        self.opcode_index: dict[tuple[int, int], int] = {}  # (builtin code, version) -> index
        self.used_versions: list[tuple[str, int]] = []
        self.graphs = [self._graph(graph, graph_options) for graph, graph_options in zip(model.graphs, options)]
        metadata = dict(model.metadata)
        runtime = min_runtime_version(self.used_versions)
        if runtime and "min_runtime_version" not in metadata:
            metadata["min_runtime_version"] = runtime.encode().ljust(16, b"\0")
        self.metadata = [(name, self.buffers.add_bytes(bytes(payload))) for name, payload in metadata.items()]

    def opcode(self, op: ir.Op) -> int:
        code = BUILTIN_CODES[op.opcode]
        version = op_version(op)
        key = (code, version)
        if key not in self.opcode_index:
            self.opcode_index[key] = len(self.opcode_index)
            self.used_versions.append((op.opcode, version))
        return self.opcode_index[key]

    def _graph(self, graph: ir.Graph, options: list[tuple[int, Any]]) -> _GraphRows:
        tensors: list[_TensorRow] = []
        index: dict[int, int] = {}

        def tensor_index(t: ir.Tensor) -> int:
            if t.id not in index:
                type_code = TENSOR_TYPES[t.dtype]
                if t.quant is not None and t.quant.int4 and t.is_const:  # int8 values in [-8, 7], two per byte
                    type_code = schema.TensorType.INT4
                    buffer = self.buffers.add_constant(pack_int4(t.data))
                else:
                    buffer = self.buffers.add_constant(t.constant) if t.is_const else self.buffers.add_empty()
                scales_index = None
                if t.quant is not None and t.quant.block_size:
                    scales = np.ascontiguousarray(t.quant.scale, dtype=np.float16)
                    scales_index = tensor_index(ir.Tensor(f"{t.name}_scales", scales.shape, scales.dtype, data=scales))
                index[t.id] = len(tensors)
                tensors.append(_TensorRow(t, type_code, buffer, _quantization(t.quant, scales_index)))
            return index[t.id]

        inputs = [tensor_index(t) for t in graph.inputs]
        operators = [
            _OperatorRow(
                self.opcode(op),
                [-1 if t is None else tensor_index(t) for t in op.inputs],
                [tensor_index(t) for t in op.outputs],
                *op_options,
            )
            for op, op_options in zip(graph.ops, options)
        ]
        outputs = [tensor_index(t) for t in graph.outputs]

        def maps(names: list[str], tensors: list[ir.Tensor]) -> list[tuple[str, int]]:
            return list(zip(names or [t.name for t in tensors], [index[t.id] for t in tensors]))

        return _GraphRows(
            graph.name,
            tensors,
            inputs,
            outputs,
            operators,
            maps(graph.input_names, graph.inputs),
            maps(graph.output_names, graph.outputs),
        )

    def pack(self, b: _Builder) -> int:
        """Pack the Model table (as `ModelT.Pack` would); returns its offset."""
        codes = _offset_vector(b, [_pack_operator_code(b, *key) for key in self.opcode_index])
        subgraphs = _offset_vector(b, [_pack_subgraph(b, g) for g in self.graphs])
        description = b.CreateString(self.model.description) if self.model.description is not None else None
        buffers = _offset_vector(b, [_pack_buffer(b, buffer) for buffer in self.buffers.buffers])
        metadata = _offset_vector(b, [_pack_metadata(b, *entry) for entry in self.metadata])
        signatures = _offset_vector(b, [_pack_signature(b, g, i) for i, g in enumerate(self.graphs)])
        schema.ModelStart(b)
        schema.ModelAddVersion(b, SCHEMA_VERSION)
        schema.ModelAddOperatorCodes(b, codes)
        schema.ModelAddSubgraphs(b, subgraphs)
        if description is not None:
            schema.ModelAddDescription(b, description)
        schema.ModelAddBuffers(b, buffers)
        schema.ModelAddMetadata(b, metadata)
        schema.ModelAddSignatureDefs(b, signatures)
        return schema.ModelEnd(b)


_bytes_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_from_size.restype = ctypes.py_object
_bytes_from_size.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


def _new_bytes(size: int) -> tuple[bytes, np.ndarray]:
    """A new `bytes` of `size` uninitialised bytes and a writable uint8 array over them,
    to fill before the object is handed to anyone (what `bytes.join` does in C). The
    interpreter takes only `bytes` and keeps a reference instead of copying; a bytearray
    or numpy result would cost one more copy of every weight."""
    result = _bytes_from_size(None, size)
    address = np.frombuffer(result, np.uint8).ctypes.data
    _advise_pages(address, size, huge=True)
    return result, np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


# Transparent huge pages (Linux, where THP is often in "madvise" mode): filling a new
# 100 MB file costs one page fault per 4 KiB page, about 40% of writing ResNet-50; with
# 2 MiB pages the faults mostly disappear. The builder's arena is the opposite: only its
# tail (the structure) and one length word per weight are written, and when it reuses
# memory advised for an earlier file each of those words zeroes a 2 MiB page (half of
# ResNet-50's arena was resident). Advice only: the bytes are the same, and where it is
# unavailable nothing changes.
_HUGE_PAGE_MIN_BYTES = 8 << 20
_madvise = ctypes.CDLL(None, use_errno=True).madvise if sys.platform.startswith("linux") else None
if _madvise is not None:
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _advise_pages(address: int, size: int, huge: bool) -> bool:
    """Ask the kernel to back the whole pages of [address, address + size) with huge
    pages, or never to; True when the advice was given (and taken)."""
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if _madvise is None or advice is None or size < _HUGE_PAGE_MIN_BYTES:
        return False
    start = _align(address, mmap.PAGESIZE)
    end = (address + size) // mmap.PAGESIZE * mmap.PAGESIZE
    return _madvise(start, end - start, advice) == 0


def _finish(pack: Callable[[_Builder], int], size_hint: int) -> bytes:
    """The finished flatbuffer as bytes (built back to front, so the file is the tail of
    the builder's arena): the structure between the reserved buffers is copied, and each
    buffer's payload written once, straight into its place."""
    builder = _Builder(max(1024, size_hint))
    builder.Finish(pack(builder), file_identifier=FILE_IDENTIFIER)
    arena = np.frombuffer(builder.Bytes, np.uint8)  # (the arena grows if the hint was short)
    head = builder.Head()
    result, out = _new_bytes(len(arena) - head)
    cursor = head
    for from_end, payload in sorted(builder.payloads, key=lambda entry: -entry[0]):  # in file order
        start = len(arena) - from_end
        end = start + _payload_size(payload)
        out[cursor - head : start - head] = arena[cursor:start]
        _write_payload(out[start - head : end - head], payload)
        cursor = end
    out[cursor - head :] = arena[cursor:]
    return result


class ModelParts:
    """A .tflite file as consecutive pieces: the flatbuffer, then (models above the
    external-data threshold) padding and each buffer's bytes, as memoryviews of the
    model's own arrays. Exporting writes the pieces one by one, so a model with
    gigabytes of weights is never joined into a second copy in memory."""

    def __init__(self, pieces: list):
        self.pieces = pieces

    @property
    def head(self) -> bytes | memoryview:
        """The flatbuffer itself (the whole file for models below the threshold)."""
        return self.pieces[0]

    def __len__(self) -> int:
        return sum(len(p) for p in self.pieces)

    def tobytes(self) -> bytes:
        return bytes(self.pieces[0]) if len(self.pieces) == 1 else b"".join(self.pieces)

    def write_to(self, f) -> None:
        for piece in self.pieces:
            f.write(piece)


def write_flatbuffer(model: ir.Model, *, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> bytes:
    """Serialize `model` to .tflite bytes.

    When the buffers hold more than `external_data_threshold` bytes, their data is
    stored after the flatbuffer (`Buffer.offset/size`) instead of inside it; the default
    threshold keeps the flatbuffer under its 2 GiB limit. (Tests lower it to exercise
    the large-model layout cheaply.)
    """
    return write_flatbuffer_parts(model, external_data_threshold=external_data_threshold).tobytes()


def write_flatbuffer_parts(model: ir.Model, *, external_data_threshold: int | None = None) -> ModelParts:
    """`write_flatbuffer` without joining the pieces (see `ModelParts`); the threshold
    defaults to the module's EXTERNAL_DATA_THRESHOLD, read at call time."""
    if external_data_threshold is None:
        external_data_threshold = EXTERNAL_DATA_THRESHOLD
    mb = _ModelBuilder(model, validate(model))
    payload_bytes = mb.buffers.total_bytes
    if payload_bytes <= external_data_threshold:
        return ModelParts([_finish(mb.pack, payload_bytes + 16 * len(mb.buffers.buffers) + 65536)])
    return _write_with_external_data(mb)


def _write_with_external_data(mb: _ModelBuilder) -> ModelParts:
    """Flatbuffer first, then each buffer's bytes at a 16-byte aligned offset.

    Offsets depend on the flatbuffer's length, which depends on the offsets' encoding;
    every offset/size is non-zero both times, so the fields are present in both packs
    and the second pack (with the real offsets) has the length of the first.
    """
    table = mb.buffers
    live = [(b, _payload_bytes(p)) for b, p in zip(table.buffers, table.payloads) if p is not None and _payload_size(p)]
    for b, p in live:
        b.payload = None
        b.offset, b.size = 1, len(p)
    first = _finish(mb.pack, 65536)
    cursor = _align(len(first))
    for b, p in live:
        b.offset = cursor
        cursor = _align(cursor + len(p))
    head = _finish(mb.pack, 65536)
    if len(head) != len(first):
        raise ConversionError("internal: flatbuffer length changed while placing external buffers")
    pieces, position = [head], len(head)
    for b, p in live:
        pieces += [bytes(b.offset - position), p]
        position = b.offset + b.size
    pieces.append(bytes(_align(position) - position + DATA_ALIGNMENT))  # XNNPACK may read 16 bytes past
    return ModelParts(pieces)
