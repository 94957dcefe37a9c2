"""Copying shape ops and factory ops agree with PyTorch on CPU (values, shapes, dtypes)."""

import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(2, 3, 4)


def test_cat_and_stack():
    check(aten.cat.default, [X, torch.randn(2, 1, 4)], 1)
    check(aten.cat.default, [X, torch.zeros(0), X.int()], -3)  # legacy empty 1-d skipped, ints promoted
    check(aten.cat.default, [torch.zeros(0), torch.zeros(0)])
    check(aten.stack.default, [X, X * 2], -1)
    check(aten.stack.default, [torch.tensor(1), torch.tensor(2.5)])


def test_copies_and_casts():
    check(aten.clone.default, X)
    check(aten._to_copy.default, X, dtype=torch.int32)
    check(aten._to_copy.default, X * 3, dtype=torch.bfloat16, atol=1e-2, rtol=1e-2)
    check(aten._to_copy.default, X > 0, dtype=torch.float32)
    check(aten.copy.default, X, torch.randn(4).double())
    check(aten.lift_fresh_copy.default, X)


def test_rearrangements():
    check(aten.flip.default, X, [0, -1])
    check(aten.roll.default, X, [1, -2], [2, 0])
    check(aten.roll.default, X, [5])
    check(aten.rot90.default, X, 3, [1, 2])
    check(aten.repeat.default, X, [2, 1, 1, 3])
    check(aten.tril.default, X, 1)
    check(aten.triu.default, X, -1)
    check(aten.trace.default, torch.randn(3, 5))
    check(aten.trace.default, torch.randint(0, 5, (4, 4)).int())
    check(aten.diag_embed.default, X, 1, 0, 2)
    check(aten.diag_embed.default, X, -2)
    check(aten.block_diag.default, [torch.randn(2, 3), torch.tensor([1.0, 2.0]), torch.tensor(5.0)])
    check(aten.pixel_shuffle.default, torch.randn(2, 8, 3, 5), 2)
    check(aten.pixel_unshuffle.default, torch.randn(2, 2, 6, 4), 2)
    check(aten.channel_shuffle.default, torch.randn(2, 6, 3, 3), 3)


@pytest.mark.parametrize("pad", [[1, 2], [1, 0, 2, 1], [-1, 2, 0, -1]])
def test_pads(pad):
    x = torch.randn(2, 3, 5, 6)
    check(aten.constant_pad_nd.default, x, pad, 1.5)
    if min(pad) < 0:
        return
    op = {2: (aten.reflection_pad1d, aten.replication_pad1d), 4: (aten.reflection_pad2d, aten.replication_pad2d)}[
        len(pad)
    ]
    x = x if len(pad) == 4 else x[0]
    for packet in op:
        check(packet.default, x, pad)
    backward = aten.reflection_pad2d_backward.default if len(pad) == 4 else aten.reflection_pad1d_backward.default
    check(
        backward,
        torch.randn(
            aten.reflection_pad1d.default(x, pad).shape
            if len(pad) == 2
            else aten.reflection_pad2d.default(x, pad).shape
        ),
        x,
        pad,
    )


def test_fold_and_unfold():
    x = torch.randn(2, 3, 7, 6)
    cols = check(aten.im2col.default, x, [3, 2], [1, 2], [1, 0], [2, 1])
    check(aten.col2im.default, cols, [7, 6], [3, 2], [1, 2], [1, 0], [2, 1], rtol=1e-4, atol=1e-5)


def test_factories():
    check(aten.zeros.default, [2, 3])
    check(aten.ones.default, [2, 3], dtype=torch.int32)
    check(aten.full.default, [2, 2], 7)
    check(aten.full.default, [2, 2], 2.5)
    check(aten.full.default, [2, 2], True)
    check(aten.full.default, [3], 1.5, dtype=torch.float64)
    check(aten.scalar_tensor.default, 3)
    check(aten.scalar_tensor.default, 3, dtype=torch.int64)
    for op in (aten.zeros_like.default, aten.ones_like.default):
        check(op, X)
        check(op, X, dtype=torch.bool)
    check(aten.full_like.default, X, 4, dtype=torch.int16)
    check(aten.full_like.default, X, -0.5)
    check(aten.new_zeros.default, X.int(), [4])
    check(aten.new_ones.default, X, [1, 2])
    check(aten.new_full.default, X, [2], 3)
    check(aten.fill.Scalar, X, 2)
    check(aten.fill.Tensor, X.int(), torch.tensor(3.7))
    check(aten.zero.default, X)
    assert run_lowering(aten.empty_like.default, X).shape == X.shape
    assert run_lowering(aten.empty.memory_format, [3, 1]).dtype == torch.float32
    check(aten.eye.default, 3)
    check(aten.eye.m, 2, 4, dtype=torch.bool)
    check(aten.tril_indices.default, 4, 3, 1)
    check(aten.triu_indices.default, 3, 5, -1)


@pytest.mark.parametrize(
    "bounds",
    [(5,), (2, 9), (1, 10, 3), (0.0, 1.0, 0.1), (10, 1, -2), (-1.5, 2.5), (0, 1, 0.3), (3.0,)],
)
def test_arange(bounds):
    op = {1: aten.arange.default, 2: aten.arange.start, 3: aten.arange.start_step}[len(bounds)]
    check(op, *bounds)
    check(op, *bounds, dtype=torch.float64)


@pytest.mark.parametrize("start,end,steps", [(0, 1, 5), (-2.5, 7.0, 11), (3, 3, 1), (0, 10, 0), (1, -1, 4)])
def test_linspace_and_logspace(start, end, steps):
    check(aten.linspace.default, start, end, steps)
    check(aten.linspace.default, start, end, steps, dtype=torch.int64)
    check(aten.logspace.default, start, end, steps, rtol=1e-5)
    check(aten.logspace.default, start, end, steps, 2.0, dtype=torch.float64)
    check(aten.linspace.Tensor_Tensor, torch.tensor(start), torch.tensor(end), steps)


@pytest.mark.parametrize("start,end,steps", [(4.3, 50, 50), (50, 1, 50), (4.3, -3, 50), (-3.0, 4.3, 50), (4.3, 0, 1)])
def test_integer_linspace_and_logspace_truncate_like_aten(start, end, steps):
    # ATen truncates the bounds first and counts in float64; -49 / 49 must stay exactly -1
    check(aten.linspace.default, start, end, steps, dtype=torch.int64, atol=0, rtol=0)
    check(aten.linspace.Tensor_Tensor, torch.tensor(start), torch.tensor(end), steps, dtype=torch.int64, atol=0, rtol=0)
    check(aten.logspace.default, start / 10, end / 10, steps, dtype=torch.int64, atol=0, rtol=0)
    check(aten.logspace.default, start / 10, end / 10, steps, 2.0, dtype=torch.int32, atol=0, rtol=0)
    assert_lowers_for_tpu(aten.linspace.Tensor_Tensor, torch.tensor(start), torch.tensor(end), steps, dtype=torch.int64)


@pytest.mark.parametrize("bounds", [(0.0, -8.000001, -4.0), (0.5, 5, 1.5), (-3.7, 4.2, 1.9), (10, 1, -3)])
def test_integer_arange_length_and_values_like_aten(bounds):
    # int64 counts with truncated bounds in integers, int32 in double: different lengths
    check(aten.arange.start_step, *bounds, dtype=torch.int64, atol=0, rtol=0)
    check(aten.arange.start_step, *bounds, dtype=torch.int32, atol=0, rtol=0)


def test_negative_reflect_and_replicate_pads_crop():
    x = torch.randn(1, 2, 6)
    check(aten.replication_pad1d.default, x, [-1, 2])
    check(aten.reflection_pad1d.default, x, [2, -2])
