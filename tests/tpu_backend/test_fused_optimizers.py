"""`torch.optim.X(..., fused=True)` on the device: ATen's fused optimizer ops
(`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_`) against the same
optimizers on CPU, where PyTorch runs its own fused CPU kernels.

Each case starts both devices from the same parameters, gives them the same gradients
(three scales, 1e-1 to 1e1; a tensor long enough for ATen's vector lanes and short ones)
for a few steps, and compares the parameters and every state tensor (moments, maxima,
momentum buffers, step counts) elementwise within `rtol * |want| + ulps * max|want|`:
- float32: rtol 1e-6 and 2 ulps of the tensor's largest element. The device does ATen's
  arithmetic in ATen's order; what differs is the rounding of single operations (FMA
  contraction, XLA's fusion, bias corrections computed in float32 rather than float64 and
  rounded): seen up to 1 ulp of the operands, e.g. 1.9e-6 in a momentum buffer of 25;
- bfloat16: rtol 1e-2 (about 2 ulps) and 2 ulps of the largest element; the Adam, AdamW and
  Adagrad cases below came out bitwise equal to ATen's fused kernels. SGD is compared with the
  single-tensor `foreach=False` implementation instead: torch 2.13's fused CPU SGD kernel
  does not update the vectorised part of a bfloat16 parameter (16 of 20 elements here
  stay unchanged), so it is no reference there.
On a TPU the float32 bound is rtol 1e-5 and 2**-14 of the largest element (chip difference
"transcendentals": the bias corrections' log1p/expm1 and the square roots are other
float32 approximations there, ~5e-6 relative for exp on a v5e; a 10% error in one update
of a parameter of 1 at lr 1e-2 is still 1e-3, far outside it).
"""

from concurrent.futures import Future

import pytest
import torch

import tpu_backend
from tests import chip
from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager import registration
from tpu_backend.eager import runner as runner_module
from tpu_backend.eager.runner import CACHE_STATS, finish_background_compiles, runner

FLOAT32 = chip.tolerance("transcendentals", cpu=dict(rtol=1e-6, ulps=2 * 2.0**-23), tpu=dict(rtol=1e-5, ulps=2.0**-14))
BFLOAT16 = dict(rtol=1e-2, ulps=2 * 2.0**-8)
SHAPES = [(5, 4), (7,), (2, 2, 3)]  # 20 elements: vector lanes and a scalar tail on CPU


def _lr(value, device="cpu"):
    return torch.tensor(value, device=device)


OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=1e-2)),
    "adam-l2-amsgrad": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    "adam-maximize-tensor-lr": (torch.optim.Adam, dict(lr=_lr(1e-2), maximize=True)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw-amsgrad-maximize": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True)),
    "adamw-tensor-lr-betas": (torch.optim.AdamW, dict(lr=_lr(1e-2), betas=(0.8, 0.99))),
    "adamw-small-beta1": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.3, 0.9))),  # lerp weight 0.7: the other form
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum-decay": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.1)),
    "sgd-dampening-maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3, maximize=True)),
    "sgd-nesterov-tensor-lr": (torch.optim.SGD, dict(lr=_lr(0.1), momentum=0.9, nesterov=True)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
    "adagrad-decays-maximize": (
        torch.optim.Adagrad,
        dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, maximize=True, initial_accumulator_value=0.5),
    ),
    "adagrad-tensor-lr": (torch.optim.Adagrad, dict(lr=_lr(0.1), lr_decay=0.05)),
}


def _run(device, name, *, steps=3, dtype=torch.float32, scaling=None, fused=True, mode=None, **overrides):
    """Parameters and optimizer after `steps` fused steps on `device`. `scaling`: one
    (grad_scale, found_inf) pair per step, set as GradScaler sets them. `fused=False`: the
    single-tensor (for-loop) implementation instead. `mode`: the eager mode the optimizer's
    steps run in (each then ends with `mark_step`). `overrides`: optimizer options."""
    cls, options = OPTIMIZERS[name]
    options = dict(options, **overrides)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, dtype=dtype).to(device)) for shape in SHAPES]
    optimizer = cls(params, fused=True, **options) if fused else cls(params, foreach=False, **options)
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = (torch.randn(p.shape, generator=data) * 10.0 ** (i - 1)).to(dtype).to(device)
        if scaling is not None:
            scale, found_inf = scaling[step]
            optimizer.grad_scale = torch.full((), scale, device=device)
            optimizer.found_inf = torch.full((), found_inf, device=device)
        if mode is None:
            optimizer.step()
            continue
        previous = tpu_backend.get_eager_mode()
        tpu_backend.set_eager_mode(mode)
        try:
            optimizer.step()
            tpu_backend.mark_step()
        finally:
            tpu_backend.set_eager_mode(previous)
    return params, optimizer


def _assert_close(got, want, tolerance, what):
    got, want = got.detach().cpu(), want.detach()
    atol = tolerance["ulps"] * want.double().abs().max().item()
    torch.testing.assert_close(got, want, rtol=tolerance["rtol"], atol=atol, msg=lambda found: f"{what}: {found}")


def _assert_same(on_tpu, on_cpu, tolerance, grads=False):
    (tpu_params, tpu_optimizer), (cpu_params, cpu_optimizer) = on_tpu, on_cpu
    for index, (got, want) in enumerate(zip(tpu_params, cpu_params)):
        _assert_close(got, want, tolerance, f"param {index}")
        if grads:  # grad_scale: the unscaled gradients are written back
            _assert_close(got.grad, want.grad, tolerance, f"grad {index}")
        state, expected = tpu_optimizer.state[got], cpu_optimizer.state[want]
        assert state.keys() == expected.keys()
        for key, value in expected.items():
            assert state[key].device.type == "tpu"
            _assert_close(state[key], value, tolerance, f"{key} of param {index}")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_matches_cpu_fused(name):
    _assert_same(_run("tpu", name), _run("cpu", name), FLOAT32)


@pytest.mark.parametrize("name", ["adam-l2-amsgrad", "adamw", "sgd-momentum-decay", "adagrad"])
def test_grad_scale_unscales_and_found_inf_skips_the_step(name):
    # step 2 finds an inf: nothing moves (its step count is taken back), grads stay scaled
    scaling = [(4.0, 0.0), (8.0, 1.0), (2.0, 0.0)]
    on_tpu, on_cpu = _run("tpu", name, scaling=scaling), _run("cpu", name, scaling=scaling)
    _assert_same(on_tpu, on_cpu, FLOAT32, grads=True)
    params, optimizer = _run("tpu", name, steps=1, scaling=[(8.0, 1.0)])
    torch.manual_seed(0)
    for p in params:  # the first step skipped: the parameters are the initial ones
        torch.testing.assert_close(p.detach().cpu(), torch.randn(p.shape), rtol=0, atol=0)
        assert all(float(s.cpu()) == 0 for s in optimizer.state[p].values() if s.dim() == 0)  # step counts


def test_bias_corrections_at_a_large_step_count():
    # computed in float32 on the device (ATen: float64), they must stay exact late in training too
    def late_step(device):
        params, optimizer = _run(device, "adam-l2-amsgrad", steps=1)
        for state in optimizer.state.values():
            state["step"].fill_(123456.0)
        optimizer.step()
        return params, optimizer

    _assert_same(late_step("tpu"), late_step("cpu"), FLOAT32)


def test_adamw_with_lr_on_the_device():
    on_tpu = _run("tpu", "adamw-tensor-lr-betas", lr=_lr(1e-2, "tpu"))
    _assert_same(on_tpu, _run("cpu", "adamw-tensor-lr-betas"), FLOAT32)


@pytest.mark.parametrize("name", ["adamw", "adam-l2-amsgrad", "adagrad-decays-maximize", "sgd-nesterov-tensor-lr"])
def test_bfloat16_parameters(name):
    reference = _run("cpu", name, dtype=torch.bfloat16, fused=not name.startswith("sgd"))  # see the docstring
    _assert_same(_run("tpu", name, dtype=torch.bfloat16), reference, BFLOAT16)


def _programs_launched() -> int:
    return CACHE_STATS.requests + sum(tpu_tensor.EAGER_STORAGE_CALLS.values())


def test_strict_step_updates_each_parameter_and_lr_changes_do_not_recompile(monkeypatch):
    monkeypatch.setattr(registration, "OPTIMIZER_PROGRAMS", "per-tensor")
    params, optimizer = _run("tpu", "adamw")  # warm: every program compiled
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    torch.tpu.reset_cache_stats()
    launched = _programs_launched()
    for _ in range(3):
        optimizer.step()
        scheduler.step()  # a new lr every step: a dynamic value, not a new program
    # per step: torch's `_foreach_add_(steps, 1)` and one `_fused_adamw_` update per parameter
    assert _programs_launched() - launched == (1 + len(SHAPES)) * 3
    assert torch.tpu.cache_stats()["misses"] == 0


def _update_programs(op) -> int:
    """Programs compiled for the strict runner of `op` (JAX's cache of each jitted template)."""
    return sum(fn._cache_size() for fn in runner(op).jitted.values())


@pytest.mark.parametrize("programs", ["per-tensor", "one"])
def test_update_programs_follow_shapes_not_the_parameter_count(monkeypatch, programs):
    # per tensor: an optimizer over more parameters of the shapes already seen compiles no new
    # update (the chip compiles a whole-list update tensor by tensor: ~35 s for 219 tensors)
    monkeypatch.setattr(registration, "OPTIMIZER_PROGRAMS", programs)
    update = torch.ops.aten._fused_adamw.default
    shapes = [(64, 32), (32,)]
    torch.manual_seed(0)

    def step(count):
        params = [torch.nn.Parameter(torch.randn(shapes[i % 2]).to("tpu")) for i in range(count)]
        for p in params:
            p.grad = torch.randn(p.shape).to("tpu")
        torch.optim.AdamW(params, lr=1e-2, fused=True).step()

    step(2)
    before = _update_programs(update)
    step(7)
    assert _update_programs(update) - before == (0 if programs == "per-tensor" else 1)


def test_auto_updates_per_tensor_until_the_one_program_has_compiled(monkeypatch):
    monkeypatch.setattr(registration, "OPTIMIZER_PROGRAMS", "auto")
    _assert_same(_run("tpu", "adamw-amsgrad-maximize"), _run("cpu", "adamw-amsgrad-maximize"), FLOAT32)
    finish_background_compiles()
    # the background compile held back until released, to see both paths
    held = []  # (jitted, arguments, its future)
    monkeypatch.setattr(runner(torch.ops.aten._fused_adamw.default), "background", {})  # none started yet
    monkeypatch.setattr(
        runner_module, "_compile_in_background", lambda *job: held.append((*job, Future())) or held[-1][2]
    )
    shapes = [(3, 5), (3, 5), (4,)]

    def start(device):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape).to(device)) for shape in shapes]
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=True)
        optimizer.step()  # makes the state
        return params, optimizer

    params, optimizer = start("tpu")
    launched = _programs_launched()
    optimizer.step()  # torch's step counts, then one update per parameter: the one program is compiling
    assert _programs_launched() - launched == 1 + len(shapes)
    [(jitted, arguments, future)] = held
    future.set_result(jitted.lower(*arguments).compile())
    torch.tpu.reset_cache_stats()
    launched = _programs_launched()
    optimizer.step()
    assert _programs_launched() - launched == 2
    assert torch.tpu.cache_stats()["misses"] == 0
    expected = start("cpu")
    expected[1].step()
    expected[1].step()
    _assert_same((params, optimizer), expected, FLOAT32)


def test_a_one_program_that_does_not_compile_is_said_and_the_update_goes_on(monkeypatch):
    monkeypatch.setattr(registration, "OPTIMIZER_PROGRAMS", "auto")
    failed = Future()
    failed.set_exception(RuntimeError("RESOURCE_EXHAUSTED: out of memory compiling"))
    monkeypatch.setattr(runner_module, "_compile_in_background", lambda *job: failed)
    monkeypatch.setattr(runner(torch.ops.aten._fused_adamw.default), "background", {})  # none started yet
    with pytest.warns(RuntimeWarning, match="_fused_adamw.default's one program did not compile.*RESOURCE_EXHAUSTED"):
        on_tpu = _run("tpu", "adamw", steps=4)
    _assert_same(on_tpu, _run("cpu", "adamw", steps=4), FLOAT32)


@pytest.mark.parametrize("programs", ["per-tensor", "one"])
def test_update_programs_against_foreach(monkeypatch, programs):
    monkeypatch.setattr(registration, "OPTIMIZER_PROGRAMS", programs)

    def launches(fused):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape).to("tpu")) for shape in SHAPES]
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-2, fused=fused, foreach=None if fused else True)
        optimizer.step()
        launched = _programs_launched()
        optimizer.step()
        return _programs_launched() - launched

    assert launches(fused=True) == 1 + (len(SHAPES) if programs == "per-tensor" else 1)
    assert launches(fused=False) > 2 * len(SHAPES)  # one program per foreach op


@pytest.mark.parametrize("mode", ["fused", "debug"])
def test_fused_and_debug_modes(mode):
    from tpu_backend import fused

    fused.reset_stats()
    on_tpu = _run("tpu", "adam-l2-amsgrad", mode=mode)
    if mode == "fused":  # each step's ops (step counts and update) recorded and run as one program
        assert fused.stats()["programs_run"] == 3
    _assert_same(on_tpu, _run("cpu", "adam-l2-amsgrad"), FLOAT32)
