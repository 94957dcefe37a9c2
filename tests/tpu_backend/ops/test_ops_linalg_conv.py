"""Matrix products, dense linear algebra and convolutions agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import assert_lowers_for_tpu, check, run_lowering

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


def general(n=4, batch=(2,)):
    """Well-conditioned, not symmetric, with determinants of both signs in the batch."""
    a = torch.randn(*batch, n, n) * 0.3 + torch.eye(n) * 2
    a[0, [0, 1]] = a[0, [1, 0]]  # a row swap flips the first determinant's sign
    return a


def assert_small(value: torch.Tensor, bound: float, what: str) -> None:
    worst = value.abs().max().item()
    assert worst <= bound, f"{what}: max |.| = {worst:.3g} > {bound:g}"


def test_dense_linear_algebra():
    a = spd()
    check(aten.linalg_inv_ex.default, a, **TOL)
    check(aten.linalg_cholesky_ex.default, a, **TOL)
    check(aten.linalg_cholesky_ex.default, a, upper=True, **TOL)
    lower = torch.linalg.cholesky(a)
    b = torch.randn(2, 4, 3)
    check(aten.linalg_solve_triangular.default, lower, b, upper=False, **TOL)
    check(
        aten.linalg_solve_triangular.default,
        lower.transpose(-1, -2),
        b.transpose(-1, -2),
        upper=True,
        left=False,
        **TOL,
    )
    check(aten.triangular_solve.default, b, lower, False, **TOL)
    check(aten.cholesky_solve.default, b, lower, **TOL)
    check(aten.cholesky_inverse.default, lower[0], **TOL)


def test_determinants_against_float64():
    g = general()
    assert (torch.linalg.det(g.double()) < 0).any() and (torch.linalg.det(g.double()) > 0).any()
    det = run_lowering(aten._linalg_det.default, g)[0]
    torch.testing.assert_close(det.double(), torch.linalg.det(g.double()), **TOL)
    sign, logabsdet = run_lowering(aten._linalg_slogdet.default, g)[:2]
    want = torch.linalg.slogdet(g.double())
    torch.testing.assert_close(sign.double(), want.sign, rtol=0, atol=0)
    torch.testing.assert_close(logabsdet.double(), want.logabsdet, **TOL)


@pytest.mark.parametrize("rhs", [(2, 4, 3), (2, 4)], ids=["matrix", "vector"])
def test_solve_residual_and_float64_solution(rhs):
    g, b = general(), torch.randn(*rhs)
    x = run_lowering(aten._linalg_solve_ex.default, g, b)[0]
    assert x.shape == b.shape
    matrix_x = x if len(rhs) == 3 else x.unsqueeze(-1)
    matrix_b = b if len(rhs) == 3 else b.unsqueeze(-1)
    assert_small(g.double() @ matrix_x.double() - matrix_b.double(), 1e-4, "residual g @ x - b")
    torch.testing.assert_close(x.double(), torch.linalg.solve(g.double(), b.double()), **TOL)


@pytest.mark.parametrize("shape, mode", [((5, 3), "reduced"), ((5, 3), "complete"), ((2, 3, 4), "reduced")])
def test_qr_reconstructs_with_orthonormal_q_and_triangular_r(shape, mode):
    m = torch.randn(*shape)
    q, r = run_lowering(aten.linalg_qr.default, m, mode)
    want_q, want_r = torch.linalg.qr(m, mode=mode)
    assert q.shape == want_q.shape and r.shape == want_r.shape
    q64, r64 = q.double(), r.double()
    assert_small(q64 @ r64 - m.double(), 1e-5, "q @ r - m")
    eye = torch.eye(q.shape[-1], dtype=torch.float64)
    assert_small(q64.transpose(-1, -2) @ q64 - eye, 1e-5, "q^T q - I")
    assert_small(torch.tril(r64, -1), 0.0, "r below its diagonal")
    # unique up to the signs of r's diagonal: |r| equals the float64 reference's
    torch.testing.assert_close(r64.abs(), torch.linalg.qr(m.double(), mode=mode).R.abs(), **TOL)


def test_eigh_values_and_vectors():
    a = spd()
    values, vectors = run_lowering(aten._linalg_eigh.default, a)
    torch.testing.assert_close(values.double(), torch.linalg.eigvalsh(a.double()), **TOL)
    v64 = vectors.double()
    scale = a.abs().max().item()
    assert_small(a.double() @ v64 - v64 * values.double()[..., None, :], 1e-5 * scale, "a v - v diag(w)")
    assert_small(v64.transpose(-1, -2) @ v64 - torch.eye(4, dtype=torch.float64), 1e-5, "v^T v - I")


@pytest.mark.parametrize("shape, full", [((4, 3), False), ((3, 5), False), ((2, 4, 3), True)])
def test_svd_reconstructs_with_float64_singular_values(shape, full):
    m = torch.randn(*shape)
    u, s, vh = run_lowering(aten._linalg_svd.default, m, full)
    want = torch.linalg.svd(m.double(), full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (want.U.shape, want.S.shape, want.Vh.shape)
    torch.testing.assert_close(s.double(), want.S, **TOL)
    k = s.shape[-1]
    u64, vh64 = u.double()[..., :k], vh.double()[..., :k, :]
    assert_small(u64 @ torch.diag_embed(s.double()) @ vh64 - m.double(), 1e-5, "u diag(s) vh - m")
    for name, basis in (("u", u.double()), ("v", vh.double().transpose(-1, -2))):
        eye = torch.eye(basis.shape[-1], dtype=torch.float64)
        assert_small(basis.transpose(-1, -2) @ basis - eye, 1e-5, f"{name}^T {name} - I")


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
    a = (torch.randn(3, 3) * 0.5).bfloat16()  # computed in float32, rounded once
    expected = torch.linalg.matrix_exp(a.double())
    torch.testing.assert_close(run_lowering(aten.linalg_matrix_exp.default, a).double(), expected, rtol=8e-3, atol=8e-3)


def test_integer_products_truncate_alpha_and_beta():
    # ATen converts alpha and beta to the integer dtype first (0.6 -> 0, 2.7 -> 2)
    x, m, v = torch.randint(-9, 9, (5,)), torch.randint(-9, 9, (5, 10)), torch.randint(-9, 9, (10,))
    b1, b2 = torch.randint(-9, 9, (3, 5, 4)), torch.randint(-9, 9, (3, 4, 6))
    for beta, alpha in ((0.2, 0.6), (2.7, -1.5), (1, 3)):
        check(aten.addmv.default, x, m, v, beta=beta, alpha=alpha, atol=0, rtol=0)
        check(aten.addmm.default, m[:, :5], m[:, :5], m[:, 5:], beta=beta, alpha=alpha, atol=0, rtol=0)
        check(aten.baddbmm.default, torch.randint(-9, 9, (3, 5, 6)), b1, b2, beta=beta, alpha=alpha, atol=0, rtol=0)
        check(aten.addbmm.default, torch.randint(-9, 9, (5, 6)), b1, b2, beta=beta, alpha=alpha, atol=0, rtol=0)
    check(aten.addr.default, m, x, v, beta=2, alpha=-3, atol=0, rtol=0)
    with pytest.raises(ValueError, match="aten.addr: for integral input tensors, argument beta must not be a float"):
        run_lowering(aten.addr.default, m, x, v, beta=0.2)


@pytest.mark.parametrize("n", [1, 5, 9])
def test_ldl_factor_matches_lapack_pivots_and_solve(n):
    """Bunch-Kaufman LDL^T as LAPACK's sytrf: the same LD and pivots (1x1 and 2x2 blocks: a
    small diagonal forces 2x2 ones, a zero column sets info), and ldl_solve on them."""
    torch.manual_seed(n)
    a = torch.randn(4, n, n)
    a = a + a.mT
    a[1].diagonal().mul_(0.01)
    a[2, 0, 0] = 0
    a[3, :, 0] = a[3, 0, :] = 0
    check(aten.linalg_ldl_factor_ex.default, a, atol=1e-4, rtol=1e-4)
    ld, pivots, _ = aten.linalg_ldl_factor_ex.default(a)
    if n > 1:
        assert (pivots < 0).any()  # some 2x2 block was exercised
    b = torch.randn(4, n, 3)
    check(aten.linalg_ldl_solve.default, ld[:3], pivots[:3], b[:3], atol=1e-4, rtol=1e-4)
    assert_lowers_for_tpu(aten.linalg_ldl_factor_ex.default, a)
    assert_lowers_for_tpu(aten.linalg_ldl_solve.default, ld, pivots, b)


# (mat_a, mat_b) of `_grouped_mm`'s four layouts; offs cut 16 rows into 4 groups, one
# empty (ATen's CPU kernel wants 16-byte aligned rows: multiples of 8 bfloat16 values)
GROUPED_MM = {
    "rows x experts": ((16, 8), (4, 8, 24)),
    "weight gradient": ((8, 16), (16, 24)),
    "experts x columns": ((4, 24, 8), (8, 16)),
    "batched": ((4, 24, 8), (4, 8, 16)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", list(GROUPED_MM))
def test_grouped_mm_as_atens_kernel(layout, dtype):
    """transformers' MoE experts (`torch._grouped_mm`): every layout and dtype, against
    ATen's CPU kernel, and compiled for a v5e (XLA's ragged dot)."""
    shape_a, shape_b = GROUPED_MM[layout]
    a, b = torch.randn(shape_a).to(dtype), torch.randn(shape_b).to(dtype)
    offs = None if layout == "batched" else torch.tensor([3, 3, 9, 16], dtype=torch.int32)
    tolerance = TOL if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    check(aten._grouped_mm.default, a, b, offs, **tolerance)
    assert_lowers_for_tpu(aten._grouped_mm.default, a, b, offs)


def test_grouped_mm_rows_past_the_last_offset_are_zero():
    """ATen's kernel leaves rows past offs[-1] unwritten (transformers masks them after);
    the lowering writes 0 there and the rows before agree."""
    a, b, offs = torch.randn(16, 8), torch.randn(3, 8, 8), torch.tensor([5, 5, 11], dtype=torch.int32)
    actual = run_lowering(aten._grouped_mm.default, a, b, offs)
    torch.testing.assert_close(actual[:11], torch._grouped_mm(a, b, offs=offs)[:11], **TOL)
    assert actual[11:].abs().max() == 0
