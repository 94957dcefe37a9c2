"""Assignment into tensors (functionalized to slice_scatter, select_scatter, index_put,
copy): folded to constants when every input is constant (masks and position tables
built in forward), LiteRT ops otherwise. LiteRT vs PyTorch, float32 max rel err 1e-4."""

from __future__ import annotations

import pytest
import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)
X = torch.randn(4, 6, 5)
V = torch.randn(4, 6, 5)


def opcodes(edge) -> set[str]:
    return {op.opcode for op in edge.ir_model.graphs[0].ops}


def assign(fn):
    """A module computing fn(y, v) on a copy y of x: the in-place writes of `fn` are
    functionalized by torch.export."""

    def forward(x, v):
        y = x.clone()
        fn(y, v)
        return y * 2.0

    return Fn(forward)


def put(y, index, v, accumulate=False):
    y.index_put_(index, v, accumulate=accumulate)


RUN_TIME = {
    # name: (function writing into y, an opcode the lowering must emit)
    "slice": (lambda y, v: y.__setitem__((slice(None), slice(1, 4)), v[:, :3]), "CONCATENATION"),
    "slice_at_start": (lambda y, v: y.__setitem__((slice(None), slice(0, 2)), v[:, 4:]), "CONCATENATION"),
    "slice_step": (lambda y, v: y.__setitem__((slice(None), slice(1, None, 2)), v[:, :3]), "GATHER"),
    "slice_last_axis": (lambda y, v: y.__setitem__((Ellipsis, slice(2, 4)), v[..., :2] + 1), "CONCATENATION"),
    "select": (lambda y, v: y.__setitem__((Ellipsis, 0), v[..., 1]), "SELECT_V2"),  # decomposed to where
    "select_scalar": (lambda y, v: y.__setitem__((slice(None), 3), 7.0), "SELECT_V2"),
    "copy_into_view": (lambda y, v: y[:, 2:4].copy_(v[:, :1]), "BROADCAST_TO"),
    "index_const": (lambda y, v: y.__setitem__((slice(None), torch.tensor([4, 0, 2])), v[:, :3]), "SCATTER_ND"),
    "index_const_accumulate": (lambda y, v: put(y, (torch.tensor([1, 1, 0]),), v[0], True), "SCATTER_ND"),
    "index_const_two_axes": (
        lambda y, v: put(y, (torch.tensor([0, 1]), torch.tensor([5, -1])), v[0, :2]),
        "SCATTER_ND",
    ),
    "bool_mask_const": (lambda y, v: put(y, (torch.arange(24).reshape(4, 6) % 3 == 0,), v[0, 0, 0]), "SELECT_V2"),
}


@pytest.mark.parametrize("name", RUN_TIME)
def test_assignment_of_run_time_values(name):
    fn, opcode = RUN_TIME[name]
    edge = assert_converts(assign(fn), (X, V), rtol=1e-4, atol=0.0)
    assert opcode in opcodes(edge)


def test_index_put_with_run_time_indices_and_accumulate():
    def forward(x, idx, v):
        y = x.clone()
        y[idx] = v  # idx computed at run time
        z = x.clone()
        z.index_put_((idx,), v, accumulate=True)
        return y, z

    idx = torch.tensor([1, -1, 0])
    edge = assert_converts(
        Fn(forward), (X, idx, V[:3]), rtol=1e-4, atol=0.0, check_inputs=[(X, torch.tensor([3, 0, -3]), V[:3])]
    )
    assert "SCATTER_ND" in opcodes(edge)


def test_index_put_accumulates_repeated_run_time_indices_after_full_slices():
    def add_through_index(x, idx, v):
        z = x.clone()
        z[:, idx] += v  # index_put (no accumulate) of the gathered sum
        return z

    def accumulate(x, idx, v):
        w = x.clone()
        w.index_put_((torch.arange(4)[:, None], idx), v, accumulate=True)
        return w

    assert_converts(Fn(add_through_index), (X, torch.tensor([4, 1, 2]), V[:, :3]), rtol=1e-4, atol=0.0)
    assert_converts(
        Fn(accumulate),
        (X, torch.tensor([4, 1, 2]), V[:, :3]),
        rtol=1e-4,
        atol=0.0,
        check_inputs=[(X, torch.tensor([1, 1, -1]), V[:, :3])],
    )


def test_index_put_with_a_run_time_boolean_mask():
    def forward(x):
        y = x.clone()
        y.index_put_((x[:, :, 0] > 0,), torch.tensor(-1.0))
        return y

    assert_converts(Fn(forward), (X,), rtol=1e-4, atol=0.0)


def shifted_window_mask(x):
    """Swin's attention mask for shifted windows, built in forward from constants."""
    h = w = 8
    window, shift = 4, 2
    img_mask = torch.zeros((1, h, w, 1))
    cnt = 0
    for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            img_mask[:, hs, ws, :] = cnt
            cnt += 1
    windows = img_mask.view(1, h // window, window, w // window, window, 1).permute(0, 1, 3, 2, 4, 5)
    windows = windows.reshape(-1, window * window)
    mask = windows.unsqueeze(1) - windows.unsqueeze(2)
    mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    return (x.reshape(1, 4, 16, 16) + mask).softmax(-1)


def relative_position_table(x):
    """BEiT's relative-position index (with class-token rows) built in forward, used to
    gather a bias table."""
    wh = ww = 3
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += wh - 1
    rel[:, :, 1] += ww - 1
    rel[:, :, 0] *= 2 * ww - 1
    n = wh * ww + 1
    num = (2 * wh - 1) * (2 * ww - 1) + 3
    index = torch.zeros((n, n), dtype=rel.dtype)
    index[1:, 1:] = rel.sum(-1)
    index[0, 0:] = num - 3
    index[0:, 0] = num - 2
    index[0, 0] = num - 1
    table = torch.arange(num, dtype=torch.float32)[:, None] * torch.ones(1, 2)
    bias = table[index.view(-1)].view(n, n, 2).permute(2, 0, 1)
    return x.reshape(2, 10, 10) + bias


@pytest.mark.parametrize(
    "fn,shape",
    [(shifted_window_mask, (1, 4, 16, 16)), (relative_position_table, (2, 10, 10))],
    ids=["swin_shifted_window_mask", "beit_relative_position_index"],
)
def test_tables_built_in_forward_fold_to_constants(fn, shape):
    edge = assert_converts(Fn(fn), (torch.randn(shape),), rtol=1e-4, atol=0.0)
    assert not opcodes(edge) & {"SCATTER_ND", "CONCATENATION", "SELECT_V2", "GATHER"}
