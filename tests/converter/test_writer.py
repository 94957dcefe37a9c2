"""The flatbuffer writer: the facts LiteRT needs, checked by reading the bytes back and
by running the result in the LiteRT interpreter."""

from __future__ import annotations

import os

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from converter import ir
from converter.errors import ConversionError
from converter.writer import write_flatbuffer
from runtimes.litert import LiteRTModel


def f32(name, shape, data=None, signature=None):
    return ir.Tensor(name, shape, np.float32, data=data, shape_signature=signature)


def const(name, values, dtype=np.float32):
    data = np.asarray(values, dtype=dtype)
    return ir.Tensor(name, data.shape, data.dtype, data=data)


def one_op_model(opcode, inputs, out, options=None, **graph_kwargs) -> ir.Model:
    x = [t for t in inputs if t is not None and not t.is_const]
    graph = ir.Graph(inputs=x, outputs=[out], ops=[ir.Op(opcode, inputs, [out], options or {})], **graph_kwargs)
    return ir.Model([graph])


def read(content: bytes) -> schema.Model:
    return schema.Model.GetRootAsModel(content, 0)


def opcodes(content: bytes) -> list[tuple[int, int, int]]:
    """(builtin_code, deprecated_builtin_code, version) of every OperatorCode."""
    m = read(content)
    return [
        (m.OperatorCodes(i).BuiltinCode(), m.OperatorCodes(i).DeprecatedBuiltinCode(), m.OperatorCodes(i).Version())
        for i in range(m.OperatorCodesLength())
    ]


def version_of(content: bytes, opcode: str) -> int:
    code = getattr(schema.BuiltinOperator, opcode)
    return next(v for c, _, v in opcodes(content) if c == code)


def add_chain_model() -> tuple[ir.Model, np.ndarray]:
    """y = (x + c) * c2 with two constants of odd byte sizes."""
    x, y, z = f32("x", (5,)), f32("y", (5,)), f32("z", (5,))
    c = const("c", np.arange(5) * 0.5)
    c2 = const("c2", [3.0, 1.0, -1.0, 2.0, 0.25])
    graph = ir.Graph(
        inputs=[x],
        outputs=[z],
        input_names=["x"],
        output_names=["out"],
        ops=[
            ir.Op("ADD", [x, c], [y], {"fusedActivationFunction": "NONE"}),
            ir.Op("MUL", [y, c2], [z]),
        ],
    )
    expected = (np.linspace(-1, 1, 5).astype(np.float32) + c.data) * c2.data
    return ir.Model([graph]), expected


# ---- file-level facts ------------------------------------------------------------------------


def test_identifier_version_and_empty_buffer_zero():
    model, expected = add_chain_model()
    content = write_flatbuffer(model)
    assert content[4:8] == b"TFL3"
    m = read(content)
    assert m.Version() == 3
    assert m.Buffers(0).DataLength() == 0
    out = LiteRTModel(content).run([np.linspace(-1, 1, 5).astype(np.float32)])[0]
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_op_numbered_above_127_loads_and_runs():
    x, y = f32("x", (2, 3)), f32("y", (2, 3))
    content = write_flatbuffer(one_op_model("GELU", [x], y))
    assert (schema.BuiltinOperator.GELU, 127, 1) in opcodes(content)
    v = np.array([[-2.0, -0.5, 0.0], [0.5, 1.0, 3.0]], np.float32)
    erf = np.vectorize(__import__("math").erf)
    np.testing.assert_allclose(LiteRTModel(content).run([v])[0], 0.5 * v * (1 + erf(v / np.sqrt(2))), atol=1e-5)


def _data_offsets(content: bytes) -> list[tuple[int, int]]:
    """(file offset, length) of every non-empty Buffer.data vector."""
    m = read(content)
    base = np.frombuffer(content, np.uint8).__array_interface__["data"][0]
    result = []
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        if b.DataLength():
            result.append((b.DataAsNumpy().__array_interface__["data"][0] - base, b.DataLength()))
    return result


def test_buffer_data_is_16_byte_aligned():
    tensors = [
        const(f"c{i}", np.arange(n), dtype)
        for i, (n, dtype) in enumerate([(3, np.int8), (5, np.float32), (7, np.int16), (1, np.uint8), (33, np.float32)])
    ]
    x = f32("x", (1,))
    graph = ir.Graph(inputs=[x], outputs=[x], ops=[])
    outs = []
    for t in tensors:
        out = ir.Tensor(t.name + "_out", t.shape, t.dtype)
        graph.ops.append(ir.Op("ADD", [t, t], [out]))
        outs.append(out)
    graph.outputs = outs
    content = write_flatbuffer(ir.Model([graph]))
    offsets = _data_offsets(content)
    assert len(offsets) >= len(tensors)
    assert all(offset % 16 == 0 for offset, _ in offsets), offsets


def test_identical_constants_share_one_buffer():
    x = f32("x", (4,))
    a = const("a", [1, 2, 3, 4])
    b = const("b", [1, 2, 3, 4])  # same bytes, dtype, shape: shared
    c = const("c", [[1, 2], [3, 4]])  # same bytes, other shape: separate
    d = const("d", [1, 2, 3, 4], np.int32)  # other dtype: separate
    y1, y2, y3, y4 = (f32(f"y{i}", (4,)) for i in range(4))
    y3 = f32("y3", (2, 2))
    y4 = ir.Tensor("y4", (4,), np.int32)
    graph = ir.Graph(
        inputs=[x],
        outputs=[y1, y2, y3, y4],
        ops=[
            ir.Op("ADD", [x, a], [y1]),
            ir.Op("ADD", [x, b], [y2]),
            ir.Op("ADD", [c, c], [y3]),
            ir.Op("ADD", [d, d], [y4]),
        ],
    )
    content = write_flatbuffer(ir.Model([graph]))
    m = read(content)
    sg = m.Subgraphs(0)
    buffer_of = {sg.Tensors(i).Name().decode(): sg.Tensors(i).Buffer() for i in range(sg.TensorsLength())}
    assert buffer_of["a"] == buffer_of["b"] != 0
    assert len({buffer_of["a"], buffer_of["c"], buffer_of["d"]}) == 3
    outs = LiteRTModel(content).run([np.zeros(4, np.float32)])
    np.testing.assert_array_equal(outs[1], [1, 2, 3, 4])


def test_signature_names_and_several_graphs():
    def graph(name, opcode):
        x, y = f32("x", (3,)), f32("y", (3,))
        return ir.Graph(
            name=name,
            inputs=[x],
            outputs=[y],
            ops=[ir.Op(opcode, [x], [y])],
            input_names=["pixels"],
            output_names=["scores"],
        )

    content = write_flatbuffer(ir.Model([graph("encode", "RELU"), graph("decode", "ABS")]))
    rt = LiteRTModel(content)
    assert [s.key for s in rt.signatures] == ["encode", "decode"]
    assert rt.signature("encode").input_names == ["pixels"]
    assert rt.signature("decode").output_names == ["scores"]
    v = np.array([-1, 0, 2], np.float32)
    np.testing.assert_array_equal(rt.run([v], "encode")[0], [0, 0, 2])
    np.testing.assert_array_equal(rt.run([v], "decode")[0], [1, 0, 2])


def test_min_runtime_version_metadata():
    x, y = f32("x", (2,)), f32("y", (2,))
    content = write_flatbuffer(one_op_model("GELU", [x], y))
    m = read(content)
    entries = {m.Metadata(i).Name().decode(): m.Metadata(i).Buffer() for i in range(m.MetadataLength())}
    raw = m.Buffers(entries["min_runtime_version"]).DataAsNumpy().tobytes()
    assert len(raw) == 16
    assert raw.rstrip(b"\0") == b"2.9.0"  # GELU v1 needs LiteRT/TFLite 2.9


def test_large_output_on_huge_pages_keeps_its_bytes(monkeypatch):
    from converter import writer

    x, y = f32("x", (3, 1 << 20)), f32("y", (3, 1 << 20))
    w = const("w", np.random.default_rng(0).standard_normal((3, 1 << 20)))  # 12 MB: advised
    model = one_op_model("ADD", [x, w], y)
    advise, given = writer._advise_pages, []
    monkeypatch.setattr(writer, "_advise_pages", lambda *args, huge: given.append((huge, advise(*args, huge=huge))))
    advised = write_flatbuffer(model)
    monkeypatch.setattr(writer, "_madvise", None)  # as on a system without madvise
    assert write_flatbuffer(model) == advised
    assert given[2:] == [(False, False), (True, False)]  # the arena, then the file
    if os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        assert given[:2] == [(False, True), (True, True)]


# ---- models over 2 GB: data after the flatbuffer --------------------------------------------


def test_external_data_layout_loads_and_runs():
    model, expected = add_chain_model()
    inline = write_flatbuffer(model)
    external = write_flatbuffer(model, external_data_threshold=0)
    m = read(external)
    placed = [(m.Buffers(i).Offset(), m.Buffers(i).Size()) for i in range(m.BuffersLength()) if m.Buffers(i).Offset()]
    assert placed and all(m.Buffers(i).DataLength() == 0 for i in range(m.BuffersLength()))
    assert all(off % 16 == 0 for off, _ in placed)
    assert len(external) >= max(off + size for off, size in placed) + 16
    assert external[placed[0][0] : placed[0][0] + 20] == np.asarray(np.arange(5) * 0.5, np.float32).tobytes()
    x = np.linspace(-1, 1, 5).astype(np.float32)
    np.testing.assert_array_equal(LiteRTModel(external).run([x])[0], LiteRTModel(inline).run([x])[0])
    np.testing.assert_allclose(LiteRTModel(external).run([x])[0], expected, rtol=1e-6)


# ---- options, versions, quantization, dynamic shapes ------------------------------------------


def test_options_by_schema_field_names_and_enum_strings():
    x = f32("x", (1, 2, 2, 1))
    y = f32("y", (1, 1, 1, 1))
    content = write_flatbuffer(
        one_op_model(
            "MAX_POOL_2D",
            [x],
            y,
            {
                "padding": "VALID",
                "strideW": 2,
                "strideH": 2,
                "filterWidth": 2,
                "filterHeight": 2,
                "fusedActivationFunction": "RELU",
            },
        )
    )
    v = np.array([-4.0, -1.0, -3.0, -2.0], np.float32).reshape(1, 2, 2, 1)
    assert LiteRTModel(content).run([v])[0].item() == 0.0  # max is -1, then fused RELU


def test_ops_without_options_given_still_load():
    x = f32("x", (2, 3))
    shape = const("shape", [3, 2], np.int32)
    axes = const("axes", [1], np.int32)
    r, mean = f32("r", (3, 2)), f32("m", (3,))
    graph = ir.Graph(
        inputs=[x],
        outputs=[mean],
        ops=[
            ir.Op("RESHAPE", [x, shape], [r]),
            ir.Op("MEAN", [r, axes], [mean]),
        ],
    )
    content = write_flatbuffer(ir.Model([graph]))
    out = LiteRTModel(content).run([np.arange(6, dtype=np.float32).reshape(2, 3)])[0]
    np.testing.assert_allclose(out, [0.5, 2.5, 4.5])


@pytest.mark.parametrize(
    "opcode, build, expected",
    [
        ("FULLY_CONNECTED", "fc_keep_dims", 5),
        ("FULLY_CONNECTED", "fc_two_inputs", 6),
        ("FULLY_CONNECTED", "fc_plain", 1),
        ("DEPTHWISE_CONV_2D", "dw_dilated", 2),
        ("TRANSPOSE", "transpose_5d", 4),
        ("CONV_2D", "conv_int8", 3),
    ],
)
def test_minimum_op_versions(opcode, build, expected):
    model = _VERSION_MODELS[build]()
    content = write_flatbuffer(model)
    assert version_of(content, opcode) == expected
    LiteRTModel(content)  # and the runtime accepts that version


def _fc(keep_dims=False, bias=True, two_inputs=False):
    x, y = f32("x", (2, 3)), f32("y", (2, 4))
    w = const("w", np.ones((4, 3)))
    b = const("b", np.zeros(4)) if bias else None
    inputs = [x, w] if two_inputs else [x, w, b]
    return one_op_model("FULLY_CONNECTED", inputs, y, {"keepNumDims": keep_dims})


def _dw_dilated():
    x, y = f32("x", (1, 5, 5, 2)), f32("y", (1, 1, 1, 2))
    w, b = const("w", np.ones((1, 3, 3, 2))), const("b", np.zeros(2))
    return one_op_model(
        "DEPTHWISE_CONV_2D",
        [x, w, b],
        y,
        {
            "padding": "VALID",
            "strideW": 1,
            "strideH": 1,
            "depthMultiplier": 1,
            "dilationWFactor": 2,
            "dilationHFactor": 2,
        },
    )


def _transpose_5d():
    x, y = f32("x", (1, 2, 3, 4, 5)), f32("y", (5, 4, 3, 2, 1))
    return one_op_model("TRANSPOSE", [x, const("perm", [4, 3, 2, 1, 0], np.int32)], y)


def _conv_int8():
    q = ir.QuantParams(np.array([0.1], np.float32), np.array([0], np.int64))
    x = ir.Tensor("x", (1, 3, 3, 1), np.int8, quant=q)
    w = ir.Tensor(
        "w",
        (1, 1, 1, 1),
        np.int8,
        data=np.ones((1, 1, 1, 1), np.int8),
        quant=ir.QuantParams(np.array([0.5], np.float32), np.array([0], np.int64)),
    )
    b = ir.Tensor(
        "b",
        (1,),
        np.int32,
        data=np.zeros(1, np.int32),
        quant=ir.QuantParams(np.array([0.05], np.float32), np.array([0], np.int64)),
    )
    y = ir.Tensor("y", (1, 3, 3, 1), np.int8, quant=q)
    return one_op_model("CONV_2D", [x, w, b], y, {"padding": "SAME", "strideW": 1, "strideH": 1})


_VERSION_MODELS = {
    "fc_keep_dims": lambda: _fc(keep_dims=True),
    "fc_two_inputs": lambda: _fc(two_inputs=True),
    "fc_plain": lambda: _fc(),
    "dw_dilated": _dw_dilated,
    "transpose_5d": _transpose_5d,
    "conv_int8": _conv_int8,
}


def test_quantization_params_round_trip():
    q = ir.QuantParams(np.array([0.5], np.float32), np.array([3], np.int64))
    data = np.array([3, 5, -1, 127], np.int8)
    c = ir.Tensor("c", (4,), np.int8, data=data, quant=q)
    x, deq, y = f32("x", (4,)), f32("deq", (4,)), f32("y", (4,))
    graph = ir.Graph(inputs=[x], outputs=[y], ops=[ir.Op("DEQUANTIZE", [c], [deq]), ir.Op("ADD", [x, deq], [y])])
    content = write_flatbuffer(ir.Model([graph]))
    out = LiteRTModel(content).run([np.zeros(4, np.float32)])[0]
    np.testing.assert_allclose(out, (data.astype(np.float32) - 3) * 0.5)
    assert version_of(content, "DEQUANTIZE") == 2


def test_dynamic_dimension_in_shape_signature():
    x, y = f32("x", (1, 3), signature=(-1, 3)), f32("y", (1, 3), signature=(-1, 3))
    content = write_flatbuffer(one_op_model("RELU", [x], y, input_names=["x"], output_names=["y"]))
    rt = LiteRTModel(content)
    assert rt.signature().inputs[0].shape_signature == (-1, 3)
    v = np.arange(15, dtype=np.float32).reshape(5, 3) - 7
    np.testing.assert_array_equal(rt.run([v])[0], np.maximum(v, 0))


# ---- malformed IR: clear errors, never an internal crash -------------------------------------


def _bad(**changes):
    x, y = f32("x", (2,)), f32("y", (2,))
    opcode = changes.get("opcode", "ADD")
    inputs = changes.get("inputs", [x] if opcode == "RELU" else [x, x])
    op = ir.Op(opcode, inputs, [y], changes.get("options", {}))
    return ir.Model([ir.Graph(inputs=[x], outputs=[y], ops=[op])])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"opcode": "NOT_AN_OP"}, "not a TFLite builtin"),
        ({"options": {"strideW": 2}}, "AddOptions has no field 'strideW'"),
        ({"options": {"fusedActivationFunction": "SWISH"}}, "fusedActivationFunction='SWISH' is not one of"),
        ({"opcode": "RELU", "options": {"alpha": 1}}, "RELU takes no options"),
        ({"inputs": [f32("orphan", (2,)), f32("orphan2", (2,))]}, "not a graph input, a constant or the output"),
        ({"inputs": ["x", "x"]}, "expected an ir.Tensor"),
        ({"opcode": "RELU", "inputs": [None]}, "input 0 is None (no tensor), which RELU cannot take"),
        ({"inputs": [const("c", [1.0, 2.0]), None]}, "input 1 is None (no tensor), which ADD cannot take"),
    ],
)
def test_malformed_ir_raises_a_clear_error(changes, message):
    with pytest.raises(ConversionError, match="op #0") as info:
        write_flatbuffer(_bad(**changes))
    assert message in str(info.value)


def _quantized(scale, zero_point, axis=0):
    data = np.zeros((3, 2), np.int8)
    return ir.Tensor("q", data.shape, data.dtype, data=data, quant=ir.QuantParams(scale, zero_point, axis))


@pytest.mark.parametrize(
    "tensor, message",
    [
        (f32("s", (2,), signature=(-2,)), "a dimension below -1"),
        (f32("huge", (2**40, 2**30)), "larger than any runtime can address"),
        (_quantized(np.ones(2), np.zeros(2, np.int64)), "2 quantization scales along axis 0"),
        (_quantized(np.ones(3), np.zeros(3, np.int64), axis=2), "3 quantization scales along axis 2"),
        (_quantized(np.ones(3), np.zeros(1, np.int64)), "3 quantization scales but 1 zero points"),
    ],
)
def test_tensor_the_runtime_would_misread_is_rejected(tensor, message):
    """What the interpreter's checks (runtimes.verify) would refuse in the file, refused in
    the IR: convert() prepares the file without them."""
    y = ir.Tensor("y", tensor.shape, tensor.dtype)
    inputs = [] if tensor.is_const else [tensor]
    model = ir.Model([ir.Graph(inputs=inputs, outputs=[y], ops=[ir.Op("RELU", [tensor], [y])])])
    with pytest.raises(ConversionError, match=f"%{tensor.name}") as info:
        write_flatbuffer(model)
    assert message in str(info.value)


def test_constant_with_mismatched_data_is_rejected():
    x, y = f32("x", (2,)), f32("y", (2,))
    c = ir.Tensor("c", (2,), np.float32, data=np.zeros(3, np.float32))
    model = ir.Model([ir.Graph(inputs=[x], outputs=[y], ops=[ir.Op("ADD", [x, c], [y])])])
    with pytest.raises(ConversionError, match=r"constant %c is declared float32\[2\] but holds float32\[3\]"):
        write_flatbuffer(model)
