"""Matrix products, dense linear algebra and convolutions agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-4, rtol=1e-4)


def test_matrix_products():
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    check(aten.mm.default, a, b, **TOL)
    check(aten.addmm.default, c, a, b, **TOL)
    check(aten.addmm.default, torch.randn(5), a, b, beta=0.5, alpha=2, **TOL)
    check(aten.addmm.default, torch.full((3, 5), float("nan")), a, b, beta=0, **TOL)
    check(aten._addmm_activation.default, torch.randn(5), a, b, **TOL)
    check(aten._addmm_activation.default, torch.randn(5), a, b, use_gelu=True, **TOL)
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    check(aten.bmm.default, x, y, **TOL)
    check(aten.baddbmm.default, torch.randn(2, 3, 5), x, y, beta=2, alpha=0.5, **TOL)
    check(aten.addbmm.default, c, x, y, **TOL)
    check(aten.mv.default, a, torch.randn(4), **TOL)
    check(aten.addmv.default, torch.randn(3), a, torch.randn(4), alpha=3, **TOL)
    check(aten.addr.default, c, torch.randn(3), torch.randn(5), **TOL)
    check(aten.dot.default, torch.randn(7), torch.randn(7), **TOL)
    check(aten.mm.default, torch.randint(-3, 3, (3, 4)), torch.randint(-3, 3, (4, 2)))
    check(aten.linalg_cross.default, torch.randn(4, 3), torch.randn(1, 3), **TOL)


def spd(n=4, batch=(2,)):
    a = torch.randn(*batch, n, n)
    return a @ a.transpose(-1, -2) + n * torch.eye(n)


def test_dense_linear_algebra():
    a = spd()
    check(aten.linalg_inv_ex.default, a, **TOL)
    check(aten.linalg_cholesky_ex.default, a, **TOL)
    check(aten.linalg_cholesky_ex.default, a, upper=True, **TOL)
    det = run_lowering(aten._linalg_det.default, a)[0]
    torch.testing.assert_close(det, torch.linalg.det(a), **TOL)
    sign, logabsdet = run_lowering(aten._linalg_slogdet.default, a)[:2]
    torch.testing.assert_close(logabsdet, torch.linalg.slogdet(a).logabsdet, **TOL)
    b = torch.randn(2, 4, 3)
    torch.testing.assert_close(run_lowering(aten._linalg_solve_ex.default, a, b)[0], torch.linalg.solve(a, b), **TOL)
    torch.testing.assert_close(run_lowering(aten._linalg_solve_ex.default, a, torch.randn(2, 4))[0].shape, torch.Size([2, 4]))
    q, r = run_lowering(aten.linalg_qr.default, torch.randn(5, 3))
    assert q.shape == (5, 3) and r.shape == (3, 3)
    lower = torch.linalg.cholesky(a)
    check(aten.linalg_solve_triangular.default, lower, b, upper=False, **TOL)
    check(aten.linalg_solve_triangular.default, lower.transpose(-1, -2), b.transpose(-1, -2), upper=True, left=False, **TOL)
    check(aten.triangular_solve.default, b, lower, False, **TOL)
    check(aten.cholesky_solve.default, b, lower, **TOL)
    check(aten.cholesky_inverse.default, lower[0], **TOL)
    values, _ = run_lowering(aten._linalg_eigh.default, a)
    torch.testing.assert_close(values, torch.linalg.eigvalsh(a), **TOL)
    _, s, _ = run_lowering(aten._linalg_svd.default, torch.randn(4, 3))


CONVS = [
    # (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 3, 9), (4, 3, 3), [1], [0], [1], False, [0], 1),
    ((2, 4, 10, 9), (6, 2, 3, 3), [2, 1], [1, 2], [1, 2], False, [0, 0], 2),
    ((2, 4, 8, 8), (4, 1, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 4),  # depthwise
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 1), [1, 2, 1], [1, 0, 0], [1, 1, 1], False, [0, 0, 0], 1),
    ((2, 4, 5, 5), (4, 3, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 0], 1),
    ((2, 4, 5, 6), (4, 2, 3, 2), [2, 3], [0, 1], [2, 1], True, [1, 2], 2),
    ((2, 3, 7), (3, 2, 4), [3], [2], [1], True, [2], 1),
]


@pytest.mark.parametrize("case", CONVS, ids=[f"{c[0]}-{c[1]}-t{c[5]}-g{c[7]}" for c in CONVS])
def test_convolution_forward_and_backward(case):
    shape, wshape, stride, padding, dilation, transposed, output_padding, groups = case
    x, w = torch.randn(*shape), torch.randn(*wshape) * 0.3
    bias = torch.randn(wshape[1] * groups if transposed else wshape[0])
    args = (stride, padding, dilation, transposed, output_padding, groups)
    out = check(aten.convolution.default, x, w, bias, *args, **TOL)
    grad = torch.randn(out.shape)
    check(aten.convolution_backward.default, grad, x, w, list(bias.shape), *args, [True, True, True], **TOL)
    partial = run_lowering(aten.convolution_backward.default, grad, x, w, None, *args, [False, True, False])
    assert partial[0] is None and partial[2] is None


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, float("inf"), 3.0])
def test_pairwise_distances(p):
    a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    dist = check(aten._cdist_forward.default, a, b, p, None, **TOL)
    if p != 0.0:
        check(aten._cdist_backward.default, torch.randn(dist.shape), a, b, p, dist, **TOL)
    check(aten._pdist_forward.default, torch.randn(5, 3), p, **TOL)


def test_pdist_backward():
    x = torch.randn(5, 3)
    dist = torch.ops.aten._pdist_forward.default(x, 2.0)
    check(aten._pdist_backward.default, torch.randn(dist.shape), x, 2.0, dist, **TOL)


def test_matrix_exp():
    check(aten.linalg_matrix_exp.default, torch.randn(2, 3, 3) * 0.5, **TOL)
