"""`torch.compile(backend="tpu")` on CPU tensors: the backend's JAX programs against eager PyTorch.

The backend accepts CPU tensors (copied to JAX and back), so everything about
capture, AOTAutograd, graph breaks, randomness and shapes is tested without the device;
`test_device_training.py` runs the same path on "tpu" tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import tpu_backend.compile as tpu_compile
from tests import chip
from tests.tpu_backend.compile.shared import ChattyModel

# On a TPU: its float32 exp/tanh/log approximations (up to 8e-5 relative, docs/tpu.md).
RELATIVE_TOLERANCE = chip.tolerance("transcendentals", cpu=1e-5, tpu=2e-4)


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test here starts from a fresh Dynamo (see conftest.py)."""


def programs(kind: str) -> list[str]:
    """Names of the programs compiled so far whose name ends with `kind`."""
    return [name for name in tpu_compile.compile_stats().programs if name.endswith(kind)]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def small_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def test_backend_is_registered_with_dynamo():
    assert "tpu" in torch._dynamo.list_backends(exclude_tags=())


def test_training_steps_match_eager():
    eager = small_mlp()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="tpu")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled_model)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, target = torch.randn(5, 8, generator=generator), torch.randn(5, 4, generator=generator)
        losses = []
        for model, optimizer in zip((eager, compiled), optimizers):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert abs(losses[1] - losses[0]) <= RELATIVE_TOLERANCE * abs(losses[0])
    for got, want in zip(compiled_model.parameters(), eager.parameters()):
        assert relative(got, want) <= RELATIVE_TOLERANCE
    stats = tpu_compile.compile_stats()
    assert len(programs("_forward")) == 1 and len(programs("_backward")) == 1
    assert stats.total().hits == 4  # steps 2 and 3 reuse both programs


def test_graph_breaks_run_the_broken_parts_eagerly(capsys):
    torch.manual_seed(0)
    model = ChattyModel()
    x = torch.randn(4, 6, requires_grad=True)
    want = model(x)
    want.sum().backward()
    want_grad = x.grad.clone()
    x.grad = None

    got = torch.compile(model, backend="tpu")(x)
    got.sum().backward()

    assert "hidden mean computed" in capsys.readouterr().out
    assert relative(got, want) <= RELATIVE_TOLERANCE
    assert relative(x.grad, want_grad) <= RELATIVE_TOLERANCE
    assert len(programs("_forward")) >= 2  # the model was split into several graphs


def test_new_input_shapes_compile_new_programs():
    model = small_mlp()
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        for batch in (2, 5, 7):
            x = torch.randn(batch, 8)
            assert relative(compiled(x), model(x)) <= RELATIVE_TOLERANCE
    assert programs("_inference")  # no_grad: one inference graph per capture, no backward


def test_dropout_draws_fresh_masks_and_follows_the_seed():
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5)).train()
    compiled = torch.compile(model, backend="tpu")
    x = torch.ones(8, 32)

    torch.manual_seed(123)
    first, second = compiled(x), compiled(x)
    torch.manual_seed(123)
    again = compiled(x)

    assert not torch.equal(first == 0, second == 0)  # no baked-in mask: calls differ
    assert torch.equal(first, again)  # the same seed reproduces
    zero_fraction = (first == 0).float().mean().item()
    assert 0.35 < zero_fraction < 0.65


def test_batch_norm_running_statistics_are_updated():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(2, 3, 8, 8)
    want = eager(x)
    got = torch.compile(compiled_model, backend="tpu")(x)
    assert relative(got, want) <= RELATIVE_TOLERANCE
    assert relative(compiled_model[1].running_mean, eager[1].running_mean) <= RELATIVE_TOLERANCE
    assert relative(compiled_model[1].running_var, eager[1].running_var) <= RELATIVE_TOLERANCE
    assert compiled_model[1].num_batches_tracked.item() == 1


def test_batch_norm_in_eval_mode_passes_gradients():
    """Fine-tuning with the batch norms frozen (`.eval()`, gradients still flowing through
    them, as detection backbones are trained): the forward graph hands the backward the
    saved statistics, which ATen's CPU kernel returns empty in eval mode while the graph
    (PyTorch's meta kernel) expects one per channel; the compiled step refused that as a
    wrong shape. Gradients of every parameter as in eager."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3)).eval()
    on_device = copy.deepcopy(eager).to("tpu")
    x = torch.randn(2, 3, 8, 8)
    eager(x).square().sum().backward()
    torch.compile(on_device, backend="tpu")(x.to("tpu")).square().sum().backward()
    for (name, want), got in zip(eager.named_parameters(), on_device.parameters()):
        assert relative(got.grad.cpu(), want.grad) <= RELATIVE_TOLERANCE, name


@torch.library.custom_op("t4_backend_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@opaque.register_fake
def _(x):
    return torch.empty_like(x)


def test_missing_lowering_fails_with_the_op_name():
    compiled = torch.compile(lambda x: opaque(x) * 2, backend="tpu")
    with pytest.raises(Exception, match=r"t4_backend_test\.opaque\.default"):
        compiled(torch.ones(3))


def test_python_numbers_as_arguments():
    def scale_and_shift(x, scale: float, shift: int):
        return x * scale + shift

    compiled = torch.compile(scale_and_shift, backend="tpu")
    x = torch.randn(4)
    for scale, shift in [(0.5, 1), (2.0, 1), (2.0, -3)]:
        assert torch.allclose(compiled(x, scale, shift), scale_and_shift(x, scale, shift), rtol=1e-6)


def _arange(n: int, device) -> torch.Tensor:
    return torch.arange(n, device=device)


def _prims_iota(n: int, device) -> torch.Tensor:  # arange's decomposition (prims.iota)
    return torch.ops.prims.iota(n, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)


@pytest.mark.parametrize("positions_of", [_arange, _prims_iota], ids=["arange", "prims.iota"])
def test_positions_concatenated_and_sliced_across_the_seam_are_exact(positions_of):
    """Transformers' packed-sequence check of position ids (every HF decoder trained under
    torch.compile runs it): on a v5e the TPU compiler read the sliced positions 128 off
    (-1, 128, 129, ...), so every token became its own sequence and the logits moved by 0.3;
    `arange`'s lowering keeps its iota out of that fusion (tpu_backend/ops/creation.py), and
    so does `prims.iota`'s."""

    def sequence_ids(x):
        positions = positions_of(x.shape[1], x.device).unsqueeze(0).expand(x.shape[0], -1)
        shifted = torch.cat([positions[:, :1] - 1, positions], dim=-1)
        starts = (shifted[:, 1:] - shifted[:, :-1]) != 1
        return shifted[:, : x.shape[1]], starts.cumsum(-1)

    for rows, length in [(2, 16), (8, 128)]:
        x = torch.zeros(rows, length, device="tpu")
        for got, want in zip(torch.compile(sequence_ids, backend="tpu")(x), sequence_ids(x.cpu()), strict=True):
            assert torch.equal(got.cpu(), want)


def test_the_positions_barriers_compile_for_a_tpu():
    """The seam pattern over both position lowerings (`aten.arange`, `prims.iota`), compiled
    by libtpu for a v5e: the barriers are accepted there (their effect needs the chip)."""
    import jax.numpy as jnp

    from tests.helpers import compile_for_tpu
    from tpu_backend.ops.registry import LOWERINGS

    arange = LOWERINGS[torch.ops.aten.arange.default].fn
    iota = LOWERINGS[torch.ops.prims.iota.default].fn

    def seams(rows):
        for positions in (arange(16), iota(16, start=0, step=1, dtype=torch.int64)):
            p = jnp.broadcast_to(positions, (rows.shape[0], 16))
            yield jnp.concatenate([p[:, :1] - 1, p], axis=-1)[:, :16] + rows

    compile_for_tpu(lambda rows: tuple(seams(rows)), jnp.zeros((2, 1), jnp.int64))


def test_torch_cond_becomes_one_program_with_both_branches():
    def branchy(x, w):
        return torch.cond(x.sum() > 0, lambda x, w: (x * w).sin(), lambda x, w: x.cos() + w, (x, w))

    compiled = torch.compile(branchy, backend="tpu", fullgraph=True)
    w = torch.randn(5)
    for sign in (1.0, -1.0):  # both branches, same compiled programs
        x = (sign * torch.rand(5) + sign).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        got, want = compiled(x, w), branchy(x_ref, w)
        got.sum().backward()
        want.sum().backward()
        assert relative(got, want) <= RELATIVE_TOLERANCE
        assert relative(x.grad, x_ref.grad) <= RELATIVE_TOLERANCE
    assert len(programs("_forward")) == 1


def test_while_loop_runs_inside_the_program():
    from torch._higher_order_ops.while_loop import while_loop

    def double_until_large(i, x):
        return while_loop(lambda i, x: x.sum() < 100, lambda i, x: (i + 1, x * 2), (i, x))

    compiled = torch.compile(double_until_large, backend="tpu", fullgraph=True)
    with torch.no_grad():
        steps, x = compiled(torch.tensor(0), torch.ones(3))
    assert steps.item() == 6 and torch.equal(x, torch.full((3,), 64.0))


def test_writes_through_views_are_functionalized():
    def edit_in_place(x):
        y = x.clone()
        y[:, 0] = 0  # select + copy_: becomes select_scatter
        y[..., 1:] *= 2  # slice + mul_: becomes slice_scatter
        y.t()[0].add_(1)  # through a transposed view
        return y

    x = torch.randn(4, 3)
    assert torch.equal(torch.compile(edit_in_place, backend="tpu")(x), edit_in_place(x))


def _compiles_by_kind() -> dict[str, int]:
    """Executables built (compiled or loaded from disk) per program kind since the stats' reset."""
    return {name.rsplit("_", 1)[-1]: s.requests - s.hits for name, s in tpu_compile.compile_stats().programs.items()}


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["plain", "dropout"])
def test_programs_compiled_ahead_are_the_ones_the_steps_run(monkeypatch, dropout):
    # TPU_COMPILE_AHEAD (on by default on a TPU only): the backward graph is handed over
    # with the forward, and both programs compile on threads for the signature the first
    # call will have (a random key first, with dropout); a wrong guess would compile again
    # at the call
    monkeypatch.setenv("TPU_COMPILE_AHEAD", "on")
    tpu_compile.compile_stats().reset()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.Tanh(), nn.Linear(16, 4))
    model = copy.deepcopy(eager).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    generator = torch.Generator().manual_seed(1)
    for step in range(2):
        x = torch.randn(5, 8, generator=generator)
        out = compiled(x.to("tpu"))
        if step == 0:
            assert _compiles_by_kind() == {"forward": 1, "backward": 1}  # before any backward ran
        out.square().sum().backward()
        if not dropout:
            eager(x).square().sum().backward()
    assert _compiles_by_kind() == {"forward": 1, "backward": 1}
    if not dropout:
        for got, want in zip(model.parameters(), eager.parameters()):
            assert relative(got.grad.cpu(), want.grad) <= RELATIVE_TOLERANCE


def test_a_program_whose_ahead_compile_fails_compiles_at_its_call(monkeypatch):
    import threading

    import jax
    import numpy as np

    from tpu_backend.compile.program import Program

    program = Program("ahead_fails", lambda x: x * 2)
    build = Program._build
    calls = []

    def fail_on_the_thread(self, key, args):
        calls.append(threading.current_thread().name)
        if calls[-1].startswith("tpu-compile-ahead"):
            raise RuntimeError("simulated compile failure")
        return build(self, key, args)

    monkeypatch.setattr(Program, "_build", fail_on_the_thread)
    x = jax.device_put(np.arange(3.0, dtype=np.float32))
    program.compile_ahead([jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)])
    np.testing.assert_array_equal(np.asarray(program(x)), np.arange(3.0) * 2)
    assert [name.startswith("tpu-compile-ahead") for name in calls] == [True, False]


def test_an_unknown_compile_ahead_setting_is_refused(monkeypatch):
    monkeypatch.setenv("TPU_COMPILE_AHEAD", "sometimes")
    with pytest.raises(Exception, match="TPU_COMPILE_AHEAD='sometimes': expected auto, on or off"):
        torch.compile(small_mlp(), backend="tpu")(torch.randn(2, 8))
