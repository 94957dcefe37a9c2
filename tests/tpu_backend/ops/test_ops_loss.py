"""Loss lowerings (forward and backward) agree with PyTorch on CPU."""

import pytest
import torch
from ops_parity import assert_lowers_for_tpu, assert_same, check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_forward_and_backward(reduction, weighted):
    logp = torch.log_softmax(torch.randn(6, 5), 1)
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    weight = torch.rand(5) + 0.5 if weighted else None
    out, total = check(aten.nll_loss_forward.default, logp, target, weight, reduction, -100, **TOL)
    grad = torch.randn(out.shape)
    check(aten.nll_loss_backward.default, grad, logp, target, weight, reduction, -100, total, **TOL)


def test_nll_loss_unbatched_and_2d():
    logp = torch.log_softmax(torch.randn(5), 0)
    check(aten.nll_loss_forward.default, logp, torch.tensor(3), None, 1, -100, **TOL)
    logp = torch.log_softmax(torch.randn(2, 4, 3, 5), 1)
    target = torch.randint(0, 4, (2, 3, 5))
    for reduction in (0, 1):
        out, total = check(aten.nll_loss2d_forward.default, logp, target, None, reduction, 1, **TOL)
        check(aten.nll_loss2d_backward.default, torch.randn(out.shape), logp, target, None, reduction, 1, total, **TOL)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_regression_and_classification_losses(reduction):
    x, t = torch.randn(4, 5), torch.randn(4, 5)
    p, y = torch.rand(4, 5) * 0.98 + 0.01, (torch.rand(4, 5) > 0.5).float()
    w = torch.rand(4, 5)
    g = torch.randn(()) if reduction else torch.randn(4, 5)
    check(aten.mse_loss.default, x, t, reduction, **TOL)
    check(aten.mse_loss_backward.default, g, x, t, reduction, **TOL)
    for beta in (1.0, 0.5, 0.0):
        check(aten.smooth_l1_loss.default, x, t, reduction, beta, **TOL)
        check(aten.smooth_l1_loss_backward.default, g, x, t, reduction, beta, **TOL)
    check(aten.huber_loss.default, x, t, reduction, 0.7, **TOL)
    check(aten.huber_loss_backward.default, g, x, t, reduction, 0.7, **TOL)
    check(aten.binary_cross_entropy.default, p, y, w, reduction, **TOL)
    check(aten.binary_cross_entropy_backward.default, g, p, y, w, reduction, **TOL)
    check(aten.binary_cross_entropy_with_logits.default, x, y, w, torch.rand(5) + 0.5, reduction, **TOL)
    check(aten.binary_cross_entropy_with_logits.default, x, y, None, None, reduction, **TOL)
    check(aten.soft_margin_loss.default, x, y * 2 - 1, reduction, **TOL)
    check(aten.soft_margin_loss_backward.default, g, x, y * 2 - 1, reduction, **TOL)


def _ctc_case():
    torch.manual_seed(0)
    log_probs = torch.randn(12, 4, 5).log_softmax(-1)
    targets = torch.randint(1, 5, (4, 5))
    targets[1, 1] = targets[1, 0]  # a repeated label needs a blank between
    # row 0's 5 labels fit 12 steps; row 2 has no target; row 3's 4 labels cannot fit 3 steps (infinite)
    return log_probs, targets, [12, 10, 7, 3], [5, 3, 0, 4]


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_and_gradient(zero_infinity):
    """The alpha recursion's likelihood (padded and concatenated targets), log_alpha where ATen
    defines it (its memory past each row's input and target is uninitialised), and ATen's gradient."""
    log_probs, targets, input_lengths, target_lengths = _ctc_case()
    args = (input_lengths, target_lengths, 0, zero_infinity)
    expected_nll, expected_alpha = aten._ctc_loss.default(log_probs, targets, *args)
    assert torch.isinf(expected_nll[3])
    flat = torch.cat([row[:n] for row, n in zip(targets, target_lengths)])
    for labels in (targets, flat):
        nll, log_alpha = run_lowering(aten._ctc_loss.default, log_probs, labels, *args)
        assert_same(nll, expected_nll, atol=1e-5, rtol=1e-5)
        for row, (steps, length) in enumerate(zip(input_lengths, target_lengths)):
            defined = (slice(0, steps), slice(0, 2 * length + 1))
            assert_same(log_alpha[row][defined], expected_alpha[row][defined], atol=1e-5, rtol=1e-5)
    grad = torch.randn(4)
    check(
        aten._ctc_loss_backward.default,
        grad, log_probs, targets, input_lengths, target_lengths, expected_nll, expected_alpha, 0, zero_infinity,
        atol=1e-5, rtol=1e-4,
    )  # fmt: skip
    assert_lowers_for_tpu(aten._ctc_loss.default, log_probs, targets, *args)
    assert_lowers_for_tpu(
        aten._ctc_loss_backward.default,
        grad, log_probs, targets, input_lengths, target_lengths, expected_nll, expected_alpha, 0, zero_infinity,
    )  # fmt: skip
