"""Sorting, searching and unique lowerings agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import check, run_lowering

from tpu_backend.ops import DATA_DEPENDENT

aten = torch.ops.aten
torch.manual_seed(0)

WITH_NAN_AND_TIES = torch.tensor([[3.0, float("nan"), 1.0, 3.0, -2.0, 1.0], [0.0, 5.0, 5.0, float("nan"), -1.0, 2.0]])
INTS = torch.randint(-4, 4, (3, 7))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_stable_sort(descending, dim):
    for x in (WITH_NAN_AND_TIES, INTS, INTS > 0):
        check(aten.sort.stable, x, stable=True, dim=dim, descending=descending)


def test_topk():
    x = torch.randn(4, 9)
    check(aten.topk.default, x, 3)
    check(aten.topk.default, x, 2, 0, False)
    # With ties ATen does not define which index topk reports: compare values only.
    values, _ = run_lowering(aten.topk.default, INTS.float(), 2, 1)
    torch.testing.assert_close(values, torch.topk(INTS.float(), 2, 1).values)
    check(aten.sort.default, x, 0, True)


def test_search():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0])
    values = torch.tensor([[0.0, 2.0, 6.0], [2.0, 1.0, 5.0]])
    check(aten.searchsorted.Tensor, seq, values)
    check(aten.searchsorted.Tensor, seq, values, right=True)
    check(aten.searchsorted.Tensor, seq, values, side="right", out_int32=True)
    check(aten.searchsorted.Tensor, torch.sort(torch.randn(2, 5)).values, torch.randn(2, 3))
    check(aten.searchsorted.Tensor, torch.tensor([5.0, 1.0, 2.0]), values, sorter=torch.tensor([1, 2, 0]))
    check(aten.searchsorted.Scalar, seq, 2.0)
    check(aten.bucketize.Tensor, values, seq)
    check(aten.bucketize.Tensor, values, seq, right=True, out_int32=True)


def test_bucketize_a_number():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0])
    for value in (0.0, 2.0, 3.5, 9.0):
        check(aten.bucketize.Scalar, value, seq)
        check(aten.bucketize.Scalar, value, seq, right=True, out_int32=True)
    check(aten.bucketize.Scalar, 2.5, torch.tensor([1, 2, 3]))  # a float between integer boundaries
    check(aten.bucketize.Scalar, 2, torch.tensor([1, 2, 3]), right=True)
    on_device = torch.bucketize(3.5, seq.to("tpu"))  # what a user writes
    assert on_device.device.type == "tpu" and on_device.item() == torch.bucketize(3.5, seq).item() == 3


def test_histc():
    x = torch.randn(100)
    check(aten.histc.default, x, 10, -1.0, 1.0)
    check(aten.histc.default, x, 7)
    check(aten.histc.default, torch.tensor([1.0, 1.0, 1.0]), 4)


def test_unique_family_runs_eagerly():
    for op in (aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default, aten.bincount.default):
        assert op in DATA_DEPENDENT
    x = torch.tensor([[3, 1, 3], [2, 1, 3], [3, 1, 3]])
    check(aten._unique2.default, x, True, True, True, jit=False)
    check(aten._unique2.default, x.float(), True, False, False, jit=False)
    check(aten.unique_dim.default, x, 0, True, True, True, jit=False)
    check(aten.unique_consecutive.default, torch.tensor([1, 1, 2, 2, 2, 1, 3]), True, True, jit=False)
    check(aten.unique_consecutive.default, x, True, True, 0, jit=False)
    check(aten.bincount.default, torch.tensor([0, 3, 3, 1]), None, 6, jit=False)
    check(aten.bincount.default, torch.tensor([0, 3, 3, 1]), torch.tensor([0.5, 1.0, 2.0, 1.5]), jit=False)


def test_isin():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    check(aten.isin.Tensor_Tensor, x, torch.tensor([2, 6, 9]))
    check(aten.isin.Tensor_Tensor, x, torch.tensor([2, 6]), invert=True)
    check(aten.isin.Tensor_Scalar, x, 5)
    check(aten.isin.Scalar_Tensor, 3, x)
