"""Random lowerings: right shapes and dtypes, sensible statistics, determinism per key.

The device draws from `jax.random`, so numbers differ from PyTorch's CPU generator;
these tests check what a user relies on instead.
"""

import jax
import pytest
import torch
from ops_parity import assert_lowers_for_tpu, run_lowering

from tpu_backend.ops import JAX_LOWERINGS

aten = torch.ops.aten
X = torch.empty(4000)


def draw(op, *args, seed=0, **kwargs):
    return run_lowering(op, *args, key=jax.random.key(seed), **kwargs)


def test_every_random_op_asks_for_a_key():
    for op in (
        aten.rand.default,
        aten.randn.default,
        aten.bernoulli.p,
        aten.native_dropout.default,
        aten.multinomial.default,
    ):
        assert JAX_LOWERINGS[op].needs_rng
    assert not JAX_LOWERINGS[aten.native_dropout_backward.default].needs_rng


def test_uniform_and_normal_families():
    u = draw(aten.rand.default, [4000])
    assert u.dtype == torch.float32 and 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.03
    n = draw(aten.randn.default, [4000], dtype=torch.float64)
    assert n.dtype == torch.float64 and abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    b = draw(aten.rand.default, [4000], dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16 and b.max() < 1
    assert_lowers_for_tpu(aten.rand.default, [4000], dtype=torch.bfloat16, key=jax.random.key(0))
    assert torch.equal(draw(aten.rand.default, [5], seed=3), draw(aten.rand.default, [5], seed=3))
    assert not torch.equal(draw(aten.rand.default, [5], seed=3), draw(aten.rand.default, [5], seed=4))
    nf = draw(aten.normal_functional.default, X, 3.0, 0.5)
    assert abs(nf.mean() - 3) < 0.05 and abs(nf.std() - 0.5) < 0.05
    un = draw(aten.uniform.default, X, -2.0, 4.0)
    assert -2 <= un.min() and un.max() < 4 and abs(un.mean() - 1) < 0.15
    assert draw(aten.normal.Tensor_Tensor, torch.zeros(3, 1), torch.ones(4)).shape == (3, 4)
    assert draw(aten.normal.float_float, 1.0, 2.0, [2, 3]).shape == (2, 3)
    assert draw(aten.normal.Tensor_float, torch.zeros(5).double(), 2.0).dtype == torch.float64
    assert draw(aten.normal.float_Tensor, 1.0, torch.ones(2, 2)).shape == (2, 2)
    assert draw(aten.randn_like.default, torch.zeros(2, 3).half()).dtype == torch.float16
    assert draw(aten.rand_like.default, torch.zeros(2, 3), dtype=torch.float64).dtype == torch.float64


def test_integer_draws():
    r = draw(aten.randint.low, -3, 5, [4000])
    assert r.dtype == torch.int64 and r.min() == -3 and r.max() == 4
    assert draw(aten.randint.default, 10, [3], dtype=torch.int32).dtype == torch.int32
    assert draw(aten.randint_like.default, torch.zeros(3, dtype=torch.int16), 7).dtype == torch.int16
    p = draw(aten.randperm.default, 50)
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(50))
    t = draw(aten.random.to, torch.zeros(4000), 6)
    assert t.dtype == torch.float32 and t.min() == 0 and t.max() == 5
    f = draw(getattr(aten.random, "from"), torch.zeros(4000, dtype=torch.int64), 10, 13)
    assert f.min() == 10 and f.max() == 12
    assert draw(aten.random.default, torch.zeros(10, dtype=torch.uint8)).dtype == torch.uint8


def test_bernoulli_and_other_distributions():
    probs = torch.full((4000,), 0.25)
    b = draw(aten.bernoulli.default, probs)
    assert b.dtype == torch.float32 and set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.25) < 0.03
    assert abs(draw(aten.bernoulli.p, X, 0.7).mean() - 0.7) < 0.03
    assert abs(draw(aten.bernoulli.Tensor, X, torch.tensor(0.1)).mean() - 0.1) < 0.03
    e = draw(aten.exponential.default, X, 2.0)
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 0.05
    g = draw(aten.geometric.default, X, 0.5)
    assert g.min() >= 1 and abs(g.mean() - 2) < 0.15
    assert draw(aten.log_normal.default, X, 0.0, 0.1).min() > 0
    assert draw(aten.cauchy.default, X).shape == X.shape


@pytest.mark.slow  # jax.random's poisson and gamma samplers are slow to compile
def test_poisson_and_gamma():
    po = draw(aten.poisson.default, torch.full((4000,), 3.0))
    assert abs(po.mean() - 3) < 0.15
    ga = draw(aten._standard_gamma.default, torch.full((4000,), 2.0))
    assert abs(ga.mean() - 2) < 0.15


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial(replacement):
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0], [5.0, 0.0, 0.0, 1.0]])
    s = draw(aten.multinomial.default, weights, 2, replacement)
    assert s.shape == (2, 2) and s.dtype == torch.int64
    assert set(s[0].tolist()) <= {1, 2} and set(s[1].tolist()) <= {0, 3}
    if not replacement:
        assert s[0, 0] != s[0, 1]


def test_native_dropout_and_backward():
    x = torch.ones(4000)
    out, mask = draw(aten.native_dropout.default, x, 0.25, True)
    assert mask.dtype == torch.bool and abs(mask.float().mean() - 0.75) < 0.03
    torch.testing.assert_close(out, mask.float() / 0.75)
    out, mask = draw(aten.native_dropout.default, x, 0.25, False)
    assert torch.equal(out, x) and bool(mask.all())
    out, mask = draw(aten.native_dropout.default, x, 1.0, True)
    assert not bool(out.any())
    g = torch.randn(4000)
    torch.testing.assert_close(
        run_lowering(aten.native_dropout_backward.default, g, mask, 2.0),
        aten.native_dropout_backward.default(g, mask, 2.0),
    )
    for grad in (torch.arange(4000) - 2000, torch.arange(4000) % 3 == 0):  # int and bool grads become float32
        torch.testing.assert_close(
            run_lowering(aten.native_dropout_backward.default, grad, mask, 2.0),
            aten.native_dropout_backward.default(grad, mask, 2.0),
        )


def test_rrelu_slopes_noise_and_gradient():
    """Training: each negative input gets a slope from U(lower, upper), recorded in `noise`
    (1 elsewhere) and used by the gradient; eval: the mean slope."""
    x = torch.randn(2000)
    negative = x < 0
    noise = torch.zeros(2000).to("tpu")
    out = torch.ops.aten.rrelu_with_noise(x.to("tpu"), noise, 0.1, 0.3, True).cpu()
    slopes = out[negative] / x[negative]
    assert torch.equal(out[~negative], x[~negative])
    assert 0.1 <= slopes.min() and slopes.max() <= 0.3 and abs(slopes.mean() - 0.2) < 6 * 0.2 / 12**0.5 / 1000**0.5
    torch.testing.assert_close(noise.cpu()[negative], slopes)
    assert torch.equal(noise.cpu()[~negative], torch.ones(int((~negative).sum())))

    leaf = x.to("tpu").requires_grad_()
    torch.manual_seed(0)
    y = torch.nn.functional.rrelu(leaf, 0.1, 0.3, training=True)
    y.sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), (y.detach().cpu() / x).where(negative, torch.ones(())))

    evaluated = torch.nn.functional.rrelu(x.to("tpu"), 0.1, 0.3, training=False).cpu()
    torch.testing.assert_close(evaluated, torch.nn.functional.rrelu(x, 0.1, 0.3, training=False))
