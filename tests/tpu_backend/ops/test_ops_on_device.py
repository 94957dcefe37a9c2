"""The lowering table through the real "tpu" device: ops users call, against CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_backend  # noqa: F401  (registers the device)
from tests import chip
from tests.tpu_backend.parity import assert_runs_match, assert_tensors_match, record_training

torch.manual_seed(0)


def on_tpu(*tensors):
    return [t.to("tpu") for t in tensors]


def test_scalar_promotion_and_pointwise_on_device():
    x = torch.randint(-5, 5, (3, 4))
    (xt,) = on_tpu(x)
    for fn in (
        lambda a: a + 2.5,
        lambda a: a / 2,
        lambda a: a // 3,
        lambda a: (a > 0) * 1.5,
        lambda a: a.float().exp(),
        lambda a: a**2,
    ):
        expected, got = fn(x), fn(xt).cpu()
        assert got.dtype == expected.dtype
        # exp(4) is 2.6e-6 relative from CPU's on a v5e
        torch.testing.assert_close(
            got, expected, **chip.tolerance("transcendentals", cpu={}, tpu=dict(rtol=1e-5, atol=1e-5))
        )


def test_bool_mask_indexing_and_data_dependent_ops_on_device():
    x = torch.randn(4, 5)
    mask = x > 0
    xt, maskt = on_tpu(x, mask)
    torch.testing.assert_close(xt[maskt].cpu(), x[mask])
    torch.testing.assert_close(torch.nonzero(maskt).cpu(), torch.nonzero(mask))
    torch.testing.assert_close(xt[:, torch.tensor([0, 3], device="tpu")].cpu(), x[:, [0, 3]])
    y, yt = x.clone(), xt.clone()
    y[mask] = 0.0
    yt[maskt] = 0.0
    torch.testing.assert_close(yt.cpu(), y)
    torch.testing.assert_close(torch.unique(xt.round()).cpu(), torch.unique(x.round()))
    values, indices = torch.sort(xt, dim=1, descending=True)
    torch.testing.assert_close(values.cpu(), torch.sort(x, dim=1, descending=True).values)


def test_batch_norm_running_stats_update_on_device():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    device_model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )
    device_model.load_state_dict(model.state_dict())
    device_model = device_model.to("tpu")
    x = torch.randn(4, 3, 8, 8)
    model(x).sum().backward()
    device_model(x.to("tpu")).sum().backward()
    torch.testing.assert_close(device_model[1].running_mean.cpu(), model[1].running_mean)
    torch.testing.assert_close(device_model[1].running_var.cpu(), model[1].running_var)
    torch.testing.assert_close(device_model[0].weight.grad.cpu(), model[0].weight.grad, atol=1e-4, rtol=1e-4)
    model.eval(), device_model.eval()
    torch.testing.assert_close(device_model(x.to("tpu")).cpu(), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "sgd_momentum"])
def test_foreach_optimizer_step_with_clipping_matches_cpu(optimizer):
    """clip_grad_norm_ (which really clips: the norm is above max_norm) then a foreach
    optimizer step: losses, the clipped gradients of step 1 and the final parameters
    match CPU. SGD passes the clipped gradient's scale into the parameters; Adam would not.
    On a v5e the first loss is 1.03e-5 relative from CPU's (its exp in cross-entropy)."""
    rtol = chip.tolerance("transcendentals", cpu=1e-5, tpu=5e-5)
    make = {
        "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, foreach=True),
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    }[optimizer]
    max_norm = 0.1
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    device_model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    device_model.load_state_dict(model.state_dict())
    device_model = device_model.to("tpu")
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    runs, norms = {}, {}
    for name, m, inputs in (("cpu", model, (x, y)), ("tpu", device_model, on_tpu(x, y))):
        opt = make(m.parameters())
        norms[name] = []

        def step(inputs, target, m=m, opt=opt, name=name):
            opt.zero_grad()
            loss = F.cross_entropy(m(inputs), target)
            loss.backward()
            norms[name].append(torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm).item())
            opt.step()
            return loss

        runs[name] = record_training(m, step, [inputs] * 3)
    assert min(norms["cpu"]) > max_norm, f"the gradient norms {norms['cpu']} never reach max_norm: nothing clipped"
    assert norms["tpu"] == pytest.approx(norms["cpu"], rel=rtol)
    clipped = torch.linalg.vector_norm(torch.stack([g.norm() for g in runs["tpu"].first_gradients.values()])).item()
    assert clipped == pytest.approx(max_norm, rel=1e-5)
    assert_runs_match(runs["tpu"], runs["cpu"], f"{optimizer} with clip_grad_norm_", loss_rtol=rtol)


def test_eval_batch_norm_backward_with_transposed_grad_is_right_on_device():
    """Eval-mode BatchNorm followed by `flatten(2).transpose(1, 2)` (a ViT-style patch
    embedding) hands batch norm's backward a grad_output with channels-last strides.
    PyTorch CPU gets the weight and bias gradients wrong there for a batch of one (torch
    2.13: relative error 1-1.7, in float32 and float64 alike), so CPU is no reference:
    the device is compared with the math, in float64:
        d weight = sum(g * x_hat),  d bias = sum(g),  d x = g * weight / sqrt(var + eps)."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).eval()
    with torch.no_grad():
        bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2.0), bn.weight.normal_(), bn.bias.normal_()
    x, g = torch.randn(1, 3, 16, 16), torch.randn(1, 256, 3)
    device_bn = copy.deepcopy(bn).to("tpu")
    x_device = x.to("tpu").requires_grad_()
    (device_bn(x_device).flatten(2).transpose(1, 2) * g.to("tpu")).sum().backward()

    inverse_std = (bn.running_var.double() + bn.eps).rsqrt()[None, :, None, None]
    x_hat = (x.double() - bn.running_mean.double()[None, :, None, None]) * inverse_std
    g_nchw = g.double().transpose(1, 2).reshape(1, 3, 16, 16)
    want = {
        "weight": (g_nchw * x_hat).sum((0, 2, 3)),
        "bias": g_nchw.sum((0, 2, 3)),
        "input": g_nchw * bn.weight.double()[None, :, None, None] * inverse_std,
    }
    got = {"weight": device_bn.weight.grad, "bias": device_bn.bias.grad, "input": x_device.grad}
    assert_tensors_match(got, want, "eval batch norm backward on tpu vs the math", rtol=1e-5, floor=1e-6)


def test_logcumsumexp_gradient_is_stable_in_float32():
    """The device's backward (tpu_backend/gradients.py) stays within 1e-6 of the float64
    gradient where ATen's own float32 formula is 1e-3 off (inputs near 1e4, signed cotangents),
    and the forward is unchanged. Leading -inf inputs get their true gradient, 0 (ATen's formula
    gives NaN there, in float64 too). On a TPU, whose exp is ~5e-6 relative from CPU's,
    within 1e-4 (seen: 3.7e-5)."""
    x = torch.full((5, 6), 1e4) + torch.randn(5, 6)
    x[0, :2] = -float("inf")
    grad = torch.randn(5, 6)
    x64 = x.double().requires_grad_()
    expected = torch.autograd.grad(torch.logcumsumexp(x64, 1), x64, grad.double())[0]
    (xt,) = on_tpu(x)
    xt.requires_grad_()
    out = torch.logcumsumexp(xt, 1)
    torch.testing.assert_close(out.cpu(), torch.logcumsumexp(x, 1))
    got = torch.autograd.grad(out, xt, grad.to("tpu"))[0].cpu()
    assert torch.isnan(expected[0, :2]).all() and (got[0, :2] == 0).all()
    expected[0, :2] = 0
    torch.testing.assert_close(
        got.double(), expected, atol=chip.tolerance("transcendentals", cpu=1e-6, tpu=1e-4), rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_max_norm_renormalises_the_weight_in_place(dtype):
    """`F.embedding(max_norm=)` / `embedding_bag` rescale the looked-up rows of the weight
    itself (aten.embedding_renorm_), as on CPU."""
    weight = torch.randn(10, 4, dtype=dtype) * 2
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 3])
    cpu_weight, (device_weight, device_indices, device_offsets) = weight.clone(), on_tpu(weight, indices, offsets)
    expected = F.embedding_bag(indices, cpu_weight, offsets, max_norm=1.0)
    got = F.embedding_bag(device_indices, device_weight, device_offsets, max_norm=1.0)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}  # bf16 ulps
    torch.testing.assert_close(got.cpu(), expected, **tolerance)
    torch.testing.assert_close(device_weight.cpu(), cpu_weight, **tolerance)
    assert not torch.equal(cpu_weight, weight)  # the sample does renormalise
