"""bf16 autocast on the device: matmul family in bf16, precision-sensitive ops in float32."""

import copy

import pytest
import torch

import tpu_backend  # noqa: F401
from tests import chip
from tests.tpu_backend.parity import norm_relative_error


def test_linear_and_matmul_run_in_bfloat16():
    x = torch.randn(4, 8).to("tpu")
    linear = torch.nn.Linear(8, 3).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = linear(x)
        z = x @ x.t()
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = linear.cpu()(x.cpu())
    torch.testing.assert_close(y.float().cpu(), expected.float(), rtol=2e-2, atol=2e-2)


def test_default_autocast_dtype_is_bfloat16():
    x = torch.randn(2, 2).to("tpu")
    with torch.autocast("tpu"):
        assert (x @ x).dtype == torch.bfloat16


def test_softmax_runs_in_float32_under_autocast():
    x = torch.randn(4, 8).to("tpu").to(torch.bfloat16)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = torch.softmax(x, dim=-1)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), torch.softmax(x.cpu().float(), dim=-1), rtol=1e-5, atol=1e-6)


def test_autocast_off_outside_context():
    x = torch.randn(2, 2).to("tpu")
    assert (x @ x).dtype == torch.float32


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bfloat16, kept in float32 (what an autocast cast does to values)."""
    return t.bfloat16().float()


def test_backward_through_autocast_gives_float32_grads_with_bf16_values():
    """linear autocasts to bf16, layer_norm runs in float32: the dtypes of each op, the
    loss and the gradients against the same casts written out on CPU."""
    torch.manual_seed(0)
    linear, x, weights = torch.nn.Linear(8, 4), torch.randn(16, 8), torch.randn(4)
    device_linear = copy.deepcopy(linear).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        hidden = device_linear(x.to("tpu"))
        normed = torch.nn.functional.layer_norm(hidden, (4,))
        probabilities = torch.softmax(hidden, dim=-1)
    loss = (normed * weights.to("tpu")).sum()
    loss.backward()
    assert (hidden.dtype, normed.dtype, probabilities.dtype, loss.dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.float32,
    )
    assert device_linear.weight.grad.dtype == torch.float32 and device_linear.bias.grad.dtype == torch.float32

    want_hidden = _bf16(torch.nn.functional.linear(_bf16(x), _bf16(linear.weight), _bf16(linear.bias)))
    want_loss = (torch.nn.functional.layer_norm(want_hidden, (4,)) * weights).sum()
    want_loss.backward()
    torch.testing.assert_close(hidden.cpu().float(), want_hidden, rtol=1e-2, atol=1e-2)
    # softmax in float32 of the bf16 values it was given (bf16 matmuls may round differently)
    torch.testing.assert_close(probabilities.cpu(), torch.softmax(hidden.cpu().float(), -1), rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-2)
    for name in ("weight", "bias"):
        error = norm_relative_error(getattr(device_linear, name).grad, getattr(linear, name).grad)
        assert error <= 2e-2, f"{name} gradient: relative error {error:.3g} (bf16 rounding allows 2e-2)"


# --- torch.amp.GradScaler on the device --------------------------------------------------


def _scaled_training(device: str, optimizer_name: str, steps: int = 5) -> list[dict]:
    """GradScaler training of a small MLP on `device`; per step the scale, growth tracker,
    unscaled gradients and parameters. Step 1's loss is multiplied by inf (the step must
    be skipped and the scale backed off); growth_interval 2 makes the scale grow too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)
    if optimizer_name == "sgd":  # foreach: the gradient's scale goes straight into the parameters
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:  # fused: GradScaler hands grad_scale/found_inf to the optimizer instead of unscale_
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    inputs, targets = torch.randn(16, 6), torch.randn(16, 3)
    record = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        scaler.scale(loss * (float("inf") if step == 1 else 1.0)).backward()
        if optimizer_name == "sgd":
            scaler.unscale_(optimizer)
        grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        record.append(
            {
                "scale": scaler.get_scale(),
                "tracker": int(scaler._growth_tracker.item()),
                "grads": grads,
                "params": [p.detach().cpu().clone() for p in model.parameters()],
            }
        )
    return record


# The chip's tanh is another float32 approximation than CPU's, and five steps carry it into
# the parameters: 1.13e-5 seen on a v5e (sgd and fused AdamW)
BOUND = chip.tolerance("transcendentals", cpu=1e-5, tpu=1e-4)


@pytest.mark.parametrize("optimizer_name", ["sgd", "adamw-fused"])
def test_grad_scaler_trains_like_cpu_skipping_the_step_that_overflowed(optimizer_name):
    got, want = _scaled_training("tpu", optimizer_name), _scaled_training("cpu", optimizer_name)
    # 1024 after one good step; step 1 overflows: halved; two good steps later: doubled
    assert [r["scale"] for r in want] == [1024.0, 512.0, 512.0, 1024.0, 1024.0]
    assert all(torch.equal(a, b) for a, b in zip(got[1]["params"], got[0]["params"])), (
        "the step whose gradients overflowed must not move the parameters"
    )
    for step, (g, w) in enumerate(zip(got, want)):
        assert (g["scale"], g["tracker"]) == (w["scale"], w["tracker"]), f"step {step}"
        for name, gs, ws in (("gradient", g["grads"], w["grads"]), ("parameter", g["params"], w["params"])):
            for i, (a, b) in enumerate(zip(gs, ws)):
                if step == 1 and name == "gradient":  # inf/NaN on both: the same non-finite pattern
                    assert torch.equal(a.isfinite(), b.isfinite()), f"step 1 gradient {i}"
                    continue
                error = norm_relative_error(a, b)  # fused AdamW's gradients are still scaled (x1024)
                assert error <= BOUND, f"step {step} {name} {i}: relative error {error:.3g}"


@pytest.mark.parametrize(
    "scale, tracker, found, want",
    [
        (1024.0, 0, 1.0, "backoff"),
        (1024.0, 0, 0.0, "count"),
        (1024.0, 2, 0.0, "grow"),  # the third good step of interval 3
        (3.0e38, 2, 0.0, "grown scale is inf: kept"),
    ],
)
def test_update_scale_and_unscale_ops_match_cpu(scale, tracker, found, want):
    def run(device):
        s = torch.full((1,), scale, device=device)
        t = torch.full((1,), tracker, dtype=torch.int32, device=device)
        returned = torch._amp_update_scale_(s, t, torch.full((1,), found, device=device), 2.0, 0.5, 3)
        assert returned is s  # in place, returning self
        grads = [torch.tensor([1.0, 2.0], device=device), torch.tensor([3.0, -4.0], device=device)]
        grads[1] = grads[1].to(torch.bfloat16)
        flag = torch.full((1,), found, device=device)  # left as it was: the caller zeroes it
        torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, torch.full((1,), 0.25, device=device))
        return s.cpu(), t.cpu(), [g.cpu() for g in grads], flag.cpu()

    got, expected = run("tpu"), run("cpu")
    for a, b in zip(got[:2], expected[:2]):
        assert torch.equal(a, b), f"{want}: {a} != {b}"
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got[2], expected[2]))
    assert torch.equal(got[3], expected[3])


def test_unscale_flags_an_inf_or_nan_in_any_gradient():
    for bad in (float("inf"), float("nan")):
        grads = [torch.ones(3).to("tpu"), torch.tensor([1.0, bad, 2.0]).to("tpu")]
        flag = torch.zeros(1).to("tpu")
        torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, torch.full((1,), 0.5).to("tpu"))
        assert flag.item() == 1.0, f"{bad} not flagged"
        assert grads[0].cpu().tolist() == [0.5, 0.5, 0.5]


def test_grad_scaler_lowerings_compile_for_a_v5e():
    """libtpu's compiler on this host (no chip): the unscale over two gradient dtypes and the
    scale update (float64 products of one element) compile for a v5e."""
    import jax.numpy as jnp
    from jax import ShapeDtypeStruct

    from tests.helpers import compile_for_tpu
    from tpu_backend.ops.amp import amp_foreach_non_finite_check_and_unscale, amp_update_scale

    one = ShapeDtypeStruct((1,), jnp.float32)
    compile_for_tpu(
        lambda g, h, found, inv: amp_foreach_non_finite_check_and_unscale([g, h], found, inv),
        ShapeDtypeStruct((128, 256), jnp.float32),
        ShapeDtypeStruct((300,), jnp.bfloat16),
        one,
        one,
    )
    compile_for_tpu(
        lambda scale, tracker, found, growth, backoff: amp_update_scale(scale, tracker, found, growth, backoff, 2000),
        one,
        ShapeDtypeStruct((1,), jnp.int32),
        one,
        ShapeDtypeStruct((), jnp.float64),
        ShapeDtypeStruct((), jnp.float64),
    )
