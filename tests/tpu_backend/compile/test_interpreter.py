"""ATen FX graphs run through the lowering table as JAX functions, checked against PyTorch CPU.

No device needed: graphs come from `make_fx` / AOTAutograd on CPU tensors; the
interpreter runs them on `jnp` arrays (directly, or jitted as a `Program`).
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from functorch.compile import aot_module
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.models import MODEL_CASES, GPTConfig, TinyGPT
from tests import chip
from tpu_backend.compile import UnsupportedGraphError, compile_graph, decompositions, fx_to_jax
from tpu_backend.compile.backend import graph_compiler
from tpu_backend.ops.views import VIEW_LOWERINGS

aten = torch.ops.aten
# On a TPU: its float32 exp/tanh/log approximations (up to 8e-5 relative, docs/tpu.md).
RELATIVE_TOLERANCE = chip.tolerance("transcendentals", cpu=1e-5, tpu=2e-4)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||: one number per tensor, meaningful for gradients near 0."""
    got, want = got.double(), want.double()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp_min(1e-30)).item()


def assert_grad_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Relative error at most RELATIVE_TOLERANCE; a gradient that is mathematically zero
    (e.g. a conv bias followed by batch norm: rounding noise of norm ~1e-7) must stay as small."""
    if torch.linalg.vector_norm(want) < 1e-6:
        assert torch.linalg.vector_norm(got) < 1e-6, f"{what}: expected ~0, got norm {got.norm():.2e}"
        return
    error = relative_error(got, want)
    assert error <= RELATIVE_TOLERANCE, f"{what}: relative error {error:.2e} > {RELATIVE_TOLERANCE:.0e}"


def to_jax(t: torch.Tensor):
    return jnp.asarray(t.detach().numpy())


# --------------------------------------------------------------------- view ops as pure functions

_X = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)

VIEW_CASES = [
    (aten.view.default, (_X, [6, -1])),
    (aten._unsafe_view.default, (_X, [4, 6])),
    (aten.t.default, (_X[0],)),
    (aten.transpose.int, (_X, 0, -1)),
    (aten.permute.default, (_X, [2, 0, 1])),
    (aten.expand.default, (_X[:, :1], [5, 2, -1, 4])),
    (aten.slice.Tensor, (_X, 2, 1, 2**62, 2)),
    (aten.slice.Tensor, (_X, 1, -2, None)),
    (aten.select.int, (_X, 1, -1)),
    (aten.unsqueeze.default, (_X, -1)),
    (aten.squeeze.dims, (_X[:, :1, :1], [1, 2, 0])),
    (aten.split.Tensor, (_X, 3, 2)),
    (aten.split_with_sizes.default, (_X, [1, 2], 1)),
    (aten.unbind.int, (_X, 1)),
    (aten.diagonal.default, (_X, 1, 1, 2)),
    (aten.unfold.default, (_X, 2, 2, 1)),
    (aten.as_strided.default, (_X, [3, 2], [1, 4], 2)),
    (aten.narrow.default, (_X, -1, 1, 2)),
    (aten.view.dtype, (_X, torch.int32)),
    (aten.view.dtype, (_X, torch.int16)),
    (aten.permute_copy.default, (_X, [1, 2, 0])),
]


@pytest.mark.parametrize("op, args", VIEW_CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(VIEW_CASES)])
def test_view_table_matches_torch(op, args):
    want = op(*args)
    got = VIEW_LOWERINGS[op].fn(to_jax(args[0]), *args[1:])
    wants = want if isinstance(want, (list, tuple)) else [want]
    gots = got if isinstance(got, (list, tuple)) else [got]
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        np.testing.assert_array_equal(np.asarray(g), w.contiguous().numpy())


# --------------------------------------------------------------------- a make_fx graph on jnp arrays


def test_make_fx_gradient_graph_runs_on_jnp_arrays():
    """The ATen graph of `torch.func.grad` of a small loss, evaluated by the interpreter."""

    def loss(w1, b1, w2, x):
        hidden = torch.tanh(x @ w1.T + b1)
        return (hidden @ w2).softmax(-1).log().mean()

    torch.manual_seed(0)
    args = (torch.randn(8, 4), torch.randn(8), torch.randn(8, 3), torch.randn(5, 4))
    grads = torch.func.grad(loss, argnums=(0, 1, 2))
    gm = make_fx(grads, decomposition_table=decompositions())(*args)

    got = fx_to_jax(gm)(*map(to_jax, args))
    want = grads(*args)
    for g, w in zip(got, want):
        assert_grad_close(torch.from_numpy(np.asarray(g)), w, "make_fx gradient")


def test_symbolic_graph_specialises_per_shape():
    """A shape-generic graph (sym_size nodes, size arithmetic) runs at each concrete shape."""

    def flatten_pairs(x):
        return x.reshape(x.shape[0] * x.shape[1], -1).sum(-1) * x.shape[-1]

    gm = make_fx(flatten_pairs, tracing_mode="symbolic")(torch.randn(2, 3, 4))
    assert any(n.target == aten.sym_size.int for n in gm.graph.nodes)
    program = compile_graph(gm, "symbolic_flatten")
    for shape in [(2, 3, 4), (5, 1, 2)]:
        x = torch.randn(shape)
        got = program(to_jax(x))
        np.testing.assert_allclose(np.asarray(got), flatten_pairs(x).numpy(), rtol=1e-6)
    assert len(program.signatures) == 2


# --------------------------------------------------------------------- models: forward and backward


class WithLoss(nn.Module):
    """Model and loss in one module, so the whole step is one forward and one backward graph."""

    def __init__(self, model: nn.Module, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, inputs, target):
        return self.loss(self.model(inputs), target)


def loss_and_grads(module: nn.Module, inputs, target):
    loss = module(inputs, target)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    return loss.detach(), grads


@pytest.mark.parametrize("case_name", ["mlp", "cnn", "transformer"])
def test_forward_and_backward_graphs_match_cpu_autograd(case_name):
    case = MODEL_CASES[case_name]
    torch.manual_seed(0)
    # One transformer block shows every op of the model at half the compile time.
    model = TinyGPT(GPTConfig(layers=1)) if case_name == "transformer" else case.build()
    reference = WithLoss(model, case.loss)
    compiled_module = copy.deepcopy(reference)
    inputs, target = case.batch(torch.Generator().manual_seed(1))

    # Attention takes PyTorch's math path, as it does on the tpu device (CPU tensors would
    # pick a fused CPU kernel whose backward has no decomposition).
    with sdpa_kernel(SDPBackend.MATH):
        want_loss, want_grads = loss_and_grads(reference, inputs, target)
        compiled = aot_module(
            compiled_module,
            fw_compiler=graph_compiler(f"parity_{case_name}_forward"),
            bw_compiler=graph_compiler(f"parity_{case_name}_backward"),
            decompositions=decompositions(),
        )
        got_loss, got_grads = loss_and_grads_of(compiled, compiled_module, inputs, target)

    assert relative_error(got_loss, want_loss) <= RELATIVE_TOLERANCE
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        assert_grad_close(got_grads[name], want_grads[name], f"gradient of {name}")
    for name, buffer in reference.named_buffers():  # batch-norm running statistics
        assert relative_error(dict(compiled_module.named_buffers())[name], buffer) <= RELATIVE_TOLERANCE


def loss_and_grads_of(compiled, module: nn.Module, inputs, target):
    loss = compiled(inputs, target)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in module.named_parameters()}


# --------------------------------------------------------------------- randomness


def dropout_graph():
    # F.dropout reaches a PrivateUse1 device as native_dropout (CPU takes another path).
    def noisy(x):
        return aten.native_dropout(x, 0.5, True)[0] * 2

    return make_fx(noisy, decomposition_table=decompositions())(torch.ones(64, 64))


def test_random_graph_takes_a_key_and_returns_the_advanced_key():
    program = compile_graph(dropout_graph(), "dropout")
    assert program.needs_rng
    x = jnp.ones((64, 64), jnp.float32)
    key = jax.random.key(0)

    next_key, first = program(key, x)
    _, again = program(key, x)
    _, other = program(next_key, x)

    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))  # same key reproduces
    assert not np.array_equal(np.asarray(first), np.asarray(other))  # a new key differs
    assert not np.array_equal(jax.random.key_data(next_key), jax.random.key_data(key))
    kept = float((np.asarray(first) != 0).mean())
    assert 0.4 < kept < 0.6  # dropout p=0.5, 4096 draws
    assert set(np.unique(np.asarray(first))) <= {0.0, 4.0}  # kept values scaled by 1/(1-p), then * 2


def test_graph_without_random_ops_takes_no_key():
    gm = make_fx(lambda x: x * 2)(torch.ones(3))
    assert not compile_graph(gm, "double").needs_rng


# --------------------------------------------------------------------- clear errors


@torch.library.custom_op("t4_compile_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def test_op_without_lowering_is_named_in_the_error():
    gm = make_fx(lambda x: mystery(x) + 1)(torch.ones(3))
    with pytest.raises(UnsupportedGraphError, match=r"t4_compile_test\.mystery\.default.*tpu_backend/ops"):
        fx_to_jax(gm, "with_mystery")
