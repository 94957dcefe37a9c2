"""Decompositions: what KEEP keeps whole reaches the lowerings whole; torch.export's graph is
lowered in one pass, decomposing only nodes without a lowering; mutations that need
functionalization take the whole-program path."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import converter.lowering  # noqa: F401  (registers every lowering)
import litert_torch
from converter.lowering.decompositions import KEEP, decomposition_table, trace_decomposition
from converter.lowering.registry import find_lowering
from converter.pipeline import decompose, direct_lowering_blocker, export_module
from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

aten = torch.ops.aten


def test_every_kept_op_has_a_lowering():
    missing = [str(op) for op in KEEP if find_lowering(op) is None]
    assert not missing, f"ops kept whole but never lowered: {missing}"


def test_table_is_a_fresh_copy_without_the_kept_ops():
    table = decomposition_table()
    assert not any(op in table for op in KEEP)
    table.clear()
    assert len(decomposition_table()) > 100


X = torch.randn(1, 4, 8, 8)


@pytest.mark.parametrize(
    "module, args, kept",
    [
        (nn.Linear(8, 3), (torch.randn(2, 5, 8),), aten.linear.default),
        (Fn(torch.matmul), (torch.randn(2, 3, 4), torch.randn(4, 5)), aten.matmul.default),
        (Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), (X,), aten.upsample_bilinear2d.vec),
        (Fn(lambda x: F.interpolate(x, scale_factor=2)), (X,), aten.upsample_nearest2d.vec),
        (nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular"), (X,), aten._pad_circular.default),
        (nn.PixelUnshuffle(2), (X,), aten.pixel_unshuffle.default),
        (nn.Hardswish(), (X,), aten.hardswish.default),
        (nn.GELU(approximate="tanh"), (X,), aten.gelu.default),
    ],
)
def test_kept_op_reaches_the_converter_whole(module, args, kept):
    program = decompose(export_module(module, args))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert kept in targets, targets


# ---- one pass over torch.export's graph, decomposing only what has no lowering -----------


def _lowered_targets(monkeypatch, module, args, **convert_kwargs):
    """Convert `module`; return (EdgeModel, the ops whose lowering ran, in order)."""
    import converter.pipeline as pipeline

    seen = []

    def spy(target):
        fn = find_lowering(target)
        if fn is not None:
            seen.append(target)
        return fn

    monkeypatch.setattr(pipeline, "find_lowering", spy)
    return assert_converts(module, args, **convert_kwargs), seen


@pytest.mark.parametrize(
    "module, args, kept",
    [
        (nn.Linear(8, 3), (torch.randn(2, 5, 8),), aten.linear.default),
        (Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), (X,), aten.upsample_bilinear2d.vec),
        (nn.PixelUnshuffle(2), (X,), aten.pixel_unshuffle.default),
        (
            Fn(lambda q: F.scaled_dot_product_attention(q, q, q)),
            (torch.randn(1, 2, 4, 8),),
            aten.scaled_dot_product_attention.default,
        ),
    ],
)
def test_kept_op_reaches_its_lowering_whole_without_a_decomposition_pass(monkeypatch, module, args, kept):
    edge, seen = _lowered_targets(monkeypatch, module, args)
    assert kept in seen, seen
    assert "decompose" not in edge.timings  # lowered straight from torch.export's graph


def test_decomposing_one_node_keeps_kept_composite_ops_whole():
    # pad(mode="circular") decomposes to _pad_circular, which is CompositeImplicitAutograd
    # (a trace below autograd would inline it into slices and copies) and in KEEP.
    program = export_module(nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular"), (X,))
    pad = next(n for n in program.graph.nodes if n.target == aten.pad.default)
    traced = trace_decomposition(aten.pad.default, pad.args, pad.kwargs)
    targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert targets == [aten._pad_circular.default]


class _Ops(nn.Module):
    """Ops torch.export leaves whole that have no lowering: each is decomposed on its own."""

    def forward(self, x):
        a = torch.diff(x, dim=1)  # -> slice, slice, sub
        b = F.max_pool1d(x, 2)  # -> unsqueeze, max_pool2d_with_indices, squeeze (unused indices dropped)
        c = (x > 0) & (x < 1)  # __and__ -> bitwise_and
        return a.sum((1, 2)) + b.sum((1, 2)) + c.float().sum((1, 2)) + x.std(1).sum(1)


def test_nodes_without_a_lowering_decompose_one_at_a_time_with_dynamic_sizes():
    batch = torch.export.Dim("batch", min=1, max=16)
    edge = assert_converts(
        _Ops(), (torch.randn(2, 6, 8),), dynamic_shapes=({0: batch},), check_inputs=[(torch.randn(5, 6, 8),)]
    )
    assert "decompose" not in edge.timings


class _InPlace(nn.Module):
    def forward(self, x):
        y = x * 2
        z = y.relu_()  # z and y are one tensor: both see the add_ below
        y.add_(1)
        w = torch.sigmoid(x)
        w.mul_(3)  # result unused: later reads of w see the write
        return z + y + w


class _WriteThroughView(nn.Module):
    def forward(self, x):
        y = x * 2
        y.view(-1).mul_(3)  # writes y through a view: needs functionalization
        return y + 1


class _WriteIntoBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


def test_in_place_ops_lower_as_functional_ops_and_rebind_the_written_value():
    edge = assert_converts(_InPlace(), (torch.randn(3, 4),))
    assert "decompose" not in edge.timings


@pytest.mark.parametrize(
    "module, blocker",
    [
        (_WriteThroughView(), "whose alias 'mul' is read later"),
        (_WriteIntoBuffer(), "writes into input 'b_count'"),
    ],
)
def test_writes_that_need_functionalization_take_the_whole_program_path(module, blocker):
    program = export_module(module, (torch.randn(3, 4),))
    assert blocker in (direct_lowering_blocker(program) or "")
    expected = module(torch.ones(3, 4)) if isinstance(module, _WriteThroughView) else torch.ones(3, 4) + 1
    module = type(module)()  # fresh buffers: the reference call above counted once
    edge = litert_torch.convert(module, (torch.randn(3, 4),))
    assert "decompose" in edge.timings
    np.testing.assert_allclose(edge(torch.ones(3, 4)), expected.numpy(), rtol=1e-6)


Y = torch.randn(2, 4, 6)


@pytest.mark.parametrize(
    "module, args, direct, convert_kwargs",
    [
        (nn.Conv1d(4, 3, 3, padding=1), (Y,), aten.conv1d.default, {}),
        (nn.ConvTranspose1d(4, 3, 3, stride=2), (Y,), aten.conv_transpose1d.default, {}),
        (nn.ConvTranspose2d(4, 3, 3, stride=2, output_padding=1), (X,), aten.conv_transpose2d.input, {}),
        (nn.BatchNorm2d(4), (X,), aten.batch_norm.default, {}),
        (nn.BatchNorm2d(4), (X,), aten.batch_norm.default, {"eval_mode": False}),  # batch statistics
        (nn.LayerNorm(8), (X,), aten.layer_norm.default, {}),
        (nn.GroupNorm(2, 4), (X,), aten.group_norm.default, {}),
        (Fn(F.relu6), (X,), aten.relu6.default, {}),
        (Fn(lambda x: torch.softmax(x, 1)), (X,), aten.softmax.int, {}),
        (Fn(lambda x: torch.log_softmax(x, -1)), (X,), aten.log_softmax.int, {}),
        (nn.Sequential(nn.Dropout(0.5), nn.Hardtanh(inplace=True)), (X,), aten.dropout.default, {}),
        (Fn(lambda x: torch.cat(x.chunk(3, dim=2)[::-1], 2)), (X,), aten.chunk.default, {}),
        (Fn(lambda x: x.to("cpu", torch.float32) * 2), (X,), aten.to.device, {}),
        (Fn(lambda x: ((x > 0) & (x < 1)).float()), (X,), aten.__and__.Tensor, {}),
        (Fn(lambda x: torch.min(x, x.flip(0))), (X,), aten.min.other, {}),
    ],
)
def test_ops_torch_export_leaves_whole_lower_directly(monkeypatch, module, args, direct, convert_kwargs):
    edge, seen = _lowered_targets(monkeypatch, module.eval(), args, **convert_kwargs)
    assert direct in seen, seen
    assert "decompose" not in edge.timings


class _Grid(nn.Module):
    """meshgrid of a constant and of a run-time vector, both indexings."""

    def forward(self, s):
        gy, gx = torch.meshgrid(torch.arange(4.0), torch.arange(3.0), indexing="xy")
        hy, hx = torch.meshgrid(s, s * 2, indexing="ij")
        return (gy + gx).sum() + hy * hx


V = torch.randn(2, 3, 11)
CLIP = torch.randn(1, 2, 3, 6, 7)


@pytest.mark.parametrize(
    "module, args, direct",
    [
        (nn.Conv3d(2, 4, (2, 3, 3), padding=1), (CLIP,), aten.conv3d.default),
        (nn.ConvTranspose3d(2, 3, 2, stride=2), (CLIP,), aten.conv_transpose3d.input),
        (
            Fn(lambda x, g: F.grid_sample(x, g, align_corners=False)),
            (X, torch.rand(1, 5, 4, 2) * 2 - 1),
            aten.grid_sampler.default,
        ),
        (nn.AdaptiveAvgPool1d(5), (V,), aten.adaptive_avg_pool1d.default),
        (nn.AdaptiveAvgPool1d(1), (V,), aten.adaptive_avg_pool1d.default),
        (_Grid(), (torch.randn(5),), aten.meshgrid.indexing),
        (Fn(lambda v: torch.diff(v, n=2) + torch.diff(v, dim=1, prepend=v[:, :1]).sum()), (V,), aten.diff.default),
        (Fn(lambda v: v * torch.linspace(-1, 1, 11)), (V,), aten.linspace.default),
        (Fn(lambda x: F.interpolate(x, scale_factor=2, mode="trilinear")), (CLIP,), aten.upsample_trilinear3d.vec),
        (
            Fn(lambda x: F.interpolate(x, size=(5, 4, 9), mode="trilinear", align_corners=True)),
            (CLIP,),
            aten.upsample_trilinear3d.vec,
        ),
        (Fn(lambda x: F.interpolate(x, scale_factor=1.7, mode="trilinear")), (CLIP,), aten.upsample_trilinear3d.vec),
        (
            Fn(lambda t: F.affine_grid(t, [2, 3, 5, 7], align_corners=False)),
            (torch.randn(2, 2, 3),),
            aten.affine_grid_generator.default,
        ),
        (
            Fn(lambda t: F.affine_grid(t, [2, 3, 5, 7], align_corners=True)),
            (torch.randn(2, 2, 3),),
            aten.affine_grid_generator.default,
        ),
    ],
)
def test_ops_that_were_traced_per_node_lower_directly(monkeypatch, module, args, direct):
    """Each used to cost a per-node decomposition trace (10-100 ms, more than the rest of
    a small model's conversion); now one lowering, same numbers."""
    import converter.pipeline as pipeline

    traced = []
    monkeypatch.setattr(pipeline._GraphWalk, "_trace", lambda self, node, target: traced.append(target))
    edge, seen = _lowered_targets(monkeypatch, module.eval(), args)
    assert direct in seen and not traced, (seen, traced)


def _pad_rows(x):
    """A decomposition that fills a fresh tensor through slice views (as some of
    PyTorch's composite kernels do, e.g. _pad_circular's)."""
    out = x.new_empty((x.shape[0] + 2, *x.shape[1:]))
    out[1:-1].copy_(x)
    out[:1].copy_(x[-1:])
    out[-1:].copy_(x[:1])
    return out


def test_a_decomposition_that_writes_into_views_is_traced_functionalized(monkeypatch):
    from converter.lowering import decompositions

    monkeypatch.setattr(decompositions, "decomposition_for", lambda op: _pad_rows)
    x = next(n for n in export_module(Fn(lambda x: x * 2), (Y,)).graph.nodes if n.op == "placeholder")
    plain = trace_decomposition(aten.pad.default, (x,), {})
    # lowered write by write, the writes into `out` would be lost: the walk must not take it
    assert aten.copy_.default in [n.target for n in plain.graph.nodes]
    assert "alias" in direct_lowering_blocker(SimpleNamespace(graph=plain.graph))
    functional = trace_decomposition(aten.pad.default, (x,), {}, functional=True)
    targets = [n.target for n in functional.graph.nodes if n.op == "call_function"]
    assert aten.copy_.default not in targets and aten.slice_scatter.default in targets, targets
    assert direct_lowering_blocker(SimpleNamespace(graph=functional.graph)) is None
