"""Op parity between the "tpu" device and PyTorch CPU, driven by PyTorch's OpInfo database.

For each OpInfo entry (`torch.testing._internal.common_methods_invocations.op_db`) we draw
the op's own sample inputs on CPU, run the op on CPU and on the device (every tensor in the
sample moved with `.to(device)`, `device=` keyword arguments rewritten), bring the outputs
back and compare them with per-dtype tolerances. For ops that support autograd we also
compare input gradients: `torch.autograd.grad` of the floating outputs with the same random
cotangents on both sides.

This module is shared by `test_opinfo.py` (pytest) and `opinfo_report.py` (the table and
the counts). It owns the two lists that explain every op we do not compare value by value:
`SKIPS` (cannot run on the device by design, each with its reason) and `SHAPE_ONLY` (random
or uninitialised outputs: only shape, dtype and device are compared; samples that draw
random numbers, e.g. attention with dropout_p > 0, are detected and treated alike), and
`KNOWN_FAILURES` (fixable failures found by the sweep, each with its error, expected to
fail in the slow sweep until fixed; regenerate with `opinfo_report --emit-known-failures`).

Environment: `PARITY_DEVICE=cpu` runs the whole harness CPU against CPU (a sanity check of
the harness itself, used while the device is being built).
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

# The device under test; "cpu" checks the harness against itself.
DEVICE = os.environ.get("PARITY_DEVICE", "tpu")

# (rtol, atol) per dtype for forward outputs. XLA's CPU kernels use different (still
# correctly rounded to a few ulp) approximations of transcendental functions and a
# different summation order than ATen's, so float32 gets a looser bound than
# torch.testing's default (1.3e-6, 1e-5).
FORWARD_TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-3),
    # bfloat16 has 8 mantissa bits; one rounding step is 2**-8 relative.
    torch.bfloat16: (1.6e-2, 1e-2),
}
# Gradients go through a chain of ops (and reductions of cotangents), so they are allowed
# ten times the forward error.
GRAD_TOLERANCE_FACTOR = 10.0

# OpInfo entries that cannot run on the device by design. Key: the entry's id
# (`name` or `name.variant`); value: why. Prefix keys ending in "." cover a family.
SKIPS: dict[str, str] = {
    # complex numbers: the device has no complex dtype
    **{
        f"fft.{name}": "uses torch.fft: complex input or output, complex dtype unsupported on the tpu device"
        for name in (
            "fft", "fft2", "fftn", "hfft", "hfft2", "hfftn", "rfft", "rfft2", "rfftn", "ifft", "ifft2",
            "ifftn", "ihfft", "ihfft2", "ihfftn", "irfft", "irfft2", "irfftn",
        )
    },
    "stft": "complex output (torch.stft): complex dtype unsupported on the tpu device",
    "istft": "complex input (torch.istft): complex dtype unsupported on the tpu device",
    "view_as_complex": "complex output: complex dtype unsupported on the tpu device",
    "polar": "complex output: complex dtype unsupported on the tpu device",
    "complex": "complex output: complex dtype unsupported on the tpu device",
    "cdouble": "converts to complex128: complex dtype unsupported on the tpu device",
    "chalf": "converts to complex32: complex dtype unsupported on the tpu device",
    "linalg.eig": "complex output (eigenvectors of a general matrix): complex dtype unsupported",
    "linalg.eigvals": "complex output (eigenvalues of a general matrix): complex dtype unsupported",
    # sparse layouts
    "to_sparse": "sparse layout: the tpu device holds dense tensors only",
    "sparse.sampled_addmm": "sparse layout: the tpu device holds dense tensors only",
    "sparse.mm.reduce": "sparse layout: the tpu device holds dense tensors only",
    # CUDA-only machinery
    "jiterator_unary": "CUDA jiterator only",
    "jiterator_binary": "CUDA jiterator only",
    "jiterator_4inputs_with_extra_args": "CUDA jiterator only",
    "jiterator_binary_return_by_ref": "CUDA jiterator only",
    "jiterator_2inputs_2outputs": "CUDA jiterator only",
    # a limit of comparing through .to(): not a device property
    "as_strided.partial_views": (
        "the sample is a view into a larger base and as_strided reads outside the view; "
        ".to(device) copies only the view's elements, so CPU and device read different storage"
    ),
}

# Ops whose outputs are random or uninitialised: only shape, dtype and device are compared.
SHAPE_ONLY: dict[str, str] = {
    name: "random output: the device draws from jax.random, values cannot match torch's CPU generator"
    for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
        "normal.in_place", "normal.number_mean", "uniform", "multinomial", "rand_like",
        "randn_like", "randint_like", "randint", "randn",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    )
} | {
    name: "uninitialised output (empty*): values are arbitrary"
    for name in ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")
} | {
    name: "randomized algorithm (draws random projections): values depend on the generator"
    for name in ("svd_lowrank", "pca_lowrank")
}


# skip_reason() for entries that do not exist for a dtype (e.g. bitwise ops in float32):
# reported as "n/a", not counted as skips.
NOT_APPLICABLE = "op_db lists no CPU support for this dtype"


# Ops that fail on the device today for reasons that are fixable (a missing lowering, a
# wrong result): the slow full sweep expects them to fail (xfail, not strict: the list is
# regenerated from `opinfo_report.py`). Every entry names the error; see the report.
KNOWN_FAILURES: dict[str, str] = {
    'combinations': 'fail: TypeError: Slice size at index 0 in gather op is out of range, must be within [0, 0 + 1), got 1. [sample 2: (T(1,):float32, r=2, with_replac',
    'cdist': 'mismatch: Mismatch: grad[0]: Mismatched elements: 50 / 50 (100.0%) | Greatest absolute difference: 161.25 at index (2, 4, 0) (up to 0.0001 allowed) [s',
    'cholesky': 'fail: TpuLoweringError: no tpu lowering for aten.cholesky.default',
    'corrcoef': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
    'cov': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
    'equal': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
    'geqrf': 'fail: TpuLoweringError: no tpu lowering for aten.geqrf.default',
    'lu_unpack': 'fail: TpuLoweringError: no tpu lowering for aten.lu_unpack.out',
    'lu': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_factor_ex.out',
    'lu_solve': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out',
    'matrix_exp': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 125 (0.8%) | Greatest absolute difference: 0.0004743337631225586 at index (2, 4, 1) (up to 1e-',
    'nn.functional.adaptive_max_pool3d': 'fail: TpuLoweringError: no tpu lowering for aten.adaptive_max_pool3d.out',
    # sample 2 normalises over ONE element: the true input gradient is 0 and both sides
    # return rounding noise (1.2e-4 on tpu vs 1e-4 allowed); not a lowering bug
    'nn.functional.layer_norm': 'mismatch (degenerate sample): Mismatch: grad[0]: Mismatched elements: 1 / 1 (100.0%) | Greatest absolute difference: 0.0001220703125 at index (0,) (up to 0.0001 allowed)',
    'nn.functional.interpolate.nearest-exact': 'fail: TpuLoweringError: no tpu lowering for aten._upsample_nearest_exact1d_backward.grad_input (in backward)',
    '_upsample_bilinear2d_aa': 'fail: TpuLoweringError: no tpu lowering for aten._upsample_bilinear2d_aa.out',
    'nn.functional.multi_margin_loss': 'fail: TpuLoweringError: no tpu lowering for aten.multi_margin_loss_backward.default (in backward)',
    'nn.functional.multilabel_margin_loss': 'fail: TpuLoweringError: no tpu lowering for aten.multilabel_margin_loss_backward.default (in backward)',
    'nn.functional.fractional_max_pool2d': 'fail: TpuLoweringError: no tpu lowering for aten.fractional_max_pool2d.output',
    'nn.functional.fractional_max_pool3d': 'fail: TpuLoweringError: no tpu lowering for aten.fractional_max_pool3d.output',
    'nn.functional.rrelu': 'fail: TpuLoweringError: no tpu lowering for aten.rrelu_with_noise.default',
    'ormqr': 'fail: TpuLoweringError: no tpu lowering for aten.ormqr.default',
    'tensor_split': "fail: RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on tpu:0 [sample 0: (T(5, 5, 5):float32, T(3,):int64)]",
    'polygamma.polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'polygamma.polygamma_n_1': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'polygamma.polygamma_n_2': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'polygamma.polygamma_n_3': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'polygamma.polygamma_n_4': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'index_fill': 'fail: TpuLoweringError: no tpu lowering for aten._unique.default (in backward)',
    'histogram': 'fail: TpuLoweringError: no tpu lowering for aten.histogram.bin_ct',
    'histogramdd': 'fail: TpuLoweringError: no tpu lowering for aten._histogramdd_bin_edges.default',
    'logcumsumexp': 'mismatch: Mismatch: grad[0]: Mismatched elements: 7 / 125 (5.6%) | Greatest absolute difference: 0.004711627960205078 at index (0, 0, 0) (up to 0.0001',
    'digamma': 'mismatch: Mismatch: grad[0]: Mismatched elements: 1 / 20 (5.0%) | Greatest absolute difference: 2.3238601684570312 at index (0,) (up to 0.0001 allowed',
    'logdet': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out (in backward)',
    'nn.functional.embedding_bag': 'fail: TpuLoweringError: no tpu lowering for aten._embedding_bag.default',
    'nn.functional.multi_head_attention_forward': 'mismatch: Mismatch: output[0]: Mismatched elements: 8 / 12 (66.7%) | Greatest absolute difference: 374.7033386230469 at index (0, 0, 0) (up to 1e-05 a',
    'grid_sampler_3d': 'fail: TpuLoweringError: no tpu lowering for aten.grid_sampler_3d.default',
    'hash_tensor': 'fail: TpuLoweringError: no tpu lowering for aten.hash_tensor.out',
    'nn.functional.ctc_loss': 'fail: TpuLoweringError: no tpu lowering for aten._ctc_loss.default',
    '_segment_reduce.lengths': 'fail: TpuLoweringError: no tpu lowering for aten.segment_reduce.default',
    '_segment_reduce.offsets': 'fail: TpuLoweringError: no tpu lowering for aten.segment_reduce.default',
    # eigenvectors are defined up to sign: this needs a sign-invariant comparison, likely no bug
    'linalg.eigh': 'mismatch: Mismatch: output[1]: Mismatched elements: 10 / 25 (40.0%) | Greatest absolute difference: 1.5171878337860107 at index (2, 3) (up to 1e-05 al',
    'linalg.householder_product': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_householder_product.default',
    'linalg.ldl_factor': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_ldl_factor_ex.out',
    'linalg.ldl_factor_ex': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_ldl_factor_ex.out',
    'linalg.ldl_solve': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_ldl_solve.out',
    'linalg.lstsq': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lstsq.out',
    'linalg.lstsq.grad_oriented': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lstsq.out',
    'linalg.slogdet': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out (in backward)',
    'linalg.lu_factor': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_factor_ex.out',
    'linalg.lu_factor_ex': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_factor_ex.out',
    'linalg.lu': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu.out',
    'linalg.lu_solve': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out',
    'linalg.solve': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out (in backward)',
    'linalg.solve_ex': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out (in backward)',
    'linalg.tensorsolve': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_lu_solve.out (in backward)',
    'special.polygamma.special_polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.064112663269043 at index (0, 0) (up to 1e-05 allow',
    'special.airy_ai': 'fail: TpuLoweringError: no tpu lowering for aten.special_airy_ai.out',
    'special.bessel_y0': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y0.out',
    'special.bessel_y1': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y1.out',
    'special.chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_t.out',
    'special.chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_u.out',
    'special.chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_v.out',
    'special.chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_w.out',
    'special.hermite_polynomial_h': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_h.out',
    'special.hermite_polynomial_he': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_he.out',
    'special.laguerre_polynomial_l': 'fail: TpuLoweringError: no tpu lowering for aten.special_laguerre_polynomial_l.out',
    'special.legendre_polynomial_p': 'fail: TpuLoweringError: no tpu lowering for aten.special_legendre_polynomial_p.out',
    'special.modified_bessel_i0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i0.out',
    'special.modified_bessel_i1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i1.out',
    'special.modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k0.out',
    'special.modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k1.out',
    'special.scaled_modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k0.out',
    'special.scaled_modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k1.out',
    'special.shifted_chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_t.out',
    'special.shifted_chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_u.out',
    'special.shifted_chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_v.out',
    'special.shifted_chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_w.out',
    'special.spherical_bessel_j0': 'fail: TpuLoweringError: no tpu lowering for aten.special_spherical_bessel_j0.out',
}
# The same for the sampled forward pass (2 samples) in other dtypes.
KNOWN_FAILURES_BY_DTYPE: dict[torch.dtype, dict[str, str]] = {
    torch.bfloat16: {
        'addbmm': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 50 (2.0%) | Greatest absolute difference: 0.21875 at index (4, 5) (up to 0.01 allowed) [sample',
        'baddbmm': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 250 (0.4%) | Greatest absolute difference: 0.025390625 at index (2, 4, 1) (up to 0.01 allowed)',
        'corrcoef': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'cov': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'cumsum': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 125 (0.8%) | Greatest absolute difference: 0.03125 at index (4, 2, 3) (up to 0.01 allowed) [sa',
        'equal': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'frexp': 'fail: TpuLoweringError: no tpu lowering for aten.frexp.Tensor_out',
        'isin': 'fail: TpuLoweringError: no tpu lowering for aten.isin.Tensor_Tensor_out',
        'matrix_exp': 'fail: TpuLoweringError: no tpu lowering for aten.linalg_matrix_exp.default',
        'native_batch_norm': 'mismatch: Mismatch: output[1]: got (5,) torch.float32, expected (5,) torch.bfloat16 [sample 0: (T(5, 5, 5):bfloat16, T(5,):bfloat16, T(5,):bfloat16, T',
        '_native_batch_norm_legit': 'mismatch: Mismatch: output[1]: got (5,) torch.float32, expected (5,) torch.bfloat16 [sample 0: (T(5, 5, 5):bfloat16, T(5,):bfloat16, T(5,):bfloat16, T',
        '_batch_norm_with_update': 'mismatch: Mismatch: output[1]: got (5,) torch.float32, expected (5,) torch.bfloat16 [sample 0: (T(5, 5, 5):bfloat16, T(5,):bfloat16, T(5,):bfloat16, T',
        'nn.functional.adaptive_avg_pool3d': 'mismatch: Mismatch: output[0]: Mismatched elements: 5 / 1120 (0.4%) | Greatest absolute difference: 0.02734375 at index (5, 3, 1, 1) (up to 0.01 allow',
        'nn.functional.adaptive_max_pool3d': 'fail: TpuLoweringError: no tpu lowering for aten.adaptive_max_pool3d.out',
        'nn.functional.conv_transpose1d': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 18 (5.6%) | Greatest absolute difference: 0.09375 at index (0, 2, 2) (up to 0.01 allowed) [sam',
        'nn.functional.conv_transpose2d': 'mismatch: Mismatch: output[0]: Mismatched elements: 3 / 108 (2.8%) | Greatest absolute difference: 0.25 at index (0, 1, 4, 0) (up to 0.01 allowed) [sa',
        'nn.functional.conv_transpose3d': 'mismatch: Mismatch: output[0]: Mismatched elements: 24 / 648 (3.7%) | Greatest absolute difference: 0.75 at index (0, 0, 0, 4, 0) (up to 0.01 allowed)',
        'nn.functional.pad.replicate_negative': "fail: ValueError: index can't contain negative values [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback",
        'nn.functional.interpolate.nearest-exact': 'fail: TpuLoweringError: no tpu lowering for aten._upsample_nearest_exact1d.out',
        'nn.functional.interpolate.bicubic': 'fail: TpuLoweringError: no tpu lowering for aten.upsample_bicubic2d.out',
        'nn.functional.interpolate.trilinear': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 750 (0.1%) | Greatest absolute difference: 0.0126953125 at index (1, 2, 1, 2, 3) (up to 0.01 a',
        'nn.functional.fractional_max_pool2d': 'fail: TpuLoweringError: no tpu lowering for aten.fractional_max_pool2d.output',
        'nn.functional.fractional_max_pool3d': 'fail: TpuLoweringError: no tpu lowering for aten.fractional_max_pool3d.output',
        'nn.functional.rrelu': 'fail: TpuLoweringError: no tpu lowering for aten.rrelu_with_noise.default',
        'to': "mismatch: Mismatch: output[0]: output is on cpu, expected tpu [sample 0: (T(5, 5, 5, 5):bfloat16, 'cpu', torch.float64, True, True, memory_format=torc",
        'topk': 'mismatch: Mismatch: output[1]: Mismatched elements: 4 / 75 (5.3%) | Greatest absolute difference: 7 at index (2, 1, 4) [sample 1: (T(5, 10, 5):bfloat1',
        'igamma': 'fail: TpuLoweringError: no tpu lowering for aten.igamma.out',
        'igammac': 'fail: TpuLoweringError: no tpu lowering for aten.igammac.out',
        'tensor_split': "fail: RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on tpu:0 [sample 0: (T(5, 5, 5):bfloat16, T(3,):int64)",
        'polygamma.polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'polygamma.polygamma_n_1': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'polygamma.polygamma_n_2': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'polygamma.polygamma_n_3': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'polygamma.polygamma_n_4': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'index_fill': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_copy': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_select': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_add': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_reduce.mean': 'fail: TpuLoweringError: no tpu lowering for aten.index_reduce.out',
        'index_reduce.prod': 'fail: TpuLoweringError: no tpu lowering for aten.index_reduce.out',
        'index_reduce.amin': 'fail: TpuLoweringError: no tpu lowering for aten.index_reduce.out',
        'index_reduce.amax': 'fail: TpuLoweringError: no tpu lowering for aten.index_reduce.out',
        'index_put': 'fail: TypeError: indexing with a bool mask has a data-dependent shape; the tpu device runs such aten.index/index_put calls eagerly (DATA_DEPENDENT',
        'sort': 'mismatch: Mismatch: output[1]: Mismatched elements: 7113 / 8000 (88.9%) | Greatest absolute difference: 7974 at index (7314,) [sample 0: (T(8000,):bfl',
        'cdouble': 'fail: TypeError: dtype torch.complex128 is not supported on the tpu device [sample 0: (T():bfloat16)]',
        'chalf': 'fail: TypeError: dtype torch.complex32 is not supported on the tpu device [sample 0: (T():bfloat16)]',
        'renorm': 'fail: TpuLoweringError: no tpu lowering for aten.renorm.out',
        'nonzero': 'fail: ValueError: Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() instead. [sample 0: (T():bfloat16, as_tuple=Fal',
        'nonzero_static': 'fail: ValueError: Calling nonzero on 0d arrays is not allowed. Use jnp.atleast_1d(scalar).nonzero() instead. [--------------------\nFor simplicity,',
        'nn.functional.embedding_bag': 'fail: TpuLoweringError: no tpu lowering for aten._embedding_bag_forward_only.default',
        'nn.functional.multi_head_attention_forward': 'mismatch: Mismatch: output[0]: Mismatched elements: 4 / 6 (66.7%) | Greatest absolute difference: 328.0 at index (1, 0) (up to 0.01 allowed) [sample 1',
        'nn.functional.grid_sample': 'mismatch: Mismatch: output[0]: Mismatched elements: 3 / 150 (2.0%) | Greatest absolute difference: 0.03515625 at index (0, 2, 3, 1) (up to 0.01 allowe',
        'grid_sampler_2d': 'mismatch: Mismatch: output[0]: Mismatched elements: 99 / 780 (12.7%) | Greatest absolute difference: 0.1640625 at index (0, 0, 11, 9) (up to 0.01 allo',
        'grid_sampler_3d': 'fail: TpuLoweringError: no tpu lowering for aten.grid_sampler_3d.default',
        'hash_tensor': 'fail: TpuLoweringError: no tpu lowering for aten.hash_tensor.out',
        'argsort': 'mismatch: Mismatch: output[0]: Mismatched elements: 7113 / 8000 (88.9%) | Greatest absolute difference: 7974 at index (7314,) [sample 0: (T(8000,):bfl',
        '_segment_reduce.lengths': 'fail: TpuLoweringError: no tpu lowering for aten.segment_reduce.default',
        '_segment_reduce.offsets': 'fail: TpuLoweringError: no tpu lowering for aten.segment_reduce.default',
        'special.polygamma.special_polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 1 / 25 (4.0%) | Greatest absolute difference: 2.96875 at index (0, 0) (up to 0.01 allowed) [sample',
        'special.entr': 'fail: TpuLoweringError: no tpu lowering for aten.special_entr.out',
    },
    torch.int64: {
        'addmv': 'mismatch: Mismatch: output[0]: got (5,) torch.float64, expected (5,) torch.int64 [sample 1: (T(5,):int64, T(5, 10):int64, T(10,):int64, beta=0.2, alph',
        'corrcoef': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'cov': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'equal': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'kthvalue': 'mismatch: Mismatch: output[1]: Mismatched elements: 6 / 25 (24.0%) | Greatest absolute difference: 3 at index (1, 0) [sample 0: (T(5, 5, 5):int64, 2)]',
        'nn.functional.pad.replicate_negative': "fail: ValueError: index can't contain negative values [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback",
        'topk': 'mismatch: Mismatch: output[1]: Mismatched elements: 16 / 150 (10.7%) | Greatest absolute difference: 4 at index (3, 8, 1) [sample 0: (T(5, 10, 5):int6',
        '__rpow__': 'mismatch: Mismatch: output[0]: Scalars are not equal! |  | Expected 0 but got 6989586621679009792. | Absolute difference: 6989586621679009792 [sample',
        'tensor_split': "fail: RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on tpu:0 [sample 0: (T(5, 5, 5):int64, T(3,):int64)]",
        'index_fill': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_copy': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_select': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_add': 'fail: IndexError: Too many indices: array is 0-dimensional, but 1 were indexed [--------------------\nFor simplicity, JAX has removed its internal',
        'index_reduce.mean': 'fail: IndexError: list assignment index out of range [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback',
        'index_reduce.prod': 'fail: IndexError: list assignment index out of range [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback',
        'index_reduce.amin': 'fail: IndexError: list assignment index out of range [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback',
        'index_reduce.amax': 'fail: IndexError: list assignment index out of range [--------------------\nFor simplicity, JAX has removed its internal frames from the traceback',
        'cdouble': 'fail: TypeError: dtype torch.complex128 is not supported on the tpu device [sample 0: (T():int64)]',
        'chalf': 'fail: TypeError: dtype torch.complex32 is not supported on the tpu device [sample 0: (T():int64)]',
        'nonzero': 'fail: ValueError: Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() instead. [sample 0: (T():int64, as_tuple=False)',
        'nonzero_static': 'fail: ValueError: Calling nonzero on 0d arrays is not allowed. Use jnp.atleast_1d(scalar).nonzero() instead. [--------------------\nFor simplicity,',
        'native_dropout_backward': 'mismatch: Mismatch: output[0]: got (5, 5, 5, 5) torch.int64, expected (5, 5, 5, 5) torch.float32 [sample 0: (T(5, 5, 5, 5):int64, T(5, 5, 5, 5):bool,',
        'hash_tensor': 'fail: TpuLoweringError: no tpu lowering for aten.hash_tensor.out',
        'special.zeta': 'fail: TpuLoweringError: no tpu lowering for aten.special_zeta.out',
        'special.entr': 'fail: TpuLoweringError: no tpu lowering for aten.special_entr.out',
        'special.log_ndtr': 'fail: TpuLoweringError: no tpu lowering for aten.special_log_ndtr.out',
        'special.airy_ai': 'fail: TpuLoweringError: no tpu lowering for aten.special_airy_ai.out',
        'special.bessel_j0': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_j0.out',
        'special.bessel_j1': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_j1.out',
        'special.bessel_y0': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y0.out',
        'special.bessel_y1': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y1.out',
        'special.chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_t.out',
        'special.chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_u.out',
        'special.chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_v.out',
        'special.chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_w.out',
        'special.hermite_polynomial_h': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_h.out',
        'special.hermite_polynomial_he': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_he.out',
        'special.laguerre_polynomial_l': 'fail: TpuLoweringError: no tpu lowering for aten.special_laguerre_polynomial_l.out',
        'special.legendre_polynomial_p': 'fail: TpuLoweringError: no tpu lowering for aten.special_legendre_polynomial_p.out',
        'special.modified_bessel_i0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i0.out',
        'special.modified_bessel_i1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i1.out',
        'special.modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k0.out',
        'special.modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k1.out',
        'special.scaled_modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k0.out',
        'special.scaled_modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k1.out',
        'special.shifted_chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_t.out',
        'special.shifted_chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_u.out',
        'special.shifted_chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_v.out',
        'special.shifted_chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_w.out',
        'special.spherical_bessel_j0': 'fail: TpuLoweringError: no tpu lowering for aten.special_spherical_bessel_j0.out',
    },
    torch.bool: {
        'equal': 'fail: TpuLoweringError: no tpu lowering for aten.equal.default',
        'tensor_split': "fail: RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on tpu:0 [sample 0: (T(5, 5, 5):bool, T(3,):int64)]",
        'polygamma.polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'polygamma.polygamma_n_1': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'polygamma.polygamma_n_2': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'polygamma.polygamma_n_3': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'polygamma.polygamma_n_4': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'index_add': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        '_unsafe_masked_index_put_accumulate': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'sort': 'mismatch: Mismatch: output[1]: Mismatched elements: 7999 / 8000 (100.0%) | Greatest absolute difference: 7985 at index (7985,) [sample 0: (T(8000,):bo',
        'put': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'scatter': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'scatter_add': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'native_dropout_backward': 'mismatch: Mismatch: output[0]: got (5, 5, 5, 5) torch.bool, expected (5, 5, 5, 5) torch.float32 [sample 0: (T(5, 5, 5, 5):bool, T(5, 5, 5, 5):bool, 0.',
        'hash_tensor': 'fail: TpuLoweringError: no tpu lowering for aten.hash_tensor.out',
        'argsort': 'mismatch: Mismatch: output[0]: Mismatched elements: 7999 / 8000 (100.0%) | Greatest absolute difference: 7985 at index (7985,) [sample 0: (T(8000,):bo',
        'scatter_reduce.sum': 'fail: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'scatter_reduce.prod': 'fail: TypeError: mul does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of integer, floating, complexfloating. [',
        'scatter_reduce.amin': "fail: ValueError: Invalid integer data type 'b'. [sample 0: (T(10, 5):bool, 0, T(5, 5):int64, T(5, 5):bool, 'amin', include_self=False)]",
        'scatter_reduce.amax': "fail: ValueError: Invalid integer data type 'b'. [sample 0: (T(10, 5):bool, 0, T(5, 5):int64, T(5, 5):bool, 'amax', include_self=False)]",
        'special.polygamma.special_polygamma_n_0': 'mismatch: Mismatch: output[0]: Mismatched elements: 15 / 25 (60.0%) | Greatest absolute difference: nan at index (0, 2) (up to 1e-05 allowed) [sample',
        'special.zeta': 'mismatch: Mismatch: output[0]: Mismatched elements: 2 / 5 (40.0%) | Greatest absolute difference: nan at index (2,) (up to 1e-05 allowed) [sample 1: (',
        'special.airy_ai': 'fail: TpuLoweringError: no tpu lowering for aten.special_airy_ai.out',
        'special.bessel_j0': 'mismatch: Mismatch: output[0]: Mismatched elements: 11 / 20 (55.0%) | Greatest absolute difference: nan at index (2,) (up to 1e-05 allowed) [sample 0:',
        'special.bessel_j1': 'mismatch: Mismatch: output[0]: Mismatched elements: 11 / 20 (55.0%) | Greatest absolute difference: nan at index (2,) (up to 1e-05 allowed) [sample 0:',
        'special.bessel_y0': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y0.out',
        'special.bessel_y1': 'fail: TpuLoweringError: no tpu lowering for aten.special_bessel_y1.out',
        'special.chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_t.out',
        'special.chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_u.out',
        'special.chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_v.out',
        'special.chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_chebyshev_polynomial_w.out',
        'special.hermite_polynomial_h': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_h.out',
        'special.hermite_polynomial_he': 'fail: TpuLoweringError: no tpu lowering for aten.special_hermite_polynomial_he.out',
        'special.laguerre_polynomial_l': 'fail: TpuLoweringError: no tpu lowering for aten.special_laguerre_polynomial_l.out',
        'special.legendre_polynomial_p': 'fail: TpuLoweringError: no tpu lowering for aten.special_legendre_polynomial_p.out',
        'special.modified_bessel_i0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i0.out',
        'special.modified_bessel_i1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_i1.out',
        'special.modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k0.out',
        'special.modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_modified_bessel_k1.out',
        'special.scaled_modified_bessel_k0': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k0.out',
        'special.scaled_modified_bessel_k1': 'fail: TpuLoweringError: no tpu lowering for aten.special_scaled_modified_bessel_k1.out',
        'special.shifted_chebyshev_polynomial_t': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_t.out',
        'special.shifted_chebyshev_polynomial_u': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_u.out',
        'special.shifted_chebyshev_polynomial_v': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_v.out',
        'special.shifted_chebyshev_polynomial_w': 'fail: TpuLoweringError: no tpu lowering for aten.special_shifted_chebyshev_polynomial_w.out',
        'special.spherical_bessel_j0': 'fail: TpuLoweringError: no tpu lowering for aten.special_spherical_bessel_j0.out',
    },
}

# A representative subset run in the default suite (a few samples each, forward and
# grad): one or more ops per family the training models and common code use.
FAST_OPS = (
    # pointwise
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "exp", "log", "sqrt", "rsqrt", "tanh",
    "sigmoid", "abs", "neg", "clamp", "where", "maximum", "lerp", "addcmul", "masked_fill",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    # reductions
    "sum", "mean", "amax", "max.reduction_with_dim", "argmax", "var", "std", "cumsum", "softmax",
    "log_softmax", "logsumexp",
    # linear algebra and nn
    "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.conv2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.batch_norm", "nn.functional.layer_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.scaled_dot_product_attention",
    # shape and indexing
    "cat", "stack", "transpose", "permute", "reshape", "view", "expand", "squeeze", "unsqueeze",
    "__getitem__", "index_select", "gather", "scatter_add", "index_put", "flip", "roll", "tril",
    "nn.functional.pad.constant", "sort", "topk",
    # creation and random
    "zeros_like", "full", "arange", "randn", "nn.functional.dropout",
)


def op_id(op) -> str:
    """`name` or `name.variant_test_name`: the key used by SKIPS, SHAPE_ONLY and the reports."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def skip_reason(op, dtype: torch.dtype) -> str | None:
    """Why this OpInfo entry is not run for `dtype`, or None to run it."""
    if op_id(op) in SKIPS:
        return SKIPS[op_id(op)]
    if dtype not in op.supported_dtypes("cpu"):
        return NOT_APPLICABLE
    return None


def all_ops():
    """Every OpInfo entry (importing op_db takes ~10 s, so callers import it lazily)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


@functools.cache
def ops_by_id() -> dict[str, Any]:
    return {op_id(op): op for op in all_ops()}


@dataclass
class OpResult:
    """The outcome of one OpInfo entry for one dtype.

    status: "pass", "shape-only" (random/uninitialised outputs: metadata checked),
    "skip" (reason in `detail`), "n/a" (op_db has no CPU support for the dtype), "fail" (an error was raised on the device) or
    "mismatch" (ran, but values/shapes/dtypes/grads differ from CPU).
    """

    op: str
    dtype: torch.dtype
    status: str
    detail: str = ""
    samples: int = 0
    grad_checked: int = 0
    seconds: float = 0.0
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "shape-only", "skip", "n/a")


class Mismatch(AssertionError):
    """The device ran the op but its result differs from CPU."""


@dataclass
class _Moved:
    """A sample moved to the device, with its gradient leaves in the same order as CPU's."""

    input: Any
    args: Any
    kwargs: Any
    leaves: list = field(default_factory=list)


def _collect_leaves(value, leaves: list) -> None:
    """Tensors that require grad, in the order `_move` meets them (each tensor once)."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad and not any(value is leaf for leaf in leaves):
            leaves.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_leaves(item, leaves)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_leaves(item, leaves)


def _move(value, device: str, leaves: list, memo: dict):
    """A copy of `value` with every tensor on `device`; tensors that require grad become
    leaves there (appended to `leaves` in traversal order) and `device=` keywords follow.
    A tensor that appears twice in a sample is moved once (`memo`), so its gradient sums
    both uses as on CPU."""
    if isinstance(value, torch.Tensor):
        if id(value) in memo:
            return memo[id(value)]
        moved = value.detach().to(device, copy=True)
        if value.requires_grad:
            moved.requires_grad_(True)
            leaves.append(moved)
        memo[id(value)] = moved
        return moved
    if isinstance(value, torch.device) or (isinstance(value, str) and value == "cpu"):
        # device arguments (`x.to("cpu", ...)`, `device=`) name the device under test
        return torch.device(device)
    if isinstance(value, list):
        return [_move(v, device, leaves, memo) for v in value]
    if isinstance(value, tuple):
        return tuple(_move(v, device, leaves, memo) for v in value)
    if isinstance(value, dict):
        return {k: _move_kwarg(k, v, device, leaves, memo) for k, v in value.items()}
    return value


def _move_kwarg(key: str, value, device: str, leaves: list, memo: dict):
    if key == "device" and isinstance(value, (str, torch.device)):
        return torch.device(device)
    return _move(value, device, leaves, memo)


def move_sample(sample, device: str) -> _Moved:
    """The sample's input, args and kwargs on `device` (CPU-side leaves keep their order)."""
    leaves: list = []
    memo: dict = {}
    return _Moved(
        _move(sample.input, device, leaves, memo),
        _move(sample.args, device, leaves, memo),
        _move(sample.kwargs, device, leaves, memo),
        leaves,
    )


def _flatten(value) -> list:
    """Outputs as a flat list (tensors, numbers, sizes...), namedtuples and nesting removed."""
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def _to_cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def compare_outputs(actual, expected, shape_only: bool, what: str, factor: float = 1.0, device: str = DEVICE):
    """Raise Mismatch unless the outputs `actual` (on `device`) match the CPU outputs `expected`."""
    actual_flat, expected_flat = _flatten(actual), _flatten(expected)
    if len(actual_flat) != len(expected_flat):
        raise Mismatch(f"{what}: {len(actual_flat)} outputs on {device}, {len(expected_flat)} on cpu")
    for index, (got, want) in enumerate(zip(actual_flat, expected_flat)):
        label = f"{what}[{index}]"
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise Mismatch(f"{label}: expected a tensor, got {type(got).__name__}")
            if want.device.type == "cpu" and got.device.type != torch.device(device).type:
                raise Mismatch(f"{label}: output is on {got.device}, expected {device}")
            got = _to_cpu(got)
            if got.shape != want.shape or got.dtype != want.dtype:
                raise Mismatch(
                    f"{label}: got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
                )
            if shape_only or want.is_complex():
                continue
            rtol, atol = FORWARD_TOLERANCES.get(want.dtype, (0.0, 0.0))
            try:
                torch.testing.assert_close(
                    got, want, rtol=rtol * factor, atol=atol * factor, equal_nan=True, check_stride=False
                )
            except AssertionError as error:
                raise Mismatch(f"{label}: {_first_lines(str(error), 4)}") from None
        elif want is None or got is None:
            if got is not want:
                raise Mismatch(f"{label}: got {got!r}, expected {want!r}")
        elif not shape_only:
            try:
                torch.testing.assert_close(got, want, equal_nan=True)
            except (AssertionError, TypeError) as error:
                raise Mismatch(f"{label}: got {got!r}, expected {want!r} ({_first_lines(str(error), 1)})") from None


def _first_lines(text: str, count: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[:count])


def _differentiable_outputs(outputs: list) -> list[int]:
    return [
        i
        for i, out in enumerate(outputs)
        if isinstance(out, torch.Tensor) and out.requires_grad and out.dtype.is_floating_point
    ]


def _is_random_sample(op, sample, expected, seed: int) -> bool:
    """True if the op's CPU output for this sample changes with the RNG seed."""
    torch.manual_seed(seed + 1_000_003)
    with torch.no_grad():
        again = op(sample.input, *sample.args, **sample.kwargs)
    try:
        compare_outputs(again, expected, False, "output", device="cpu")
    except Mismatch:
        return True
    return False


def _check_sample(op, sample, shape_only: bool, check_grad: bool, seed: int) -> bool:
    """Run one sample on CPU and on the device and compare; True if gradients were compared."""
    moved = move_sample(sample, DEVICE)
    cpu_leaves: list = []
    _collect_leaves((sample.input, sample.args, sample.kwargs), cpu_leaves)

    torch.manual_seed(seed)
    expected = op(sample.input, *sample.args, **sample.kwargs)
    # Some samples of deterministic ops draw random numbers: if CPU itself gives another
    # answer under another seed, only metadata can match.
    # OpInfo seeds CPU's generator inside some ops (attention with dropout_p > 0), which
    # the seed check cannot see: a positive dropout_p means random values too.
    draws_dropout = (sample.kwargs.get("dropout_p") or 0) > 0
    shape_only = shape_only or draws_dropout or _is_random_sample(op, sample, expected, seed)
    torch.manual_seed(seed)
    actual = op(moved.input, *moved.args, **moved.kwargs)
    compare_outputs(actual, expected, shape_only, "output")

    if not (check_grad and cpu_leaves) or shape_only:
        return False
    expected_outs = _flatten(sample.output_process_fn_grad(expected))
    actual_outs = _flatten(sample.output_process_fn_grad(actual))
    picked = _differentiable_outputs(expected_outs)
    if not picked:
        return False
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(expected_outs[i].shape, generator=generator, dtype=expected_outs[i].dtype) for i in picked]
    expected_grads = torch.autograd.grad(
        [expected_outs[i] for i in picked], cpu_leaves, cotangents, allow_unused=True
    )
    actual_grads = torch.autograd.grad(
        [actual_outs[i] for i in picked],
        moved.leaves,
        [c.to(DEVICE) for c in cotangents],
        allow_unused=True,
    )
    compare_outputs(list(actual_grads), list(expected_grads), False, "grad", factor=GRAD_TOLERANCE_FACTOR)
    return True


def check_op(op, dtype: torch.dtype = torch.float32, max_samples: int | None = None, check_grad: bool = True) -> OpResult:
    """Compare one OpInfo entry on the device against CPU; never raises (the result says why)."""
    name = op_id(op)
    reason = skip_reason(op, dtype)
    if reason is not None:
        return OpResult(name, dtype, "n/a" if reason == NOT_APPLICABLE else "skip", reason)
    shape_only = name in SHAPE_ONLY
    wants_grad = check_grad and op.supports_autograd and dtype.is_floating_point
    start = time.perf_counter()
    result = OpResult(name, dtype, "shape-only" if shape_only else "pass")
    try:
        torch.manual_seed(0)
        samples = op.sample_inputs("cpu", dtype, requires_grad=wants_grad)
        for index, sample in enumerate(samples):
            if max_samples is not None and index >= max_samples:
                break
            try:
                grad_checked = _check_sample(op, sample, shape_only, wants_grad, seed=index)
            except Exception as error:
                error.add_note(f"sample {index}: {_describe(sample)}")
                raise
            result.samples += 1
            result.grad_checked += int(grad_checked)
    except Mismatch as error:
        result.status, result.detail = "mismatch", _error_text(error)
    except Exception as error:  # noqa: BLE001 - the report must name every failure
        result.status, result.detail = "fail", _error_text(error)
        result.where = _innermost_project_frame(error)
    result.seconds = time.perf_counter() - start
    return result


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {_first_lines(str(error), 3)}"
    # our own "sample i: ..." notes; JAX adds a long note about filtered frames
    notes = [note for note in getattr(error, "__notes__", ()) if note.startswith("sample ")]
    if notes:
        text += f" [{'; '.join(notes)}]"
    return text[:600]


def _innermost_project_frame(error: BaseException) -> str:
    """file:line of the deepest frame inside this project (where T1/T2 should look)."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if "/tpu_backend/" in frame.filename:
            return f"{frame.filename.split('/work/main/')[-1]}:{frame.lineno}"
    return ""


def _describe(sample) -> str:
    def describe(value):
        if isinstance(value, torch.Tensor):
            return f"T{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(describe(v) for v in value[:6])
            return f"[{inner}{', ...' if len(value) > 6 else ''}]"
        return repr(value)[:40]

    parts = [describe(sample.input)] + [describe(a) for a in sample.args]
    parts += [f"{k}={describe(v)}" for k, v in sample.kwargs.items()]
    return f"({', '.join(parts)})"


def run_ops(
    ops: Iterable, dtype: torch.dtype = torch.float32, max_samples: int | None = None, check_grad: bool = True
) -> list[OpResult]:
    return [check_op(op, dtype, max_samples=max_samples, check_grad=check_grad) for op in ops]
