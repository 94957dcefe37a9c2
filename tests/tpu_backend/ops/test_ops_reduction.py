"""Reduction and scan lowerings agree with PyTorch's CPU kernels."""

import jax
import jax.numpy as jnp
import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check

aten = torch.ops.aten
torch.manual_seed(0)

X = torch.randn(3, 4, 5)
INTS = torch.randint(-3, 4, (3, 4, 5))
TIES = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [float("nan"), 1.0, 0.0, 5.0, 5.0]])
BOOLS = X > 0


@pytest.mark.parametrize(
    "dim,keepdim",
    [
        (None, False),
        pytest.param([1], False, marks=pytest.mark.slow),
        ([0, 2], True),
        pytest.param([-1], True, marks=pytest.mark.slow),
        pytest.param([], False, marks=pytest.mark.slow),
    ],
)
def test_sum_mean_and_friends(dim, keepdim):
    check(aten.sum.dim_IntList, X, dim, keepdim)
    check(aten.sum.dim_IntList, INTS.int(), dim, keepdim)
    check(aten.sum.dim_IntList, BOOLS, dim, keepdim)
    check(aten.sum.dim_IntList, X, dim, keepdim, dtype=torch.float64)
    check(aten.mean.dim, X, dim, keepdim)
    check(aten.nansum.default, TIES, dim if dim is None or all(d in (0, 1, -1) for d in dim) else None, keepdim)
    check(aten.var.correction, X, dim, keepdim=keepdim)
    check(aten.std.correction, X, dim, correction=0, keepdim=keepdim)
    check(aten.var_mean.correction, X, dim, correction=2, keepdim=keepdim)
    check(aten.std_mean.correction, X, dim, keepdim=keepdim)
    check(aten.amax.default, X, dim or [], keepdim)
    check(aten.amin.default, INTS, dim or [], keepdim)
    check(aten.any.dims, BOOLS, dim, keepdim)
    check(aten.all.dims, INTS, dim, keepdim)
    check(aten.logsumexp.default, X, dim or [0, 1, 2], keepdim)
    check(aten.linalg_vector_norm.default, X, 2, dim, keepdim)
    check(aten.count_nonzero.dim_IntList, INTS, dim or [0])


def test_whole_tensor_reductions():
    for op in (
        aten.sum.default,
        aten.prod.default,
        aten.max.default,
        aten.min.default,
        aten.all.default,
        aten.any.default,
    ):
        check(op, INTS)
        check(op, X)
    check(aten.mean.default, X)
    check(aten.mean.default, INTS, dtype=torch.float32)
    check(aten.prod.dim_int, INTS, 1, True)
    check(aten.prod.dim_int, X, -1)
    check(aten.aminmax.default, X, dim=1)
    check(aten.aminmax.default, X)
    check(aten.count_nonzero.default, INTS)
    check(aten.median.default, X)
    check(aten.nanmedian.default, TIES)
    check(aten.max.default, TIES)


@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, float("inf"), float("-inf")])
def test_vector_norms(ord):
    check(aten.linalg_vector_norm.default, X, ord, [1, 2], rtol=1e-4)
    check(aten.norm.ScalarOpt_dim, X, ord, [1], True, rtol=1e-4)


def test_arg_and_indexed_extremes_pick_first_and_propagate_nan():
    for x in (X, TIES, INTS):
        check(aten.argmax.default, x)
        check(aten.argmin.default, x, 1)
        check(aten.argmax.default, x, -1, True)
        check(aten.max.dim, x, 1)
        check(aten.min.dim, x, 0, True)
    check(aten.argmax.default, torch.tensor(3.0))
    check(aten.max.dim, torch.tensor(3.0), 0)


@pytest.mark.parametrize("dim", [pytest.param(0, marks=pytest.mark.slow), -1])
def test_scans(dim):
    check(aten.cumsum.default, X, dim)
    check(aten.cumsum.default, INTS.int(), dim)
    check(aten.cumsum.default, BOOLS, dim, dtype=torch.float32)
    check(aten.cumprod.default, X, dim)
    check(aten.logcumsumexp.default, X, dim, rtol=1e-4)
    check(aten.cummax.default, X, dim)
    check(aten.cummin.default, INTS, dim)
    check(aten.cummax.default, TIES, 1)
    check(aten.cummin.default, TIES, 1)


def test_order_statistics():
    check(aten.kthvalue.default, X, 2, 1)
    check(aten.kthvalue.default, X, 1, -1, True)
    check(aten.median.dim, X, 1)
    check(aten.median.dim, torch.randn(3, 6), 1, True)
    check(aten.median.dim, TIES, 1)
    check(aten.nanmedian.dim, TIES, 1)
    check(aten.mode.default, torch.tensor([[1, 2, 2, 3, 3], [4, 4, 1, 1, 0]]), 1)
    check(aten.mode.default, INTS, 0, True)


def test_mode_counts_nans_as_one_value():
    """ATen sorts NaNs together: two NaNs outnumber a single 1, one NaN does not hide the 1s
    (it used to make the value NaN and the index -1)."""
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor(
        [[3.0, 1, 1, 2, nan, 1], [nan, nan, 1, 2, 3, 4], [-1e6, 0, 0, inf, -inf, nan], [nan, 5, nan, 5, 2, 2]]
    )
    values, indices = torch.mode(rows.to("tpu"), 1)
    expected = torch.mode(rows, 1).values
    torch.testing.assert_close(values.cpu(), expected, equal_nan=True)
    picked = rows.gather(1, indices.cpu()[:, None])[:, 0]  # ATen's index is any one of the value's places
    torch.testing.assert_close(picked, expected, equal_nan=True)


def test_norm_variants():
    check(aten.dist.default, X, X.flip(0), 1.5, rtol=1e-4)
    check(aten.renorm.default, X, 2, 1, 1.5, rtol=1e-4)


def test_hash_tensor_xors_64_bit_patterns():
    """Floats widened to float64, integers and bools to int64, XOR-reduced as uint64 (ATen's mode 0)."""
    x = torch.tensor([[1.5, -0.0, float("nan")], [float("inf"), 1e-40, -3.25]])
    check(aten.hash_tensor.default, x)
    check(aten.hash_tensor.default, x, [1], keepdim=True)
    check(aten.hash_tensor.default, torch.tensor([[-1, 7], [3, 0]], dtype=torch.int32), [0])
    check(aten.hash_tensor.default, torch.tensor([True, False, True]))
    assert_lowers_for_tpu(aten.hash_tensor.default, x, [0])


def test_logcumsumexp_grad_lowers_for_tpu():
    from tpu_backend.ops.reduction import logcumsumexp_grad

    spec = jax.ShapeDtypeStruct((4, 7), jnp.float32)
    jax.export.export(jax.jit(lambda g, x: logcumsumexp_grad(g, x, 1)), platforms=["tpu"])(spec, spec)
