"""Matrix products (mm, bmm, addmm, baddbmm, ...) and basic dense linear algebra.

Matrix products use JAX's default matmul precision; on a TPU that means bfloat16
passes for float32 inputs. Set `jax.config.update("jax_default_matmul_precision",
"highest")` for float32-exact products (slower).
`beta == 0` ignores `self` entirely (NaN in it does not propagate), as in ATen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch
from jax.lax import linalg as lax_linalg

from tpu_backend.ops._common import canonical_dim, is_static_number, jax_dtype, result_dtype
from tpu_backend.ops.activation import gelu
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _scale_add(x, product, beta, alpha):
    """beta * x + alpha * product in ATen's dtype; beta == 0 ignores x (even NaN in it).

    beta and alpha may be traced scalars (the device passes Python floats dynamically),
    so only static values take the shortcuts.
    """
    if not (is_static_number(alpha) and alpha == 1):
        product = product * alpha
    if is_static_number(beta) and beta == 1:
        return (x + product).astype(result_dtype(x, product))
    scaled = jnp.where(beta == 0, jnp.zeros_like(x), x * beta)
    return (scaled + product).astype(result_dtype(x, product))


@lowers(aten.mm.default)
def mm(x, mat2):
    return jnp.matmul(x, mat2)


@lowers(aten.mm.dtype, aten.bmm.dtype)
def mm_out_dtype(x, mat2, out_dtype):
    return jnp.matmul(x, mat2, preferred_element_type=jax_dtype(out_dtype)).astype(jax_dtype(out_dtype))


@lowers(aten.bmm.default)
def bmm(x, mat2):
    return jnp.matmul(x, mat2)


@lowers(aten.addmm.default)
def addmm(x, mat1, mat2, *, beta=1, alpha=1):
    return _scale_add(x, jnp.matmul(mat1, mat2), beta, alpha)


@lowers(aten._addmm_activation.default)
def addmm_activation(x, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    out = addmm(x, mat1, mat2, beta=beta, alpha=alpha)
    if use_gelu:
        return gelu(out)
    return jnp.maximum(out, 0)


@lowers(aten.baddbmm.default)
def baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _scale_add(x, jnp.matmul(batch1, batch2), beta, alpha)


@lowers(aten.addbmm.default)
def addbmm(x, batch1, batch2, *, beta=1, alpha=1):
    return _scale_add(x, jnp.einsum("bij,bjk->ik", batch1, batch2), beta, alpha)


@lowers(aten.addmv.default)
def addmv(x, mat, vec, *, beta=1, alpha=1):
    return _scale_add(x, jnp.matmul(mat, vec), beta, alpha)


@lowers(aten.addr.default)
def addr(x, vec1, vec2, *, beta=1, alpha=1):
    if x.dtype == jnp.bool_:
        return (x & bool(beta)) | (bool(alpha) & jnp.outer(vec1, vec2))
    return _scale_add(x, jnp.outer(vec1, vec2), beta, alpha)


@lowers(aten.mv.default)
def mv(x, vec):
    return jnp.matmul(x, vec)


@lowers(aten.dot.default, aten.vdot.default)
def dot(x, other):
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
    """(det, LU, pivots): det is exact; LU and pivots come from JAX's LU and may differ
    from LAPACK's where pivoting has ties (autograd only uses them for singular inputs)."""
    lu, pivots, _ = _lu(a)
    return jnp.linalg.det(a), lu, pivots


def _lu(a):
    """LU factors and LAPACK-style 1-based int32 pivots."""
    lu, pivots, permutation = lax_linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), permutation


@lowers(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    sign, logabsdet = jnp.linalg.slogdet(a)
    lu, pivots, _ = _lu(a)
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
    transposed = jsl.solve_triangular(jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2), lower=upper, unit_diagonal=unitriangular)
    return jnp.swapaxes(transposed, -1, -2)


@lowers(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    solution = jsl.solve_triangular(a, b, lower=not upper, trans=1 if transpose else 0, unit_diagonal=unitriangular)
    return solution, a


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    return jsl.expm(a)


@lowers(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    eigenvalues, eigenvectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return eigenvalues, eigenvectors if compute_v else jnp.zeros((0,), a.dtype)


@lowers(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return jnp.zeros((0,), a.dtype), jnp.linalg.svd(a, compute_uv=False), jnp.zeros((0,), a.dtype)
    return jnp.linalg.svd(a, full_matrices=full_matrices)


@lowers(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    return jsl.cho_solve((factor, not upper), b)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return jsl.cho_solve((factor, not upper), eye)


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
