"""Quantized export: every scheme runs in the LiteRT interpreter with float inputs (or the
integer I/O asked for), stays close to PyTorch, shrinks the file, and bad configs fail
before any conversion work with an error that says what to change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import litert_torch
from litert_torch import quantize

SCHEME_TOLERANCE = {  # max |litert - torch| / max |torch| on the small CNN below
    "dynamic_int8": 0.03,
    "weight_only_int8": 0.02,
    "weight_only_int4": 0.15,
    "float16": 1e-3,
}


class SmallCNN(nn.Module):
    """conv-bn-relu, depthwise conv, global pool, linear, softmax: the classifier pattern."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.depthwise = nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.pointwise = nn.Conv2d(64, 128, 1)
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(self.pointwise(torch.relu(self.depthwise(y))))
        return self.head(y.mean((2, 3)))


class TinyBlock(nn.Module):
    """A transformer block: layer norm, attention (softmax), GELU MLP, residuals."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def _model(cls, seed=0):
    torch.manual_seed(seed)
    model = cls().eval()
    for m in model.modules():  # non-trivial batch-norm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model


def _rel_error(actual, expected) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - expected)) / np.max(np.abs(expected)))


def assert_fully_integer(edge, act=np.int8) -> None:
    """Every op computes in integers: no float32 tensor but the model's float inputs, the
    QUANTIZE of those inputs and the DEQUANTIZE of its outputs; nothing left float in
    `edge.quant_report`."""
    for graph in edge.ir_model.graphs:
        inputs = {t.id for t in graph.inputs}
        outputs = {t.id for t in graph.outputs}
        for op in graph.ops:
            where = f"{op.opcode} of layer {op.module!r}: {op!r}"
            if op.opcode == "QUANTIZE":
                assert op.inputs[0].id in inputs or op.inputs[0].dtype == act, where
            elif op.opcode == "DEQUANTIZE":
                assert op.outputs[0].id in outputs, f"float island mid-graph: {where}"
            for t in op.outputs:
                assert t.dtype != np.float32 or t.id in outputs, f"float32 output: {where}"
                assert t.dtype in (np.dtype(act), np.float32) or not np.issubdtype(t.dtype, np.floating), where
            if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
                assert op.inputs[1].dtype == np.int8, where
    report = edge.quant_report
    assert report is not None and report.float_ops == [], str(report)


def _tensor_types(edge) -> dict[str, str]:
    return {d["name"]: np.dtype(d["dtype"]).name for d in edge.runtime.interpreter.get_tensor_details()}


@pytest.fixture(scope="module")
def cnn():
    model = _model(SmallCNN)
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    calibration = [(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(10 + i)),) for i in range(8)]
    with torch.no_grad():
        expected = model(x).numpy()
    float_size = len(litert_torch.convert(model, (x,)).model_content())
    return model, x, calibration, expected, float_size


@pytest.mark.parametrize("scheme", list(SCHEME_TOLERANCE))
def test_weight_schemes_run_with_float_inputs_and_shrink_the_file(cnn, scheme):
    model, x, _, expected, float_size = cnn
    config = quantize.weight_only_int4(32) if scheme == "weight_only_int4" else getattr(quantize, scheme)()
    edge = litert_torch.convert(model, (x,), quant_config=config)
    assert _rel_error(edge(x), expected) <= SCHEME_TOLERANCE[scheme]
    assert len(edge.model_content()) < (0.6 if scheme == "float16" else 0.45) * float_size
    types = _tensor_types(edge)
    if scheme in ("dynamic_int8", "weight_only_int8"):
        assert sum(t == "int8" for t in types.values()) == 4  # the four filters


def test_dynamic_int8_uses_hybrid_kernels_without_dequantize(cnn):
    model, x, *_ = cnn
    edge = litert_torch.convert(model, (x,), quant_config=quantize.dynamic_int8())
    ops = [op.opcode for op in edge.ir_model.graphs[0].ops]
    assert "DEQUANTIZE" not in ops
    conv = next(op for op in edge.ir_model.graphs[0].ops if op.opcode == "CONV_2D")
    assert conv.inputs[0].dtype == np.float32 and conv.inputs[1].dtype == np.int8
    assert np.size(conv.inputs[1].quant.scale) == conv.inputs[1].shape[0]  # per output channel


def test_weight_only_int4_packs_linear_weights_blockwise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    x = torch.randn(4, 128)
    edge = litert_torch.convert(model, (x,), quant_config=quantize.weight_only_int4(block_size=64))
    details = edge.runtime.interpreter.get_tensor_details()
    int4 = [d for d in details if d["dtype"] == np.int8 and tuple(d["shape"]) in ((64, 128), (32, 64))]
    assert len(int4) == 2  # the interpreter reports INT4 tensors as int8
    scales = [d for d in details if d["name"].endswith("_scales")]
    assert sorted(tuple(d["shape"]) for d in scales) == [(32, 1), (64, 2)]
    assert all(d["dtype"] == np.float16 for d in scales)
    with torch.no_grad():
        expected = model(x).numpy()
    assert _rel_error(edge(x), expected) < 0.15
    full = len(litert_torch.convert(model, (x,)).model_content())
    assert len(edge.model_content()) < 0.2 * full


def test_full_int8_float_io_quantizes_every_conv_and_matches_torch(cnn):
    model, x, calibration, expected, float_size = cnn
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    graph = edge.ir_model.graphs[0]
    for op in graph.ops:
        if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            assert op.inputs[0].dtype == np.int8 and op.outputs[0].dtype == np.int8, op
            assert op.inputs[2].dtype == np.int32  # bias
    assert [op.opcode for op in graph.ops][0] == "QUANTIZE" and graph.ops[-1].opcode == "DEQUANTIZE"
    assert edge(x).dtype == np.float32
    assert _rel_error(edge(x), expected) < 0.05
    assert len(edge.model_content()) < 0.45 * float_size


@pytest.mark.parametrize("io", ["int8", "uint8"])
def test_full_int8_integer_io(cnn, io):
    model, x, calibration, expected, _ = cnn
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(io=io), calibration_data=calibration)
    spec_in = edge.runtime.signatures[0].inputs[0]
    spec_out = edge.runtime.signatures[0].outputs[0]
    assert spec_in.dtype == np.dtype(io) and spec_out.dtype == np.dtype(io)
    graph = edge.ir_model.graphs[0]
    q_in, q_out = graph.inputs[0].quant, graph.outputs[0].quant
    info = np.iinfo(io)
    xq = np.clip(np.round(x.numpy() / q_in.scale[0]) + q_in.zero_point[0], info.min, info.max).astype(io)
    y = (edge(xq).astype(np.float64) - q_out.zero_point[0]) * q_out.scale[0]
    assert _rel_error(y, expected) < 0.05


def test_int16x8_is_more_accurate_than_int8(cnn):
    model, x, calibration, expected, _ = cnn
    int8 = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    int16 = litert_torch.convert(model, (x,), quant_config=quantize.int16x8(), calibration_data=calibration)
    assert "int16" in _tensor_types(int16).values()
    assert _rel_error(int16(x), expected) < _rel_error(int8(x), expected)
    assert _rel_error(int16(x), expected) < 0.01


def test_keep_float_by_layer_name_and_op_type(cnn):
    model, x, calibration, expected, _ = cnn
    edge = litert_torch.convert(
        model, (x,), quant_config=quantize.full_int8(keep_float=["head", "MEAN"]), calibration_data=calibration
    )
    graph = edge.ir_model.graphs[0]
    by_code = {op.opcode: op for op in graph.ops}
    assert by_code["FULLY_CONNECTED"].outputs[0].dtype == np.float32  # layer "head"
    assert by_code["MEAN"].outputs[0].dtype == np.float32  # op type
    assert by_code["CONV_2D"].outputs[0].dtype == np.int8
    assert _rel_error(edge(x), expected) < 0.05
    weights = litert_torch.convert(model, (x,), quant_config=quantize.dynamic_int8(keep_float="stem"))
    conv = [op for op in weights.ir_model.graphs[0].ops if op.opcode == "CONV_2D"]
    assert [op.inputs[1].dtype.name for op in conv] == ["float32", "int8"]  # stem kept, pointwise quantized


def test_transformer_block_full_int8():
    # The block returns x + attn(x) + mlp(...): compare what the block adds to its input
    # (the residual alone would pass any tolerance relative to max|out|), on fresh inputs.
    torch.manual_seed(0)
    model = TinyBlock(64, 4).eval()
    x = torch.randn(1, 8, 64)
    calibration = [(torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(i)),) for i in range(16)]
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    assert_fully_integer(edge)  # layer norm (decomposed), attention matmuls, softmax, GELU, residual adds
    opcodes = {op.opcode for op in edge.ir_model.graphs[0].ops}
    assert {"FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "GELU", "RSQRT", "MEAN", "ADD"} <= opcodes
    for seed in range(3):
        fresh = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(100 + seed))
        with torch.no_grad():
            added = (model(fresh) - fresh).numpy()
        got = edge(fresh) - fresh.numpy()
        assert _rel_error(got, added) < 0.12  # measured 0.071 (minmax calibration)
        assert np.sqrt(np.mean((got - added) ** 2) / np.mean(added**2)) < 0.1  # measured 0.069
    float_size = len(litert_torch.convert(model, (x,)).model_content())
    assert len(edge.model_content()) < 0.36 * float_size  # 50k parameters: measured 0.339


# ---- errors before any work ----------------------------------------------------------------


def _no_conversion(monkeypatch):
    """Make any conversion attempt fail loudly, so the tests prove errors come first."""
    import litert_torch.api as api

    def boom(*a, **k):
        raise AssertionError("conversion started before the config was checked")

    monkeypatch.setattr(api, "convert_module", boom)


@pytest.mark.parametrize(
    "config, calibration, error, match",
    [
        (quantize.weight_only_int4(block_size=48), None, ValueError, "multiple of 32"),
        (
            quantize.weight_only_int4(block_size=64),
            None,
            ValueError,
            "does not divide the 32 input features of layer '1'",
        ),
        (quantize.full_int8(), None, ValueError, "needs calibration_data"),
        (quantize.full_int8(), [], ValueError, "is empty"),
        (quantize.full_int8(), [(torch.randn(2, 64),)], ValueError, r"shape \(2, 64\); sample_args has \(1, 64\)"),
        (quantize.full_int8(), [(torch.randn(1, 64), torch.randn(1, 64))], ValueError, "has 2 input"),
        (quantize.full_int8(), [(torch.randn(1, 64).double(),)], TypeError, "dtype torch.float64"),
        (quantize.full_int8(), [{"x": torch.randn(1, 64)}], TypeError, "must be a tuple"),
        (quantize.full_int8(io="int16"), [(torch.randn(1, 64),)], ValueError, "io='int16' is not available"),
        (quantize.dynamic_int8(keep_float=["fc9"]), None, ValueError, "'fc9' is neither a layer"),
        ("int3", None, TypeError, "quant_config must be"),
    ],
)
def test_bad_configs_fail_before_conversion(monkeypatch, config, calibration, error, match):
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 4))
    _no_conversion(monkeypatch)
    with pytest.raises(error, match=match):
        litert_torch.convert(model, (torch.randn(1, 64),), quant_config=config, calibration_data=calibration)


class MaskedScores(nn.Module):
    """Causal attention scores with a finfo.min mask, as GPT-2 builds them."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("mask", torch.triu(torch.full((6, 6), torch.finfo(torch.float32).min), diagonal=1))

    def forward(self, x):
        h = self.proj(x)
        return torch.softmax(h @ h.transpose(-1, -2) + self.mask, dim=-1) @ h


def test_minus_infinity_mask_before_softmax_quantizes():
    # A -3.4e38 mask cannot share int8 with the scores as it is (quantizing its range made
    # LiteRT abort); it saturates at the lowest level of a range reaching 12 below the
    # scores, so a masked weight stays below exp(-12). As accurate as a float mask.
    model = _model(MaskedScores)
    x = torch.randn(1, 6, 16)
    calibration = [(torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    edge = litert_torch.convert(model, (x,), quant_config=quantize.full_int8(), calibration_data=calibration)
    assert_fully_integer(edge)
    float_mask = litert_torch.convert(
        model, (x,), quant_config=quantize.full_int8(keep_float=["ADD", "SOFTMAX"]), calibration_data=calibration
    )
    assert {op.opcode for op in float_mask.ir_model.graphs[0].ops if op.outputs[0].dtype == np.float32} >= {
        "ADD",
        "SOFTMAX",
    }
    for seed in range(4):
        fresh = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(100 + seed))
        with torch.no_grad():
            expected = model(fresh).numpy()
        error = _rel_error(edge(fresh), expected)
        assert error < 0.25 and error < 1.5 * _rel_error(float_mask(fresh), expected) + 0.02, seed


class MatmulWeights(nn.Module):
    """x @ W with a constant W whose columns span three decades (BATCH_MATMUL with a weight)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 64, 48) * torch.logspace(-2, 1, 48))

    def forward(self, x):
        return torch.matmul(x, self.w)


def test_dynamic_int8_batch_matmul_uses_the_hybrid_kernel_per_column():
    model = _model(MatmulWeights)
    x = torch.randn(2, 8, 64)
    edge = litert_torch.convert(model, (x,), quant_config=quantize.dynamic_int8())
    ops = edge.ir_model.graphs[0].ops
    assert [op.opcode for op in ops] == ["BATCH_MATMUL"]  # no DEQUANTIZE: the op reads int8
    w = ops[0].inputs[1]
    assert w.dtype == np.int8 and np.size(w.quant.scale) == 48
    with torch.no_grad():
        expected = model(x).numpy()
    actual = edge(x)
    # per column: with one scale for the tensor the smallest column would round to zero
    column_error = np.abs(actual - expected).max(axis=(0, 1)) / np.abs(expected).max(axis=(0, 1))
    assert column_error.max() < 0.03
    assert len(edge.model_content()) < 0.35 * len(litert_torch.convert(model, (x,)).model_content())


class EmbedPointwise(nn.Module):
    """An embedding table and a 1x1 convolution: int4 per row / per output channel."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 64)
        self.pointwise = nn.Conv2d(64, 32, 1)

    def forward(self, ids):
        h = self.emb(ids)  # (1, 16, 64)
        return self.pointwise(h.transpose(1, 2).reshape(1, 64, 4, 4))


def _int4_reference(model, ids):
    """The model with its weights rounded to int4 exactly as the scheme does (numpy)."""
    from converter.quantize import numerics

    ref = _model(EmbedPointwise)
    with torch.no_grad():
        for name in ("emb.weight", "pointwise.weight"):
            w = dict(model.named_parameters())[name].detach().numpy()
            q, scale = numerics.per_channel_symmetric(w, 0, bits=4)
            dict(ref.named_parameters())[name].copy_(torch.from_numpy(q * scale.reshape(-1, *[1] * (w.ndim - 1))))
        return ref(ids).numpy()


def test_weight_only_int4_embeddings_and_pointwise_convs():
    model = _model(EmbedPointwise)
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    edge = litert_torch.convert(model, (ids,), quant_config=quantize.weight_only_int4(32))
    ops = edge.ir_model.graphs[0].ops
    table = next(op for op in ops if op.opcode == "DEQUANTIZE").inputs[0]
    conv = next(op for op in ops if op.opcode == "CONV_2D")
    for w in (table, conv.inputs[1]):
        assert w.quant.int4 and np.size(w.quant.scale) == w.shape[0]
    assert conv.inputs[0].dtype == np.float32  # the hybrid kernel reads the int4 filter itself
    # LiteRT computes what the int4 weights give, plus the hybrid conv's on-the-fly int8
    # input (~1%); int4 itself costs ~7% against float. A kernel that ignored the int4
    # scales (as CONV_2D and GATHER do blockwise ones) is off by ~100%.
    actual = edge(ids)
    assert _rel_error(actual, _int4_reference(model, ids)) < 0.03
    with torch.no_grad():
        assert _rel_error(actual, model(ids).numpy()) < 0.15
    assert len(edge.model_content()) < 0.25 * len(litert_torch.convert(model, (ids,)).model_content())
