"""Hostile .tflite files: a corpus of valid models and the ways to damage them.

Two kinds of damage:
- `byte_mutation(content, rng)`: what disks, networks and careless tools do (bit flips,
  truncation, overwritten bytes and words, inserted or deleted bytes, a wrong identifier,
  trailing junk, absurd vector lengths), chosen at random but reproducible from a seed;
- `STRUCTURAL`: named, deliberate edits through the schema's object API (an index out of
  range, a negative dimension, a signature naming a missing subgraph...), each repacked
  into a well-formed flatbuffer so only the meaning is wrong.
"""

from __future__ import annotations

import random

import flatbuffers
import numpy as np
import torch
from ai_edge_litert import schema_py_generated as schema


class ConvHead(torch.nn.Module):
    """Conv, ReLU, mean, linear: constants, several op kinds, one signature."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class TwoOutputs(torch.nn.Module):
    """Two inputs (float, int) and two outputs: more signature entries to damage."""

    def forward(self, x, idx):
        return torch.tanh(x) * 2, idx + 1


def corpus() -> dict[str, bytes]:
    """Valid models to damage, converted by this project."""
    import litert_torch

    torch.manual_seed(0)
    return {
        "conv_head": litert_torch.convert(ConvHead(), (torch.randn(1, 3, 8, 8),)).model_content(),
        "two_outputs": litert_torch.convert(
            TwoOutputs(), (torch.randn(2, 3), torch.tensor([1, 2], dtype=torch.int32))
        ).model_content(),
    }


# ---- byte-level damage ------------------------------------------------------------------------


def _flip_bits(b: bytearray, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        p = rng.randrange(len(b))
        b[p] ^= 1 << rng.randrange(8)
    return "bit flips"


def _truncate(b: bytearray, rng: random.Random) -> str:
    del b[rng.randrange(len(b)) :]
    return "truncated"


def _overwrite_byte(b: bytearray, rng: random.Random) -> str:
    b[rng.randrange(len(b))] = rng.randrange(256)
    return "byte overwritten"


def _overwrite_word(b: bytearray, rng: random.Random) -> str:
    # aligned 32-bit words are offsets, lengths and indices: the fields that hurt
    p = rng.randrange(0, len(b) - 4) & ~3
    b[p : p + 4] = rng.choice(
        [0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFF0, rng.randrange(2**32), rng.randrange(len(b))]
    ).to_bytes(4, "little")
    return "word overwritten"


def _insert_or_delete(b: bytearray, rng: random.Random) -> str:
    p = rng.randrange(len(b))
    if rng.random() < 0.5:
        b[p:p] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return "bytes inserted"
    del b[p : p + rng.randint(1, 16)]
    return "bytes deleted"


def _wrong_identifier(b: bytearray, rng: random.Random) -> str:
    b[4:8] = rng.choice([b"TFL2", b"\0\0\0\0", b"PK\x03\x04", b"tfl3"])
    return "wrong identifier"


def _trailing_junk(b: bytearray, rng: random.Random) -> str:
    b.extend(bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096))))
    return "trailing junk"


def _zero_range(b: bytearray, rng: random.Random) -> str:
    p = rng.randrange(len(b))
    n = rng.randint(1, 256)
    b[p : p + n] = bytes(len(b[p : p + n]))
    return "range zeroed"


_BYTE_MUTATIONS = [
    _flip_bits,
    _truncate,
    _overwrite_byte,
    _overwrite_word,
    _overwrite_word,
    _insert_or_delete,
    _wrong_identifier,
    _trailing_junk,
    _zero_range,
]


def byte_mutation(content: bytes, rng: random.Random) -> tuple[str, bytes]:
    """(what was done, damaged bytes)."""
    b = bytearray(content)
    what = rng.choice(_BYTE_MUTATIONS)(b, rng)
    return what, bytes(b)


def byte_case(corpus: dict[str, bytes], seed: int, index: int) -> tuple[str, bytes]:
    """Case `index` of the fuzz run `seed`: reproducible on its own (each case has its
    own random stream), so a crash report names everything needed to rebuild the file."""
    names = sorted(corpus)
    return byte_mutation(corpus[names[index % len(names)]], random.Random(f"{seed}-{index}"))


# ---- structural damage ------------------------------------------------------------------------


def unpack(content: bytes) -> schema.ModelT:
    """The object-API model, with every index vector writable."""
    m = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(bytearray(content), 0))
    for sg in m.subgraphs:
        sg.inputs, sg.outputs = np.array(sg.inputs, np.int32), np.array(sg.outputs, np.int32)
        for op in sg.operators:
            op.inputs, op.outputs = np.array(op.inputs, np.int32), np.array(op.outputs, np.int32)
    return m


def pack(m: schema.ModelT) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _first_constant(m: schema.ModelT) -> int:
    return next(
        i
        for i, t in enumerate(m.subgraphs[0].tensors)
        if t.buffer and m.buffers[t.buffer].data is not None and len(m.buffers[t.buffer].data) >= 16
    )


def _shrink_constant(m):
    b = m.buffers[m.subgraphs[0].tensors[_first_constant(m)].buffer]
    b.data = b.data[:4]


def _external_past_end(m):
    b = m.buffers[m.subgraphs[0].tensors[_first_constant(m)].buffer]
    b.offset, b.size, b.data = 10**9, len(b.data), None


def _op_writes_constant(m):
    m.subgraphs[0].operators[0].outputs[0] = _first_constant(m)


def _set(path: str, value):
    """A mutation setting one attribute path ('subgraphs.0.operators.0.inputs.0') to value."""

    def apply(m):
        *parents, last = path.split(".")
        obj = m
        for p in parents:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        if last.isdigit():
            obj[int(last)] = value
        else:
            setattr(obj, last, value)

    return apply


# name -> (edit, a fragment the error must contain)
STRUCTURAL = {
    "op input index out of range": (_set("subgraphs.0.operators.0.inputs.0", 999), "input 0 (a tensor index) is 999"),
    "op input index -2": (_set("subgraphs.0.operators.0.inputs.0", -2), "is -2, out of range"),
    "op input -1 where no input is optional": (
        _set("subgraphs.0.operators.0.inputs.0", -1),
        "input 0 is -1 (no tensor)",
    ),
    "op output index out of range": (_set("subgraphs.0.operators.0.outputs.0", 999), "output 0 (a tensor index)"),
    "opcode index out of range": (_set("subgraphs.0.operators.0.opcodeIndex", 77), "opcode index is 77"),
    "tensor buffer index out of range": (_set("subgraphs.0.tensors.1.buffer", 9999), "buffer index is 9999"),
    "negative dimension": (
        _set("subgraphs.0.tensors.0.shape", np.array([1, -5, 8, 8], np.int32)),
        "negative dimension",
    ),
    "dimension product overflows": (
        _set("subgraphs.0.tensors.0.shape", np.array([2**31 - 1] * 4, np.int32)),
        "more than any runtime",
    ),
    "subgraph input out of range": (_set("subgraphs.0.inputs", np.array([555], np.int32)), "inputs[0]"),
    "subgraph output out of range": (_set("subgraphs.0.outputs", np.array([555], np.int32)), "outputs[0]"),
    "signature tensor out of range": (_set("signatureDefs.0.inputs.0.tensorIndex", 555), "tensor index"),
    "signature subgraph out of range": (_set("signatureDefs.0.subgraphIndex", 7), "subgraph index is 7"),
    "unknown builtin operator": (_set("operatorCodes.0.builtinCode", 5000), "builtin 5000"),
    "operator version 0": (_set("operatorCodes.0.version", 0), "version 0"),
    "unknown tensor type": (_set("subgraphs.0.tensors.0.type", 77), "unknown type 77"),
    "unknown options type": (_set("subgraphs.0.operators.0.builtinOptionsType", 250), "options type 250"),
    "constant shorter than its shape": (_shrink_constant, "needs"),
    "external buffer past the end": (_external_past_end, "past the end of the file"),
    "op writes a constant": (_op_writes_constant, "holds constant data"),
    "no subgraphs": (_set("subgraphs", []), "no subgraphs"),
    "schema version 2": (_set("version", 2), "schema version 2"),
    "shape_signature of another rank": (
        _set("subgraphs.0.tensors.0.shapeSignature", np.array([-1, 3], np.int32)),
        "differ in rank",
    ),
}


def structural_mutation(content: bytes, name: str) -> bytes:
    m = unpack(content)
    STRUCTURAL[name][0](m)
    return pack(m)
