"""Matrix products (mm, bmm, addmm, baddbmm, ...) and basic dense linear algebra.

Matrix products use JAX's default matmul precision, which follows
`torch.set_float32_matmul_precision` (default "highest": float32 products as on CPU;
"high"/"medium" allow 3 or 1 bfloat16 passes on a TPU; `tpu_backend/precision.py`).
`beta == 0` ignores `self` entirely (NaN in it does not propagate), as in ATen.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch
from jax.lax import linalg as lax_linalg

from tpu_backend import chip_limits
from tpu_backend.ops._common import (
    canonical_dim,
    is_array,
    is_floating,
    is_integral,
    is_static_number,
    jax_dtype,
    result_dtype,
)
from tpu_backend.ops.activation import gelu
from tpu_backend.ops.registry import lowers, torch_dtype

aten = torch.ops.aten


def _accumulator(x):
    """float32 for bfloat16/float16 operands (None: the operands' own dtype): the add*
    products below accumulate, scale and add in it and round once, as ATen's CPU gemm."""
    return jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None


def _scale_add(x, product, beta, alpha, like):
    """beta * x + alpha * product in ATen's dtype (that of x and the matrix `like`); beta == 0
    ignores x (even NaN in it). `product` may be wider (float32 for bfloat16 operands).

    beta and alpha may be traced scalars (the device passes Python floats dynamically),
    so only static values take the shortcuts. For integer results ATen first converts
    them to the result's dtype (alpha=0.6 truncates to 0), and so does this.
    """
    dtype = result_dtype(x, like)
    x = x.astype(product.dtype) if product.dtype != dtype else x
    if jnp.issubdtype(dtype, jnp.integer):
        alpha, beta = (int(v) if is_static_number(v) else jnp.asarray(v).astype(dtype) for v in (alpha, beta))
    if not (is_static_number(alpha) and alpha == 1):
        product = product * alpha
    if is_static_number(beta) and beta == 1:
        return (x + product).astype(dtype)
    scaled = jnp.where(beta == 0, jnp.zeros_like(x), x * beta)
    return (scaled + product).astype(dtype)


def _one_dtype(op: str, *operands) -> None:
    """ATen's products refuse operands of different dtypes (they do not promote: `float32 @
    int64` is a RuntimeError on CPU), and so does the device, rather than promote silently."""
    dtypes = [x.dtype for x in operands]
    if len(set(dtypes)) > 1:
        names = " != ".join(str(torch_dtype(d)) for d in dtypes)
        raise RuntimeError(f"aten.{op}: expected its operands to have the same dtype, but got: {names}")


@lowers(aten.mm.default)
def mm(x, mat2):
    _one_dtype("mm", x, mat2)
    return jnp.matmul(x, mat2)


@lowers(aten.mm.dtype, aten.bmm.dtype)
def mm_out_dtype(x, mat2, out_dtype):
    _one_dtype("mm", x, mat2)
    return jnp.matmul(x, mat2, preferred_element_type=jax_dtype(out_dtype)).astype(jax_dtype(out_dtype))


@lowers(aten.bmm.default)
def bmm(x, mat2):
    _one_dtype("bmm", x, mat2)
    return jnp.matmul(x, mat2)


# ragged_dot_general's dimension numbers for `_grouped_mm`'s two ragged layouts
_GROUPED_ROWS = jax.lax.RaggedDotDimensionNumbers(  # (S, K) x (G, K, N) -> (S, N)
    dot_dimension_numbers=(([1], [1]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
)
_GROUPED_CONTRACTION = jax.lax.RaggedDotDimensionNumbers(  # (K, S) x (S, N) -> (G, K, N)
    dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
)


def _ragged_dot(lhs, rhs, sizes, numbers, wide):
    """The ragged product accumulated in `wide`. Narrow operands: on a TPU as they are, at
    default precision (their products are exact in float32 anyway; asked for float32
    precision, the matmul setting's "highest", libtpu's ragged-dot kernel refuses bfloat16
    operands: "Bad lhs type"); JAX's CPU backend has no bfloat16 x bfloat16 -> float32
    ragged product, so there they widen first (exactly)."""

    def dot(lhs, rhs, precision=None):
        return jax.lax.ragged_dot_general(lhs, rhs, sizes, numbers, precision, preferred_element_type=wide)

    if lhs.dtype == wide:
        return dot(lhs, rhs)
    return jax.lax.platform_dependent(
        lhs,
        rhs,
        cpu=lambda lhs, rhs: dot(lhs.astype(wide), rhs.astype(wide)),
        default=lambda lhs, rhs: dot(lhs, rhs, jax.lax.Precision.DEFAULT),
    )


@lowers(aten._grouped_mm.default)
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Mixture-of-experts products (transformers' default experts implementation):
    `offs` (int32, cumulative) cuts the ragged dimension into one group per expert.
    (S, K) x (G, K, N) -> (S, N), rows of group g times expert g; (K, S) x (S, N) ->
    (G, K, N), the weight gradient; (G, M, K) x (K, S) -> (M, S); 3D x 3D is bmm. Rows
    past offs[-1] come out 0 (ATen's kernel leaves them unwritten). Products accumulate
    in float32 and round once, as ATen's."""
    if bias is not None:
        raise NotImplementedError("aten._grouped_mm: bias is not supported (nor by PyTorch's kernels); add it after")
    wide = _accumulator(mat_a) or mat_a.dtype
    dtype = jax_dtype(out_dtype) if out_dtype is not None else mat_a.dtype
    if mat_a.ndim == 3 and mat_b.ndim == 3:
        return jnp.matmul(mat_a, mat_b, preferred_element_type=wide).astype(dtype)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)
    if mat_a.ndim == 2 and mat_b.ndim == 3:
        product = _ragged_dot(mat_a, mat_b, sizes, _GROUPED_ROWS, wide)
    elif mat_a.ndim == 2:
        product = _ragged_dot(mat_a, mat_b, sizes, _GROUPED_CONTRACTION, wide)
    else:  # (G, M, K) x (K, S): the columns of mat_b grouped, the first layout transposed
        product = _ragged_dot(mat_b.T, jnp.swapaxes(mat_a, 1, 2), sizes, _GROUPED_ROWS, wide).T
    return product.astype(dtype)


@lowers(aten.addmm.default)
def addmm(x, mat1, mat2, *, beta=1, alpha=1):
    _one_dtype("addmm", x, mat1, mat2)
    return _scale_add(x, jnp.matmul(mat1, mat2, preferred_element_type=_accumulator(mat1)), beta, alpha, mat1)


@lowers(aten._addmm_activation.default)
def addmm_activation(x, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    out = addmm(x, mat1, mat2, beta=beta, alpha=alpha)
    if use_gelu:
        return gelu(out)
    return jnp.maximum(out, 0)


@lowers(aten.baddbmm.default)
def baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    _one_dtype("baddbmm", x, batch1, batch2)
    return _scale_add(x, jnp.matmul(batch1, batch2, preferred_element_type=_accumulator(batch1)), beta, alpha, batch1)


@lowers(aten.addbmm.default)
def addbmm(x, batch1, batch2, *, beta=1, alpha=1):
    _one_dtype("addbmm", x, batch1, batch2)
    product = jnp.einsum("bij,bjk->ik", batch1, batch2, preferred_element_type=_accumulator(batch1))
    return _scale_add(x, product, beta, alpha, batch1)


@lowers(aten.addmv.default)
def addmv(x, mat, vec, *, beta=1, alpha=1):
    _one_dtype("addmv", x, mat, vec)
    return _scale_add(x, jnp.matmul(mat, vec, preferred_element_type=_accumulator(mat)), beta, alpha, mat)


@lowers(aten.addr.default)
def addr(x, vec1, vec2, *, beta=1, alpha=1):
    for name, value in (("beta", beta), ("alpha", alpha)):
        if is_integral(x.dtype) and (isinstance(value, float) or (is_array(value) and is_floating(value.dtype))):
            raise ValueError(
                f"aten.addr: for integral input tensors, argument {name} must not be a floating point number"
            )
    if x.dtype == jnp.bool_:
        return (x & bool(beta)) | (bool(alpha) & jnp.outer(vec1, vec2))
    wide = _accumulator(vec1) or vec1.dtype
    return _scale_add(x, jnp.outer(vec1.astype(wide), vec2.astype(wide)), beta, alpha, vec1)


@lowers(aten.mv.default)
def mv(x, vec):
    _one_dtype("mv", x, vec)
    return jnp.matmul(x, vec)


@lowers(aten.dot.default, aten.vdot.default)
def dot(x, other):
    _one_dtype("dot", x, other)
    return jnp.dot(x, other)


@lowers(aten.linalg_cross.default)
def linalg_cross(x, other, *, dim=-1):
    shape = jnp.broadcast_shapes(x.shape, other.shape)
    axis = canonical_dim(dim, len(shape))
    return jnp.cross(jnp.broadcast_to(x, shape), jnp.broadcast_to(other, shape), axis=axis)


# --- dense linear algebra (jnp.linalg) ---------------------------------------------------


def _info(matrix, bad):
    """LAPACK-style `info`: 0 where the batch element succeeded (int32, batch shape)."""
    return jnp.where(bad, 1, 0).astype(jnp.int32).reshape(matrix.shape[:-2])


@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    inverse = jnp.linalg.inv(a)
    return inverse, _info(a, jnp.any(~jnp.isfinite(inverse), axis=(-2, -1)))


@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    lower = jnp.linalg.cholesky(a)
    failed = jnp.any(jnp.isnan(lower), axis=(-2, -1))
    out = jnp.swapaxes(lower, -1, -2).conj() if upper else lower
    return out, _info(a, failed)


@lowers(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    return jnp.linalg.qr(a, mode=mode)


@lowers(aten._linalg_det.default)
def linalg_det(a):
    """(det, LU, pivots): LU and pivots factor A^T, as ATen does for a contiguous A (its
    backward then solves with them as factors of A^T; device tensors are contiguous)."""
    lu, pivots, _ = _lu(jnp.swapaxes(a, -1, -2))
    return jnp.linalg.det(a), lu, pivots


def _lu(a):
    """LU factors and LAPACK-style 1-based int32 pivots."""
    lu, pivots, permutation = lax_linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), permutation


@lowers(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    sign, logabsdet = jnp.linalg.slogdet(a)
    lu, pivots, _ = _lu(jnp.swapaxes(a, -1, -2))  # of A^T, as in linalg_det
    return sign, logabsdet, lu, pivots


@lowers(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, pivots, _ = _lu(a)
    vector_rhs = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    if left:
        result = jnp.linalg.solve(a, b[..., None])[..., 0] if vector_rhs else jnp.linalg.solve(a, b)
    else:
        result = jnp.swapaxes(jnp.linalg.solve(jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2)), -1, -2)
    return result, lu, pivots, _info(a, jnp.any(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0, axis=-1))


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if left:
        return jsl.solve_triangular(a, b, lower=not upper, unit_diagonal=unitriangular)
    transposed = jsl.solve_triangular(
        jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2), lower=upper, unit_diagonal=unitriangular
    )
    return jnp.swapaxes(transposed, -1, -2)


@lowers(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    solution = jsl.solve_triangular(a, b, lower=not upper, trans=1 if transpose else 0, unit_diagonal=unitriangular)
    return solution, a


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    # JAX's expm has no bfloat16/float16 form: compute in float32 and round once
    if a.dtype in (jnp.bfloat16, jnp.float16):
        return jsl.expm(a.astype(jnp.float32)).astype(a.dtype)
    return jsl.expm(a)


@lowers(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    eigenvalues, eigenvectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return eigenvalues, eigenvectors if compute_v else jnp.zeros((0,), a.dtype)


def _svd(a, full_matrices=False, compute_uv=True):
    """`jnp.linalg.svd`, but safe to compile for a TPU.

    JAX's TPU SVD (QDWH, `jax._src.tpu.linalg.svd`) is expanded when the program is
    lowered, after the device's `jax_enable_x64` has made its loop indices int64; XLA's TPU
    compiler then aborts the whole process ("Check failed: buffer != nullptr" in
    TransposeFolding; float32, every shape tried; `tools/tpu_op_sweep.py`). Traced here,
    with 32-bit indices, the same algorithm compiles. float64 never gets here on a TPU
    (`chip_limits`: it runs on the host)."""
    if not chip_limits.targets_tpu() or a.dtype not in (jnp.float32, jnp.complex64) or 0 in a.shape[-2:]:
        return jnp.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    from jax._src.tpu.linalg import svd as tpu_svd  # private: the pinned JAX range is tested

    decompose = functools.partial(tpu_svd.svd, full_matrices=full_matrices, compute_uv=compute_uv)
    for _ in a.shape[:-2]:
        decompose = jax.vmap(decompose)
    with jax.enable_x64(False):
        return decompose(a)


def _pinv(a, rtol=None):
    """`jnp.linalg.pinv` from `_svd`: singular values at or below rtol * s_max count as zero."""
    u, s, vh = _svd(a, full_matrices=False)
    m, n = a.shape[-2:]
    rtol = 10.0 * max(m, n) * jnp.finfo(s.dtype).eps if rtol is None else rtol
    cutoff = jnp.asarray(rtol, s.dtype)[..., None] * jnp.max(s, axis=-1, keepdims=True)
    inverse = jnp.where(s > cutoff, 1 / jnp.where(s > cutoff, s, 1), 0).astype(a.dtype)
    return jnp.matmul(jnp.swapaxes(vh, -1, -2).conj() * inverse[..., None, :], jnp.swapaxes(u, -1, -2).conj())


@lowers(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return jnp.zeros((0,), a.dtype), _svd(a, compute_uv=False), jnp.zeros((0,), a.dtype)
    return _svd(a, full_matrices=full_matrices)


@lowers(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    return jsl.cho_solve((factor, not upper), b)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return jsl.cho_solve((factor, not upper), eye)


# --- LU, QR (Householder) and least squares ---------------------------------------------
# JAX's LU uses partial pivoting as LAPACK's getrf does, so LU and pivots match PyTorch's
# (pivots are LAPACK's 1-based row swaps, int32) wherever the pivot choice has no ties.


def _broadcast_batch(a, b):
    """`a` and `b` with their batch dims (all but the last two) broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _pivots_to_permutation(pivots, rows):
    """Row order `perm` with A[perm] = L @ U, from LAPACK's 1-based sequential swaps."""
    return lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, rows)


def _permutation_matrix(perm, dtype):
    """P with A = P @ L @ U, i.e. P[perm[i], i] = 1."""
    return jnp.swapaxes(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype), -1, -2)


def _unpack_lu(lu):
    """(L, U) of a packed LU: L unit lower (m x k), U upper (k x n), k = min(m, n)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("aten.linalg_lu_factor_ex: LU without pivoting is not implemented (as on CPU)")
    lu, pivots, _ = _lu(a)
    singular = jnp.any(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0, axis=-1)
    return lu, pivots, _info(a, singular)


@lowers(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise NotImplementedError("aten.linalg_lu: LU without pivoting is not implemented (as on CPU)")
    lu, _, perm = _lu(a)
    lower, upper = _unpack_lu(lu)
    return _permutation_matrix(perm, a.dtype), lower, upper


@lowers(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    empty = jnp.zeros((0,), lu.dtype)
    lower, upper = _unpack_lu(lu) if unpack_data else (empty, empty)
    if not unpack_pivots:
        return empty, lower, upper
    perm = _pivots_to_permutation(pivots, lu.shape[-2])
    return _permutation_matrix(perm, lu.dtype), lower, upper


def _lu_solve_left(lu, pivots, b, adjoint):
    """X with A @ X = B (or A^T @ X = B), where P^T A = L U is packed in `lu`."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(_pivots_to_permutation(pivots, lu.shape[-1]), b.shape[:-2] + lu.shape[-1:])
    if not adjoint:
        permuted = jnp.take_along_axis(b, perm[..., None], axis=-2)
        y = jsl.solve_triangular(lu, permuted, lower=True, unit_diagonal=True)
        return jsl.solve_triangular(lu, y, lower=False)
    y = jsl.solve_triangular(lu, b, lower=False, trans=1)
    z = jsl.solve_triangular(lu, y, lower=True, unit_diagonal=True, trans=1)
    return jnp.take_along_axis(z, jnp.argsort(perm, axis=-1)[..., None], axis=-2)


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    if left:
        return _lu_solve_left(lu, pivots, b, adjoint)
    # X A = B  <=>  A^T X^T = B^T (real dtypes: the adjoint is the transpose)
    return jnp.swapaxes(_lu_solve_left(lu, pivots, jnp.swapaxes(b, -1, -2), not adjoint), -1, -2)


@lowers(aten.cholesky.default)
def cholesky(a, upper=False):
    return linalg_cholesky_ex(a, upper=upper)[0]


@lowers(aten.geqrf.default)
def geqrf(a):
    """LAPACK's compact QR (Householder vectors below R, and their scales tau); numpy's
    "raw" mode returns the same factors transposed."""
    packed, tau = jnp.linalg.qr(a, mode="raw")
    return jnp.swapaxes(packed, -1, -2), tau


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return lax_linalg.householder_product(a, tau)


@lowers(aten.ormqr.default)
def ormqr(a, tau, other, left=True, transpose=False):
    """op(Q) @ other (left) or other @ op(Q), Q the full m x m product of the reflectors."""
    m = a.shape[-2]
    padded = jnp.zeros(a.shape[:-1] + (m,), a.dtype).at[..., : a.shape[-1]].set(a[..., :m])
    # zero-scale reflectors are identities: they complete Q to a square matrix
    scales = jnp.zeros(tau.shape[:-1] + (m,), tau.dtype).at[..., : tau.shape[-1]].set(tau)
    q = lax_linalg.householder_product(padded, scales)
    if transpose:
        q = jnp.swapaxes(q, -1, -2)
    return jnp.matmul(q, other) if left else jnp.matmul(other, q)


@lowers(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular_values) as CPU's LAPACK drivers fill them.

    The solution is the minimum-norm least-squares one (SVD), which is what every driver
    returns for full-rank inputs; `rank` counts singular values above rcond * s_max (gelsy
    decides with a pivoted QR, which agrees except for values at the threshold).
    """
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector_rhs = b.ndim == a.ndim - 1
    rhs = b[..., None] if vector_rhs else b
    a_b, rhs = _broadcast_batch(a, rhs)
    singular = _svd(a_b, compute_uv=False)
    cutoff = (jnp.finfo(a.dtype).eps * max(m, n) if rcond is None or rcond < 0 else rcond) * singular[..., :1]
    pinv = _pinv if chip_limits.targets_tpu() else jnp.linalg.pinv  # see _svd
    solution = jnp.matmul(pinv(a_b, rtol=None if rcond is None else rcond), rhs)
    empty = jnp.zeros((0,), a.dtype)
    rank = jnp.sum(singular > cutoff, axis=-1).astype(jnp.int64) if driver != "gels" else jnp.zeros((0,), jnp.int64)
    residuals = empty
    if m > n and driver != "gelsy":
        residuals = jnp.sum((jnp.matmul(a_b, solution) - rhs) ** 2, axis=-2)
    values = singular if driver in ("gelsd", "gelss") else empty
    return (solution[..., 0] if vector_rhs else solution), residuals, rank, values


# --- pairwise distances -------------------------------------------------------------------


def _p_distance(diff, p):
    """p-norm over the last dim of |differences|, with ATen's special cases for p."""
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(diff.dtype)
    if p == float("inf"):
        return jnp.max(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    if p == 1:
        return jnp.sum(diff, axis=-1)
    return jnp.sum(diff**p, axis=-1) ** (1.0 / p)


@lowers(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    return _p_distance(jnp.abs(x1[..., :, None, :] - x2[..., None, :, :]), p)


@lowers(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    """Gradient for x1 (ATen's op has only that one); zero where a distance is zero."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if p == 0:  # counts nonzero differences: piecewise constant, gradient 0 (as ATen)
        return jnp.zeros_like(x1)
    if p == 1:
        local = jnp.sign(diff)
    elif p == 2:
        local = diff / jnp.where(cdist == 0, 1, cdist)[..., None]
    elif p == float("inf"):
        local = jnp.sign(diff) * (jnp.abs(diff) == cdist[..., None])
    else:
        local = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / jnp.where(cdist == 0, 1, cdist)[..., None] ** (p - 1)
    local = jnp.where((cdist == 0)[..., None], 0, local)
    return jnp.sum(grad[..., None] * local, axis=-2)


@lowers(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    """Distances between all row pairs i < j, in row-major order."""
    rows, cols = np.triu_indices(x.shape[0], 1)
    return _p_distance(jnp.abs(x[rows] - x[cols]), p)


@lowers(aten._pdist_backward.default)
def pdist_backward(grad, x, p, pdist):
    return jax.vjp(lambda v: pdist_forward(v, p), x)[1](grad)[0]


# --- LDL^T with Bunch-Kaufman pivoting (LAPACK sytf2, lower), and its solve (sytrs) ------------
# The factors and pivots are LAPACK's own format, which linalg.ldl_factor returns as is: L's
# columns are stored as eliminated (earlier columns are not re-permuted), pivots are 1-based,
# positive for a 1x1 block of D and -p on both columns of a 2x2 block. One while_loop step
# eliminates one column (1x1 pivot) or two (2x2 pivot); batches are vmapped.

_BUNCH_KAUFMAN_ALPHA = (1 + 17**0.5) / 8


def _ldl_factor_one(a):
    n = a.shape[-1]
    index = jnp.arange(n)
    lower = jnp.tril(a)
    a = lower + jnp.tril(lower, -1).T  # sytrf reads the lower triangle only

    def pick_pivot(m, k):
        """(kp, kstep, singular) as sytf2 chooses them for column k."""
        column = jnp.where(index > k, jnp.abs(m[:, k]), -1.0)
        imax = jnp.argmax(column)  # the first largest, as idamax
        colmax = jnp.maximum(column[imax], 0)
        absakk = jnp.abs(m[k, k])
        row = jnp.where((index >= k) & (index != imax), jnp.abs(m[imax]), 0)  # row imax of the trailing block
        rowmax = jnp.max(row)
        keep = (absakk >= _BUNCH_KAUFMAN_ALPHA * colmax) | (absakk * rowmax >= _BUNCH_KAUFMAN_ALPHA * colmax * colmax)
        one_by_one_at_imax = jnp.abs(m[imax, imax]) >= _BUNCH_KAUFMAN_ALPHA * rowmax
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        kp = jnp.where(singular | keep, k, imax)
        kstep = jnp.where(singular | keep | one_by_one_at_imax, 1, 2)
        return kp, kstep, singular

    def step(state):
        m, pivots, info, k = state
        kp, kstep, singular = pick_pivot(m, k)
        kk = k + kstep - 1
        # swap rows and columns kk and kp of the trailing block (the stored L columns stay)
        order = jnp.where(index == kk, kp, jnp.where(index == kp, kk, index))
        trailing = (index[:, None] >= k) & (index[None, :] >= k)
        m = jnp.where(trailing, m[order][:, order], m)
        below = index > k + kstep - 1
        block = below[:, None] & below[None, :]
        # 1x1: the Schur complement of d = m[k, k]; L's column is x / d
        x = jnp.where(below, m[:, k], 0)
        d11 = 1 / m[k, k]
        one = jnp.where(block, m - jnp.outer(x, d11 * x), m)
        one = one.at[:, k].set(jnp.where(below, x * d11, m[:, k]))
        # 2x2: D = [[m[k,k], m[k+1,k]], [m[k+1,k], m[k+1,k+1]]]; L's columns W = [x_k x_k1] D^-1
        k1 = jnp.minimum(k + 1, n - 1)
        d21 = m[k1, k]
        e11, e22 = m[k1, k1] / d21, m[k, k] / d21
        d21 = 1 / (e11 * e22 - 1) / d21
        xk, xk1 = jnp.where(below, m[:, k], 0), jnp.where(below, m[:, k1], 0)
        wk, wk1 = d21 * (e11 * xk - xk1), d21 * (e22 * xk1 - xk)
        two = jnp.where(block, m - (jnp.outer(xk, wk) + jnp.outer(xk1, wk1)), m)
        two = two.at[:, k].set(jnp.where(below, wk, m[:, k])).at[:, k1].set(jnp.where(below, wk1, m[:, k1]))
        updated = jnp.where(kstep == 1, one, two)
        m = jnp.where(singular, m, updated)
        m = jnp.where(block, jnp.tril(m) + jnp.tril(m, -1).T, m)  # sytf2 updates the lower half only
        stored = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        pivots = jnp.where((index == k) | ((index == k + 1) & (kstep == 2)), stored, pivots)
        info = jnp.where(singular & (info == 0), k + 1, info).astype(jnp.int32)
        return m, pivots, info, k + kstep

    state = (a, jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    m, pivots, info, _ = jax.lax.while_loop(lambda s: s[3] < n, step, state)
    return jnp.tril(m), pivots, info


@lowers(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(x, *, hermitian=False, check_errors=False):
    """LD, pivots, info as LAPACK's sytrf (lower); real matrices: hermitian changes nothing."""
    if jnp.iscomplexobj(x):
        raise NotImplementedError("aten.linalg_ldl_factor_ex: complex matrices are not supported on the tpu device")
    if x.shape[-1] == 0:
        batch = x.shape[:-2]
        return x, jnp.zeros((*batch, 0), jnp.int32), jnp.zeros(batch, jnp.int32)
    factor = _ldl_factor_one
    for _ in x.shape[:-2]:
        factor = jax.vmap(factor)
    return factor(x)


def _ldl_solve_one(ld, pivots, b):
    """sytrs (lower): B <- P^T L^-T D^-1 L^-1 P B, applying each pivot step in turn."""
    n = ld.shape[-1]
    index = jnp.arange(n)

    def swap(b, i, j):
        order = jnp.where(index == i, j, jnp.where(index == j, i, index))
        return b[order]

    def forward(state):  # L D X = B, from the first column
        b, k = state
        two = pivots[k] < 0
        k1 = jnp.minimum(k + 1, n - 1)
        b = swap(b, jnp.where(two, k1, k), jnp.abs(pivots[k]) - 1)
        below = (index > k + two)[:, None]
        b = b - jnp.where(below, jnp.outer(ld[:, k], b[k]), 0)
        b = b - jnp.where(below & two, jnp.outer(ld[:, k1], b[k1]), 0)
        # D's block: 1x1 divides; 2x2 solves [[a, c], [c, d]] scaled by c, as sytrs
        one_row = b.at[k].set(b[k] / ld[k, k])
        c = ld[k1, k]
        akm1, ak = ld[k, k] / c, ld[k1, k1] / c
        denom = akm1 * ak - 1
        bkm1, bk = b[k] / c, b[k1] / c
        two_rows = b.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, two_rows, one_row), k + 1 + two

    def backward(state):  # L^T X = B, from the last column
        b, k = state
        two = pivots[k] < 0  # k is the second column of a 2x2 block when two
        km1 = jnp.maximum(k - 1, 0)
        below = (index > k)[:, None]
        b = b.at[k].add(-jnp.sum(jnp.where(below, ld[:, k, None] * b, 0), axis=0))
        b = b.at[km1].add(-jnp.where(two, jnp.sum(jnp.where(below, ld[:, km1, None] * b, 0), axis=0), 0))
        b = swap(b, k, jnp.abs(pivots[k]) - 1)
        return b, k - 1 - two

    b, _ = jax.lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.zeros((), jnp.int32)))
    b, _ = jax.lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.full((), n - 1, jnp.int32)))
    return b


@lowers(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False):
    if jnp.iscomplexobj(ld):
        raise NotImplementedError("aten.linalg_ldl_solve: complex matrices are not supported on the tpu device")
    batch = jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2])
    ld = jnp.broadcast_to(ld, (*batch, *ld.shape[-2:]))
    pivots = jnp.broadcast_to(pivots, (*batch, pivots.shape[-1]))
    b = jnp.broadcast_to(b, (*batch, *b.shape[-2:]))
    if ld.shape[-1] == 0 or b.shape[-1] == 0:
        return jnp.zeros(b.shape, jnp.result_type(ld, b))
    solve = _ldl_solve_one
    for _ in batch:
        solve = jax.vmap(solve)
    return solve(ld, pivots, b.astype(ld.dtype))
