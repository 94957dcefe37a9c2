"""Seeding torch makes device randomness reproducible."""

import torch

import tpu_backend  # noqa: F401


def _draw_everything():
    x = torch.empty(64, device="tpu")
    linear = torch.nn.Linear(8, 8).to("tpu")
    torch.nn.init.kaiming_uniform_(linear.weight)
    torch.nn.init.normal_(linear.bias)
    return {
        "randn": torch.randn(16, device="tpu"),
        "rand": torch.rand(16, device="tpu"),
        "rand_like": torch.rand_like(x),
        "randint": torch.randint(0, 100, (16,), device="tpu"),
        "randperm": torch.randperm(16, device="tpu"),
        "normal_": x.clone().normal_(2.0, 3.0),
        "uniform_": x.clone().uniform_(-1.0, 1.0),
        "bernoulli_": x.clone().bernoulli_(0.3),
        "dropout": torch.nn.functional.dropout(torch.ones(64, device="tpu"), p=0.5),
        "init": linear.weight,
        "init_normal": linear.bias,
    }


def test_manual_seed_reproduces_every_random_op():
    torch.manual_seed(1234)
    first = {k: v.cpu() for k, v in _draw_everything().items()}
    torch.manual_seed(1234)
    second = {k: v.cpu() for k, v in _draw_everything().items()}
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_torch_tpu_manual_seed_alone_reproduces():
    torch.tpu.manual_seed(7)
    a = torch.randn(8, device="tpu").cpu()
    torch.tpu.manual_seed(7)
    assert torch.equal(a, torch.randn(8, device="tpu").cpu())


def test_successive_draws_differ_and_seeds_differ():
    torch.manual_seed(0)
    a, b = torch.randn(32, device="tpu").cpu(), torch.randn(32, device="tpu").cpu()
    torch.manual_seed(1)
    c = torch.randn(32, device="tpu").cpu()
    assert not torch.equal(a, b) and not torch.equal(a, c)


def test_distributions_have_the_right_statistics():
    torch.manual_seed(0)
    normal = torch.empty(20000, device="tpu").normal_(2.0, 3.0).cpu()
    assert abs(normal.mean().item() - 2.0) < 0.1 and abs(normal.std().item() - 3.0) < 0.1
    uniform = torch.rand(20000, device="tpu").cpu()
    assert 0.0 <= uniform.min().item() and uniform.max().item() < 1.0 and abs(uniform.mean().item() - 0.5) < 0.02
    kept = torch.nn.functional.dropout(torch.ones(20000, device="tpu"), p=0.25).cpu()
    assert set(kept.unique().tolist()) <= {0.0, torch.tensor(1.0 / 0.75).item()}
    assert abs((kept == 0).float().mean().item() - 0.25) < 0.02
    perm = torch.randperm(50, device="tpu").cpu()
    assert sorted(perm.tolist()) == list(range(50))
    ints = torch.randint(3, 9, (5000,), device="tpu").cpu()
    assert ints.dtype == torch.int64 and ints.min().item() == 3 and ints.max().item() == 8


def test_dropout_is_identity_in_eval():
    x = torch.randn(10, device="tpu")
    torch.testing.assert_close(torch.nn.functional.dropout(x, 0.5, training=False).cpu(), x.cpu())
