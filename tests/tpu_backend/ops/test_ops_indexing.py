"""Indexing, gather/scatter and embedding lowerings agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check, run_lowering

from tpu_backend.ops import DATA_DEPENDENT, DATA_DEPENDENT_WHEN

aten = torch.ops.aten
torch.manual_seed(0)

X = torch.randn(4, 5, 6)
I2 = torch.tensor([[0, 3], [2, 1]])


@pytest.mark.parametrize(
    "indices",
    [
        [torch.tensor([0, 2, 3])],
        [None, torch.tensor([4, 0])],
        [I2, None, torch.tensor([[5], [0]])],  # separated advanced indices move to the front
        [None, I2, torch.tensor([1, 5])],
        [torch.tensor(1), torch.tensor([0, 1])],
        [torch.tensor([-1, 0])],
    ],
    ids=["leading", "middle", "separated", "adjacent", "scalar", "negative"],
)
def test_advanced_index_and_index_put(indices):
    out = check(aten.index.Tensor, X, indices)
    check(aten.index_put.default, X, indices, torch.randn(out.shape))
    check(aten.index_put.default, X, indices, torch.tensor(2.5), True)
    check(aten._index_put_impl.default, X, indices, torch.randn(out.shape[-1:]), True)


def test_bool_mask_indexing_is_marked_data_dependent_and_runs_eagerly():
    mask = X[:, :, 0] > 0
    predicate = DATA_DEPENDENT_WHEN[aten.index.Tensor]
    assert predicate((X, [mask]), {}) and not predicate((X, [torch.tensor([0])]), {})
    check(aten.index.Tensor, X, [mask], jit=False)
    check(aten.index_put.default, X, [mask], torch.randn(int(mask.sum()), 6), jit=False)
    # x[mask] = scalar needs no host values: it is a where, traced as usual.
    assert not DATA_DEPENDENT_WHEN[aten.index_put.default]((X, [mask], torch.tensor(1.0)), {})
    check(aten.index_put.default, X, [mask], torch.tensor(-1.0))
    check(aten.index_put.default, X, [mask], torch.tensor(-1.0), True)


def test_index_family():
    idx = torch.tensor([3, 0, 3])
    check(aten.index_select.default, X, 1, idx)
    check(aten.index_select.default, X, -1, torch.tensor(2))
    check(aten.index_add.default, X, 1, idx, torch.randn(4, 3, 6), alpha=2.0)
    check(aten.index_copy.default, X, 2, torch.tensor([5, 1]), torch.randn(4, 5, 2))
    check(aten.index_fill.int_Scalar, X, 0, torch.tensor([1, 2]), -3.0)
    check(aten.index_fill.int_Tensor, X, 2, torch.tensor([0]), torch.tensor(7.0))
    check(aten.take.default, X, torch.tensor([[0, 119], [5, 60]]))
    check(aten.put.default, X, torch.tensor([0, 119, 5]), torch.tensor([1.0, 2.0, 3.0]))
    check(aten.put.default, X, torch.tensor([0, 0, 5]), torch.tensor([1.0, 2.0, 3.0]), True)


@pytest.mark.parametrize("dim", [pytest.param(0, marks=pytest.mark.slow), 1, pytest.param(-1, marks=pytest.mark.slow)])
def test_gather_and_scatter(dim):
    index = torch.randint(0, X.shape[dim], (3, 4, 5))
    unique_index = torch.argsort(torch.rand(X.shape), dim=dim)[:3, :4, :5]  # scatter without collisions
    src = torch.randn(4, 5, 6)
    check(aten.gather.default, X, dim, index)
    check(aten.scatter.src, X, dim, unique_index, src)
    check(aten.scatter.value, X, dim, unique_index, 1.5)
    check(aten.scatter_add.default, X, dim, index, src)
    check(aten.scatter.reduce, X, dim, index, src, reduce="add")
    check(aten.scatter.reduce, X, dim, index, src, reduce="multiply")
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(aten.scatter_reduce.two, X, dim, index, src, reduce, include_self=include_self, rtol=1e-4)


def test_integer_scatter_reduce_mean():
    x = torch.randint(0, 10, (6,))
    check(aten.scatter_reduce.two, x, 0, torch.tensor([0, 0, 2]), torch.tensor([3, 4, 9]), "mean")


def test_masked_ops_and_nonzero():
    mask = torch.rand(4, 5, 6) > 0.5
    assert aten.masked_select.default in DATA_DEPENDENT and aten.nonzero.default in DATA_DEPENDENT
    check(aten.masked_select.default, X, mask, jit=False)
    check(aten.masked_select.default, X, mask[0, :, :1], jit=False)  # broadcast mask
    check(aten.nonzero.default, mask, jit=False)
    check(aten.nonzero.default, torch.zeros(3, 2), jit=False)
    check(aten.masked_scatter.default, X, mask, torch.randn(200))
    out = run_lowering(aten.nonzero_static.default, mask.reshape(-1)[:10], size=8)
    torch.testing.assert_close(out, torch.nonzero_static(mask.reshape(-1)[:10], size=8))


def test_view_scatters():
    check(aten.select_scatter.default, X, torch.randn(4, 6), 1, -2)
    check(aten.slice_scatter.default, X, torch.randn(4, 2, 6), 1, 1, 5, 2)
    check(aten.slice_scatter.default, X, torch.randn(4, 5, 3), -1, None, -3)
    check(aten.slice_scatter.default, X, torch.randn(2, 5, 6), 0, 2, 100)
    check(aten.select_backward.default, torch.randn(4, 6), [4, 5, 6], 1, -2)
    check(aten.slice_backward.default, torch.randn(4, 2, 6), [4, 5, 6], 1, 1, 5, 2)
    check(aten.slice_backward.default, torch.randn(2, 5, 6), [4, 5, 6], 0, 2, 9223372036854775807, 1)
    for offset, dims in [(0, (0, 1)), (1, (1, 2)), (-2, (2, 0))]:
        diag = torch.diagonal(X, offset, *dims)
        check(aten.diagonal_scatter.default, X, torch.randn(diag.shape), offset, *dims)
    check(aten.as_strided_scatter.default, torch.randn(6, 4), torch.randn(3, 2), [3, 2], [4, 2], 1)


@pytest.mark.parametrize("padding_idx,scale", [(-1, False), (2, False), (-1, True)])
def test_embedding_and_backward(padding_idx, scale):
    weight = torch.randn(10, 4)
    indices = torch.tensor([[1, 2, 2], [9, 0, 2]])
    out = check(aten.embedding.default, weight, indices, padding_idx)
    check(aten.embedding_dense_backward.default, torch.randn(out.shape), indices, 10, padding_idx, scale)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0, float("inf")])
def test_embedding_renorm(norm_type):
    """Rows named by the indices (repeats too) with a norm over max_norm are scaled to it."""
    weight = torch.randn(10, 4) * 2
    indices = torch.tensor([[1, 2, 2], [9, 0, 2]])
    renormed = check(aten.embedding_renorm.default, weight, indices, 1.0, norm_type)
    assert torch.equal(renormed[3], weight[3])  # not named: untouched
    assert_lowers_for_tpu(aten.embedding_renorm.default, weight, indices, 1.0, norm_type)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    check(
        aten.index_reduce.default,
        X,
        1,
        torch.tensor([0, 4, 0, 2]),
        torch.randn(4, 4, 6),
        reduce,
        include_self=include_self,
        rtol=1e-4,
    )


def test_zero_dim_inputs():
    s = torch.tensor(2.5)
    check(aten.index_select.default, s, 0, torch.tensor([0]))
    check(aten.index_select.default, s, 0, torch.tensor(0))
    check(aten.index_add.default, s, 0, torch.tensor([0]), torch.tensor(1.0))
    check(aten.index_copy.default, s, 0, torch.tensor([0]), torch.tensor(7.0))
    check(aten.index_fill.int_Scalar, s, 0, torch.tensor([0]), -1.0)
    check(aten.nonzero.default, s, jit=False)
    check(aten.nonzero.default, torch.tensor(0.0), jit=False)


def test_index_reduce_on_a_scalar():
    check(aten.index_reduce.default, torch.tensor(2.0), 0, torch.tensor([0]), torch.tensor(3.0), "prod")
