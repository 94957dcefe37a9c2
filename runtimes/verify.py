"""Structural verification of .tflite bytes, before the LiteRT interpreter sees them.

The interpreter trusts a model's indices in places: a SignatureDef naming a subgraph
that does not exist crashes the process (segfault) on ai-edge-litert 2.3.0, and our own
readers (`runtimes.litert`, `litert-torch inspect`) follow offsets with the flatbuffers
Python runtime, which reads out of range silently (negative offsets wrap around).
`verify_model` walks the file with bounds-checked reads and raises `InvalidModelError`
naming the first problem:

- structure: file identifier `TFL3`, schema version 3, every table / vtable / vector /
  string offset inside the file (strings NUL-terminated), options tables well formed;
- references: operator-code, tensor, buffer, subgraph indices in range (-1 allowed where
  TFLite means "optional"), signature tensor maps inside their subgraph, metadata buffers;
- data: tensor types known, dimensions non-negative and their byte size representable,
  constant data at least as long as its shape needs, external buffers (`offset/size`,
  models over 2 GB) inside the file, ops never writing a constant.

It reads only the flatbuffer's tables, never the weight bytes: cost is linear in the
number of tensors and ops (a few ms for a zoo model), independent of the weights' size.
"""

from __future__ import annotations

import struct

import numpy as np

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
# Bits per element of each TensorType, by code (None: variable size, not checked).
_ELEMENT_BITS = {
    0: 32,
    1: 16,
    2: 32,
    3: 8,
    4: 64,
    5: None,
    6: 8,
    7: 16,
    8: 64,
    9: 8,
    10: 64,
    11: 128,
    12: 64,
    13: None,
    14: None,
    15: 32,
    16: 16,
    17: 4,
    18: 16,
    19: 2,
    20: 4,
    21: 8,
    22: 8,
}


class InvalidModelError(ValueError):
    """The bytes are not a well-formed LiteRT model; the message says where and why."""


def _builtin_codes(names) -> set[int]:
    from common.tflite_schema import BUILTIN_CODES  # lazy: the schema module takes ~0.4 s to import

    return {BUILTIN_CODES[n] for n in names if n in BUILTIN_CODES}


def _builtin_name(code: int) -> str:
    from common.tflite_schema import builtin_name

    return builtin_name(code)


_OPTIONAL_CODES: set[int] | None = None


def _optional_input_codes() -> set[int]:
    global _OPTIONAL_CODES
    if _OPTIONAL_CODES is None:
        from common.tflite_schema import OPTIONAL_INPUT_OPS

        _OPTIONAL_CODES = _builtin_codes(OPTIONAL_INPUT_OPS)
    return _OPTIONAL_CODES


def _enum_max(name: str) -> int:
    from common.tflite_schema import enum_max

    return enum_max(name)


class _Reader:
    """Bounds-checked little-endian reads of a flatbuffer."""

    def __init__(self, content: bytes, file_size: int):
        self.buf = content
        self.n = len(content)
        self.file_size = file_size  # >= n when content is the flatbuffer part of a larger file

    def _read(self, fmt: str, pos: int, what: str):
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > self.n:
            raise InvalidModelError(f"{what}: reads bytes {pos}..{pos + size} of a {self.n}-byte file")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def table(self, pos: int, what: str) -> "_Table":
        if pos % 4:
            raise InvalidModelError(f"{what}: table at byte {pos} is not 4-byte aligned")
        vtable = pos - self._read("<i", pos, what)
        vt_size = self._read("<H", vtable, f"{what} vtable")
        tbl_size = self._read("<H", vtable + 2, f"{what} vtable")
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > self.n:
            raise InvalidModelError(f"{what}: vtable at byte {vtable} has an invalid size {vt_size}")
        if tbl_size < 4 or pos + tbl_size > self.n:
            raise InvalidModelError(f"{what}: table at byte {pos} claims {tbl_size} bytes, past the end of the file")
        return _Table(self, pos, vtable, vt_size, tbl_size, what)


class _Table:
    def __init__(self, reader: _Reader, pos: int, vtable: int, vt_size: int, tbl_size: int, what: str):
        self.r, self.pos, self.vtable, self.vt_size, self.tbl_size, self.what = (
            reader,
            pos,
            vtable,
            vt_size,
            tbl_size,
            what,
        )

    def _field(self, slot: int, size: int) -> int:
        """Absolute position of field `slot` (0 when absent), checked to lie inside the table."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vt_size:
            return 0
        offset = self.r._read("<H", self.vtable + entry, self.what)
        if offset == 0:
            return 0
        if offset + size > self.tbl_size:
            raise InvalidModelError(f"{self.what}: field {slot} lies outside its table")
        return self.pos + offset

    def scalar(self, slot: int, fmt: str, default=0):
        pos = self._field(slot, struct.calcsize(fmt))
        return default if not pos else self.r._read(fmt, pos, f"{self.what} field {slot}")

    def _target(self, slot: int) -> int:
        pos = self._field(slot, 4)
        if not pos:
            return 0
        target = pos + self.r._read("<I", pos, self.what)
        if target >= self.r.n:
            raise InvalidModelError(f"{self.what}: field {slot} points to byte {target}, past the end of the file")
        return target

    def vector(self, slot: int, elem_bytes: int, what: str) -> tuple[int, int]:
        """(start, length) of a vector field; (0, 0) when absent."""
        target = self._target(slot)
        if not target:
            return 0, 0
        if target % 4:
            raise InvalidModelError(f"{what}: vector at byte {target} is not 4-byte aligned")
        length = self.r._read("<I", target, what)
        start = target + 4
        if start + length * elem_bytes > self.r.n:
            raise InvalidModelError(
                f"{what}: a vector of {length} elements at byte {start} runs past "
                f"the end of the file ({self.r.n} bytes)"
            )
        return start, length

    def ints(self, slot: int, dtype: str, what: str) -> np.ndarray:
        dt = np.dtype(dtype)
        start, length = self.vector(slot, dt.itemsize, what)
        return np.frombuffer(self.r.buf, dt, length, start) if length else np.zeros(0, dt)

    def string(self, slot: int, what: str) -> str | None:
        target = self._target(slot)
        if not target:
            return None
        start, length = self.vector(slot, 1, what)
        if start + length >= self.r.n or self.r.buf[start + length] != 0:
            raise InvalidModelError(f"{what}: string at byte {start} is not NUL-terminated")
        try:
            return bytes(self.r.buf[start : start + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidModelError(f"{what}: string at byte {start} is not UTF-8") from None

    def tables(self, slot: int, what: str) -> list[_Table]:
        start, length = self.vector(slot, 4, what)
        out = []
        for i in range(length):
            pos = start + 4 * i
            out.append(self.r.table(pos + self.r._read("<I", pos, what), f"{what}[{i}]"))
        return out

    def child(self, slot: int, what: str) -> _Table | None:
        target = self._target(slot)
        return self.r.table(target, what) if target else None


def _check_index(value: int, count: int, what: str, optional: bool = False) -> None:
    if optional and value == -1:
        return
    if not 0 <= value < count:
        raise InvalidModelError(f"{what} is {value}, out of range (there are {count})")


def _tensor_bytes(shape: np.ndarray, type_code: int, what: str) -> int | None:
    if (shape < 0).any():
        raise InvalidModelError(f"{what} has a negative dimension in its shape {shape.tolist()}")
    bits = _ELEMENT_BITS.get(type_code)
    if bits is None:
        return None
    count = 1
    for d in shape.tolist():
        count *= int(d)
    size = (count * bits + 7) // 8  # packed sub-byte types (INT4, INT2) round up
    from common.tflite_schema import MAX_TENSOR_BYTES

    if size > MAX_TENSOR_BYTES:
        raise InvalidModelError(f"{what} has shape {shape.tolist()}: {size} bytes, more than any runtime can address")
    return size


def _buffer_sizes(model: _Table, r: _Reader) -> list[int | None]:
    """Bytes available for each buffer (None: no data), checked against the file."""
    sizes: list[int | None] = []
    for i, buf in enumerate(model.tables(4, "buffers")):
        what = f"buffer {i}"
        _, length = buf.vector(0, 1, what)
        offset, size = buf.scalar(1, "<Q"), buf.scalar(2, "<Q")
        if offset > 1:
            if offset + size > r.file_size:
                raise InvalidModelError(
                    f"{what} stores {size} bytes at offset {offset}, past the end of the "
                    f"file ({r.file_size} bytes): the file is truncated or the offset is corrupt"
                )
            sizes.append(size)
        else:
            sizes.append(length if length else None)
    return sizes


def _verify_subgraph(
    sg: _Table, s: int, opcodes: list[int], buffer_sizes: list, max_type: int, max_options: int, max_options2: int
) -> int:
    where = f"subgraph {s}"
    tensors = sg.tables(0, f"{where} tensors")
    n = len(tensors)
    constant = []
    for t_i, t in enumerate(tensors):
        what = f"{where} tensor {t_i}"
        shape = t.ints(0, "<i4", f"{what} shape")
        type_code = t.scalar(1, "<b")
        if not 0 <= type_code <= max_type:
            raise InvalidModelError(f"{what} has an unknown type {type_code}")
        buffer = t.scalar(2, "<I")
        _check_index(buffer, len(buffer_sizes), f"{what} buffer index")
        name = t.string(3, f"{what} name")
        if name:
            what = f"{what} ('{name}')"
        signature = t.ints(7, "<i4", f"{what} shape_signature")
        if len(signature) and len(signature) != len(shape):
            raise InvalidModelError(
                f"{what}: shape {shape.tolist()} and shape_signature {signature.tolist()} differ in rank"
            )
        if (signature < -1).any():
            raise InvalidModelError(f"{what}: shape_signature {signature.tolist()} has a dimension below -1")
        needed = _tensor_bytes(shape, type_code, what)
        quant = t.child(4, f"{what} quantization")
        sparse = t.child(6, f"{what} sparsity")
        if quant is not None:
            scale = quant.ints(2, "<f4", f"{what} quantization scale")
            zero = quant.ints(3, "<i8", f"{what} quantization zero_point")
            axis = quant.scalar(6, "<i")
            if len(scale) > 1 and not 0 <= axis < max(len(shape), 1):
                raise InvalidModelError(f"{what}: quantized_dimension {axis} is outside its rank {len(shape)}")
            if len(scale) > 1 and len(shape) and len(scale) != shape[axis]:
                raise InvalidModelError(
                    f"{what}: {len(scale)} quantization scales for dimension {axis} of size {shape[axis]}"
                )
            if len(zero) and len(scale) and len(zero) != len(scale):
                raise InvalidModelError(f"{what}: {len(scale)} scales but {len(zero)} zero points")
        available = buffer_sizes[buffer]
        constant.append(available is not None)
        if available is not None and needed is not None and sparse is None and available < needed:
            raise InvalidModelError(
                f"{what}: shape {shape.tolist()} needs {needed} bytes but its buffer {buffer} holds {available}"
            )
    for slot, kind in ((1, "inputs"), (2, "outputs")):
        for k, index in enumerate(sg.ints(slot, "<i4", f"{where} {kind}").tolist()):
            _check_index(index, n, f"{where} {kind}[{k}] (a tensor index)")
    for o_i, op in enumerate(sg.tables(3, f"{where} operators")):
        what = f"{where} operator {o_i}"
        opcode_index = op.scalar(0, "<I")
        _check_index(opcode_index, len(opcodes), f"{what} opcode index")
        code = opcodes[opcode_index]
        optional_ok = code in _optional_input_codes()
        for k, index in enumerate(op.ints(1, "<i4", f"{what} inputs").tolist()):
            if index == -1 and (k == 0 or not optional_ok):
                raise InvalidModelError(
                    f"{what} ({_builtin_name(code)}) input {k} is -1 (no tensor), which "
                    f"{_builtin_name(code)} does not accept there"
                )
            _check_index(index, n, f"{what} input {k} (a tensor index)", optional=True)
        for k, index in enumerate(op.ints(2, "<i4", f"{what} outputs").tolist()):
            _check_index(index, n, f"{what} output {k} (a tensor index)", optional=True)
            if index >= 0 and constant[index]:
                raise InvalidModelError(f"{what} output {k} writes tensor {index}, which holds constant data")
        for k, index in enumerate(op.ints(8, "<i4", f"{what} intermediates").tolist()):
            _check_index(index, n, f"{what} intermediate {k} (a tensor index)")
        options_type = op.scalar(3, "<B")
        if options_type > max_options:
            raise InvalidModelError(f"{what} has an unknown builtin options type {options_type}")
        if options_type:
            op.child(4, f"{what} builtin options")
        options2_type = op.scalar(11, "<B")
        if options2_type > max_options2:
            raise InvalidModelError(f"{what} has an unknown builtin options (2) type {options2_type}")
        if options2_type:
            op.child(12, f"{what} builtin options (2)")
        op.vector(5, 1, f"{what} custom options")
        large_offset, large_size = op.scalar(9, "<Q"), op.scalar(10, "<Q")
        if large_offset > 1 and large_offset + large_size > sg.r.file_size:
            raise InvalidModelError(f"{what}: custom options at offset {large_offset} run past the end of the file")
    sg.string(4, f"{where} name")
    return n


def verify_model(
    content: bytes | bytearray | memoryview, source: str = "the model", *, size: int | None = None
) -> None:
    """Raise `InvalidModelError` (a ValueError) naming the first structural problem of
    .tflite `content`; return None when it is safe to hand to the interpreter.

    `source` (a path, "these bytes") starts the message. `size`: the whole file's length
    when `content` is only its flatbuffer part (weights stored after it, models > 2 GB)."""
    if not isinstance(content, (bytes, bytearray, memoryview)):
        content = bytes(content)
    try:
        _verify(_Reader(content, len(content) if size is None else size))
    except InvalidModelError as e:
        raise InvalidModelError(f"{source} is not a valid LiteRT model: {e}") from None


def _verify(r: _Reader) -> None:
    if r.n < 8:
        raise InvalidModelError(f"the file is {r.n} bytes long, too short for a flatbuffer")
    if bytes(r.buf[4:8]) != FILE_IDENTIFIER:
        raise InvalidModelError(f"bytes 4-8 are {bytes(r.buf[4:8])!r}, expected the identifier {FILE_IDENTIFIER!r}")
    model = r.table(r._read("<I", 0, "root offset"), "model")
    version = model.scalar(0, "<I")
    if version != SCHEMA_VERSION:
        raise InvalidModelError(f"schema version {version}, expected {SCHEMA_VERSION}")
    max_code = _enum_max("BuiltinOperator")
    codes = []
    for i, oc in enumerate(model.tables(1, "operator codes")):
        code = max(oc.scalar(0, "<b"), oc.scalar(3, "<i"))
        codes.append(code)
        if not 0 <= code <= max_code:
            raise InvalidModelError(
                f"operator code {i} is builtin {code}, unknown to this LiteRT (known: 0..{max_code})"
            )
        if oc.scalar(2, "<i", 1) < 1:
            raise InvalidModelError(f"operator code {i} has version {oc.scalar(2, '<i', 1)}")
        oc.string(1, f"operator code {i} custom code")
    buffer_sizes = _buffer_sizes(model, r)
    subgraphs = model.tables(2, "subgraphs")
    if not subgraphs:
        raise InvalidModelError("the model has no subgraphs")
    max_type, max_options = _enum_max("TensorType"), _enum_max("BuiltinOptions")
    max_options2 = _enum_max("BuiltinOptions2")
    tensor_counts = [
        _verify_subgraph(sg, s, codes, buffer_sizes, max_type, max_options, max_options2)
        for s, sg in enumerate(subgraphs)
    ]
    model.string(3, "description")
    model.ints(5, "<i4", "metadata_buffer")
    for i, md in enumerate(model.tables(6, "metadata")):
        md.string(0, f"metadata {i} name")
        _check_index(md.scalar(1, "<I"), len(buffer_sizes), f"metadata {i} buffer index")
    for i, sd in enumerate(model.tables(7, "signature defs")):
        what = f"signature {i}"
        key = sd.string(2, f"{what} key")
        if key:
            what = f"signature {i} ('{key}')"
        subgraph = sd.scalar(4, "<I")
        _check_index(subgraph, len(subgraphs), f"{what} subgraph index")
        for slot, kind in ((0, "input"), (1, "output")):
            for k, tm in enumerate(sd.tables(slot, f"{what} {kind}s")):
                name = tm.string(0, f"{what} {kind} {k} name")
                if name is None:
                    raise InvalidModelError(f"{what} {kind} {k} has no name")
                _check_index(
                    tm.scalar(1, "<I"),
                    tensor_counts[subgraph],
                    f"{what} {kind} '{name}' tensor index (in subgraph {subgraph})",
                )
