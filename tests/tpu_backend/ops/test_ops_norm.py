"""Softmax and normalisation lowerings (forward and backward) agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family(dim):
    x = torch.randn(3, 4, 5)
    g = torch.randn(3, 4, 5)
    y = check(aten._softmax.default, x, dim, False, **TOL)
    check(aten._softmax_backward_data.default, g, y, dim, torch.float32, **TOL)
    z = check(aten._log_softmax.default, x, dim, False, **TOL)
    check(aten._log_softmax_backward_data.default, g, z, dim, torch.float32, **TOL)


def test_softmax_half_to_float():
    x = torch.randn(4, 6).half()
    out = run_lowering(aten._softmax.default, x, 1, True)  # CPU has no half_to_float kernel (CUDA does)
    torch.testing.assert_close(out, torch.softmax(x.float(), 1), **TOL)
    check(aten._log_softmax.default, x.bfloat16(), 1, False, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_forward_and_backward(affine):
    x = torch.randn(2, 3, 8)
    w, b = (torch.randn(3, 8), torch.randn(3, 8)) if affine else (None, None)
    out, mean, rstd = check(aten.native_layer_norm.default, x, [3, 8], w, b, 1e-5, **TOL)
    g = torch.randn(2, 3, 8)
    check(aten.native_layer_norm_backward.default, g, x, [3, 8], mean, rstd, w, b, [True, affine, affine], **TOL)


def test_layer_norm_bfloat16_stats_dtype():
    x = torch.randn(4, 16).bfloat16()
    w = torch.randn(16).bfloat16()
    check(aten.native_layer_norm.default, x, [16], w, w, 1e-5, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_norm_forward_backward_and_running_stats(training, shape):
    x = torch.randn(*shape) * 2 + 1
    w, b = torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm_cpu, rv_cpu = rm.clone(), rv.clone()
    if training:
        out, save_mean, save_invstd = check(
            aten.native_batch_norm.default, x, w, b, rm_cpu, rv_cpu, training, 0.1, 1e-5, **TOL
        )
    else:
        out, save_mean, save_invstd = check_eval_batch_norm(aten.native_batch_norm.default, x, w, b, rm, rv, False)
    # ATen updated rm_cpu/rv_cpu in place; the functional lowering returns the new values.
    results = run_lowering(aten._native_batch_norm_legit_functional.default, x, w, b, rm, rv, training, 0.1, 1e-5)
    torch.testing.assert_close(results[3], rm_cpu, **TOL)
    torch.testing.assert_close(results[4], rv_cpu, **TOL)
    torch.testing.assert_close(results[0], out, **TOL)
    g = torch.randn(*shape)
    check(
        aten.native_batch_norm_backward.default,
        g,
        x,
        w,
        rm,
        rv,
        save_mean,
        save_invstd,
        training,
        1e-5,
        [True, True, True],
        **TOL,
    )


def check_eval_batch_norm(op, x, *args):
    """An eval-mode batch norm: the output as on CPU; save_mean and save_invstd as ATen's
    meta kernel shapes them (what a compiled graph expects, and CUDA gives: the running
    statistics used), where ATen's CPU kernel returns empty tensors."""
    expected = op(x, *args, 0.1, 1e-5)
    actual = run_lowering(op, x, *args, 0.1, 1e-5)
    torch.testing.assert_close(actual[0], expected[0], **TOL)
    meta = op(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in (x, *args)), 0.1, 1e-5)
    assert [(t.shape, t.dtype) for t in actual] == [(t.shape, t.dtype) for t in meta]
    running_mean, running_var = args[2], args[3]
    torch.testing.assert_close(actual[1], running_mean, **TOL)
    torch.testing.assert_close(actual[2], (running_var + 1e-5).rsqrt(), **TOL)
    return expected


def test_batch_norm_legit_variants():
    x = torch.randn(4, 3, 5)
    w, b, rm, rv = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    check_eval_batch_norm(aten._native_batch_norm_legit_no_training.default, x, w, b, rm, rv)
    check(aten._native_batch_norm_legit.no_stats, x, w, b, True, 0.1, 1e-5, **TOL)
    check(aten._native_batch_norm_legit.default, x, None, None, rm.clone(), rv.clone(), True, 0.1, 1e-5, **TOL)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_forward_and_backward(affine):
    x = torch.randn(2, 6, 4, 3)
    w, b = (torch.randn(6), torch.randn(6)) if affine else (None, None)
    out, mean, rstd = check(aten.native_group_norm.default, x, w, b, 2, 6, 12, 3, 1e-5, **TOL)
    g = torch.randn(2, 6, 4, 3)
    check(aten.native_group_norm_backward.default, g, x, mean, rstd, w, 2, 6, 12, 3, [True, affine, affine], **TOL)


def test_safe_softmax_zeroes_fully_masked_rows():
    x = torch.randn(3, 4)
    x[1] = float("-inf")
    check(aten._safe_softmax.default, x, -1, **TOL)
    check(aten._safe_softmax.default, x, 0, dtype=torch.float64, **TOL)


def test_batch_norm_with_update_family():
    x = torch.randn(4, 3, 5)
    w, b, rm, rv = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    rm_cpu, rv_cpu = rm.clone(), rv.clone()
    out, mean, invstd, _ = check(aten._batch_norm_with_update.default, x, w, b, rm_cpu, rv_cpu, 0.1, 1e-5, **TOL)
    results = run_lowering(aten._batch_norm_with_update_functional.default, x, w, b, rm, rv, 0.1, 1e-5)
    torch.testing.assert_close(results[4], rm_cpu, **TOL)
    torch.testing.assert_close(results[5], rv_cpu, **TOL)
    check_eval_batch_norm(aten._batch_norm_no_update.default, x, w, b, rm, rv)
    g = torch.randn(4, 3, 5)
    reserve = torch.empty(0, dtype=torch.uint8)
    check(
        aten.batch_norm_backward.default, g, x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True], reserve, **TOL
    )
    check(
        aten.batch_norm_backward.default, g, x, w, rm, rv, None, None, False, 1e-5, [True, True, True], reserve, **TOL
    )


@pytest.mark.parametrize("dim", [0, 2])  # ATen's fused CPU kernel takes the first or last dim
def test_weight_norm_interface_and_backward(dim):
    v = torch.randn(4, 3, 2)
    g = torch.rand(4, 1, 1) + 0.5 if dim == 0 else torch.rand(1, 1, 2) + 0.5
    w, norms = check(aten._weight_norm_interface.default, v, g, dim, **TOL)
    check(aten._weight_norm_interface_backward.default, torch.randn(w.shape), v, g, norms, dim, **TOL)
