"""Users' own JAX functions as PyTorch ops on "tpu": `torch.tpu.jax_op`."""

import os
import sys
from typing import Optional

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import tpu_backend
from tests.helpers import compile_for_tpu

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)


@torch.tpu.jax_op("test_jax_op::swish")
def swish(x: jax.Array, beta: float = 1.0) -> jax.Array:
    return x * jax.nn.sigmoid(beta * x)


@torch.tpu.jax_op("test_jax_op::gated")
def gated(x: jax.Array, gate: Optional[jax.Array], repeats: int) -> tuple[jax.Array, jax.Array]:
    scaled = x * repeats if gate is None else x * jax.nn.sigmoid(gate) * repeats
    return scaled, jnp.cumsum(x, axis=-1)


@jax.custom_vjp
def clipped_identity(x):
    return x


clipped_identity.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@torch.tpu.jax_op("test_jax_op::clip_grad")
def clip_grad(x: jax.Array) -> jax.Array:
    return clipped_identity(x)


@torch.tpu.jax_op("test_jax_op::double_grad", backward=lambda grad, x: (4 * grad,))
def double_grad(x: jax.Array) -> jax.Array:
    return 2 * x


def reference_swish(x, beta=1.0):
    return x * torch.sigmoid(beta * x)


def test_a_jax_function_runs_as_a_torch_op_with_autograd():
    x = torch.randn(5, 7, requires_grad=True)
    on_tpu = x.detach().to("tpu").requires_grad_()
    out = swish(on_tpu, 2.0)
    assert out.device.type == "tpu" and out.shape == (5, 7)
    out.square().sum().backward()
    reference_swish(x, 2.0).square().sum().backward()
    torch.testing.assert_close(out.cpu(), reference_swish(x.detach(), 2.0))
    torch.testing.assert_close(on_tpu.grad.cpu(), x.grad)
    assert torch.ops.test_jax_op.swish.default._schema.arguments[1].type.kind() == "FloatType"


def test_the_op_runs_on_cpu_tensors_too():
    x = torch.randn(3, 4)
    torch.testing.assert_close(swish(x), reference_swish(x))
    torch.testing.assert_close(torch.ops.test_jax_op.swish(x, 0.5), reference_swish(x, 0.5))


def test_several_outputs_optional_tensors_and_static_ints():
    x = torch.randn(2, 6, requires_grad=True)
    gate = torch.randn(2, 6, requires_grad=True)
    x_tpu, gate_tpu = (t.detach().to("tpu").requires_grad_() for t in (x, gate))
    scaled, running = gated(x_tpu, gate_tpu, 3)
    (scaled.sum() + running.pow(2).sum()).backward()
    ref_scaled, ref_running = x * torch.sigmoid(gate) * 3, x.cumsum(-1)
    (ref_scaled.sum() + ref_running.pow(2).sum()).backward()
    torch.testing.assert_close(scaled.cpu(), ref_scaled.detach())
    torch.testing.assert_close(running.cpu(), ref_running.detach())
    torch.testing.assert_close(x_tpu.grad.cpu(), x.grad)
    torch.testing.assert_close(gate_tpu.grad.cpu(), gate.grad)
    no_gate, _ = gated(x_tpu.detach(), None, 2)
    torch.testing.assert_close(no_gate.cpu(), x.detach() * 2)


def test_a_custom_vjp_or_a_given_backward_replaces_jax_vjp():
    x = torch.tensor([1.0, -2.0, 3.0], device="tpu", requires_grad=True)
    (clip_grad(x) * 5).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 0.1))
    y = torch.ones(3, device="tpu", requires_grad=True)
    double_grad(y).sum().backward()
    torch.testing.assert_close(y.grad.cpu(), torch.full((3,), 4.0))  # the given backward, not d(2x)=2


def test_shapes_come_from_jax_eval_shape_under_fake_tensors():
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(4, 9, device="tpu"))
        scaled, running = gated(x, None, 2)
    assert scaled.shape == running.shape == (4, 9) and scaled.device.type == "tpu"


STATIC_SHAPE_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")


@pytest.mark.slow
def test_torch_library_opcheck_passes():
    # (no "test_aot_dispatch_dynamic": symbolic sizes are refused, as XLA compiles static shapes)
    torch.library.opcheck(swish, (torch.randn(3, 5, requires_grad=True), 1.5), test_utils=STATIC_SHAPE_CHECKS)
    torch.library.opcheck(gated, (torch.randn(2, 4), torch.randn(2, 4), 2), test_utils=STATIC_SHAPE_CHECKS)


def test_torch_compile_trains_through_the_op_like_eager():
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 6).to("tpu")
    x = torch.randn(4, 6).to("tpu")

    def step(layer, x):
        return swish(layer(x), 1.5).pow(2).mean()

    eager_loss = step(layer, x)
    eager_grads = torch.autograd.grad(eager_loss, list(layer.parameters()))
    compiled_loss = torch.compile(step, backend="tpu", fullgraph=True)(layer, x)
    compiled_grads = torch.autograd.grad(compiled_loss, list(layer.parameters()))
    torch.testing.assert_close(compiled_loss.cpu(), eager_loss.cpu())
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got.cpu(), want.cpu())


def test_fused_eager_records_the_op_into_the_step_program():
    x = torch.randn(3, 8).to("tpu")
    expected = swish(swish(x), 0.5).sum().cpu()
    tpu_backend.set_eager_mode("fused")
    try:
        total = swish(swish(x), 0.5).sum()
        value = total.cpu()  # sync point: one program
        ops_text, _ = tpu_backend.fused.last_program_text()
    finally:
        tpu_backend.set_eager_mode("strict")
    torch.testing.assert_close(value, expected)
    assert ops_text.count("test_jax_op.swish") == 2


@pytest.mark.slow  # (the example compiles the kernels for TPU in the default suite)
def test_a_pallas_kernel_op_compiles_for_tpu_inside_a_training_step():
    import pallas_op

    model = pallas_op.mlp(use_kernel=True, features=128)
    x, y = pallas_op.regression_data(n=64)

    class TrainStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            return F.mse_loss(self.model(x), y)

    exported = tpu_backend.export(TrainStep(), (x, y), platforms=("tpu",), train_step=True)
    text = exported.mlir_module()
    assert text.count("tpu_custom_call") >= 2  # the forward and the backward kernel
    compile_for_tpu(exported.call, *exported.in_avals)  # Mosaic refused 64-bit index maps here


def test_the_function_sees_jax_defaults_unless_an_argument_is_64_bit():
    """The device runs with `jax_enable_x64` on; a user's function is traced with JAX's
    default 32-bit types (as its author wrote it, and as a Pallas kernel needs on a TPU)
    unless a tensor argument is 64-bit, which then keeps its precision."""

    @torch.tpu.jax_op("test_jax_op::index_dtype")
    def index_dtype(x: jax.Array) -> jax.Array:
        return x + jnp.arange(x.shape[0])

    assert index_dtype(torch.ones(3, device="tpu")).dtype == torch.float32
    big = torch.tensor([2**40, 3], device="tpu")  # int64: traced in 64-bit mode, nothing truncated
    assert index_dtype(big).cpu().tolist() == [2**40, 4]


def test_unusable_functions_are_refused_with_the_reason():
    with pytest.raises(TypeError, match="parameter 'x' is annotated"):

        @torch.tpu.jax_op("test_jax_op::bad_annotation")
        def bad(x: list) -> jax.Array:
            return x

    with pytest.raises(ValueError, match="namespace::name"):

        @torch.tpu.jax_op("no_namespace")
        def unnamed(x: jax.Array) -> jax.Array:
            return x

    @torch.tpu.jax_op("test_jax_op::two_outputs_one_promised")
    def liar(x: jax.Array) -> jax.Array:
        return x, x

    with pytest.raises(TypeError, match=r"annotate it as tuple\[jax.Array, jax.Array\]"):
        liar(torch.ones(2, device="tpu"))


def test_a_bare_decorator_names_the_op_after_the_function():
    @tpu_backend.jax_op
    def softsign(x):
        return x / (1 + jnp.abs(x))

    x = torch.randn(5)
    torch.testing.assert_close(softsign(x.to("tpu")).cpu(), F.softsign(x))
    assert softsign._qualname.startswith("jax_ops::softsign")
