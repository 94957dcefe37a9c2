"""Seeding torch makes device randomness reproducible."""

import pytest
import torch

import tpu_backend


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


def _draw_with(g: torch.Generator) -> dict:
    x, noise = torch.empty(64, device="tpu"), torch.zeros(64, device="tpu")
    return {
        "randn": torch.randn(16, generator=g, device="tpu"),
        "randint": torch.randint(0, 100, (16,), generator=g, device="tpu"),
        "randperm": torch.randperm(16, generator=g, device="tpu"),
        "normal_": x.clone().normal_(2.0, 3.0, generator=g),
        "bernoulli_": x.clone().bernoulli_(0.3, generator=g),
        "multinomial": torch.multinomial(torch.ones(8, device="tpu"), 4, generator=g),
        # the generator is a positional argument of this one
        "rrelu_with_noise": torch.ops.aten.rrelu_with_noise(
            torch.linspace(-2, 2, 64).to("tpu"), noise, 0.1, 0.3, True, g
        ),
    }


def test_an_explicit_generator_is_honoured_and_leaves_the_device_stream_alone():
    """Re-seeding a generator repeats what it drew (it used to be ignored: the device stream
    drew instead), successive draws differ, and the device's own stream does not move."""
    g = torch.Generator().manual_seed(11)
    torch.manual_seed(5)
    first = {k: v.cpu() for k, v in _draw_with(g).items()}
    after_generator_draws = torch.randn(8, device="tpu").cpu()
    torch.manual_seed(5)
    assert torch.equal(after_generator_draws, torch.randn(8, device="tpu").cpu()), "the device stream moved"
    g.manual_seed(11)
    torch.manual_seed(99)  # the device stream's seed plays no part
    second = {k: v.cpu() for k, v in _draw_with(g).items()}
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert not torch.equal(torch.randn(16, generator=g, device="tpu").cpu(), first["randn"])


class _CheckpointedDropout(torch.nn.Module):
    def __init__(self, checkpointed: str):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.dropout, self.checkpointed = torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), checkpointed

    def block(self, x):
        return self.dropout(self.linear(x)).relu()

    def forward(self, x):
        if self.checkpointed == "no":
            return self.block(x)
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=self.checkpointed == "reentrant")


@pytest.mark.parametrize("how", ["strict", "fused", "torch.compile"])
def test_checkpointed_dropout_recomputes_the_forwards_masks(how):
    """Activation checkpointing recomputes a region in the backward: its dropout must draw
    the forward's masks again. Eagerly the device's random state was not stashed
    (`torch.utils.checkpoint` reads `torch.tpu._initialized`), and compiled the forward's
    masks could not be handed to the backward (`run_and_save_rng_state` has no tpu form): the
    gradients were those of other masks (37.8 apart), or the graph did not compile."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5)).to("tpu").requires_grad_()
    gradients = {}
    tpu_backend.set_eager_mode("fused" if how == "fused" else "strict")
    try:
        for checkpointed in ("no", "reentrant", "non-reentrant"):
            model = _CheckpointedDropout(checkpointed).to("tpu")
            run = torch.compile(model, backend="tpu") if how == "torch.compile" else model
            torch.manual_seed(1)
            run(x).square().sum().backward()
            gradients[checkpointed] = model.linear.weight.grad.cpu()
    finally:
        tpu_backend.set_eager_mode("strict")
    assert gradients["no"].abs().sum() > 0
    torch.testing.assert_close(gradients["reentrant"], gradients["no"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gradients["non-reentrant"], gradients["no"], rtol=1e-6, atol=1e-6)
