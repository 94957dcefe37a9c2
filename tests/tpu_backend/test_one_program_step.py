"""`tpu_backend.TrainStep`: forward, backward and the optimizer's update as ONE program on the
device, equal to PyTorch's own step on CPU (losses, parameters, optimizer state), with the
remat policies the planner takes, a scheduler's learning rate, and clear refusals."""

import copy

import pytest
import torch
from torch import nn

import tpu_backend
from benchmarks.models import LlamaConfig, LlamaLM, sequence_loss


def batches(steps: int, vocab: int = 64, shape=(2, 16)):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g)) for _ in range(steps)
    ]


def cpu_and_device(layers: int = 3):
    torch.manual_seed(0)
    cpu = LlamaLM(LlamaConfig(layers=layers))
    return cpu, copy.deepcopy(cpu).to("tpu")


def max_difference(a: nn.Module, b: nn.Module) -> float:
    return max((p.detach() - q.detach().cpu()).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("remat", ["none", "full", "matmuls"])
def test_adamw_step_with_a_scheduler_equals_pytorchs_on_cpu(remat):
    cpu, dev = cpu_and_device()
    opt_cpu, opt_dev = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.05) for m in (cpu, dev))
    sched_cpu, sched_dev = (torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in (opt_cpu, opt_dev))
    step = tpu_backend.TrainStep(dev, sequence_loss, opt_dev, remat=remat)
    for inputs, targets in batches(4):
        opt_cpu.zero_grad()
        expected = sequence_loss(cpu(inputs), targets)
        expected.backward()
        opt_cpu.step()
        sched_cpu.step()
        loss = step(inputs.to("tpu"), targets.to("tpu"))
        sched_dev.step()  # no warning: the step counts as optimizer.step() for schedulers
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        assert max_difference(cpu, dev) < 2e-5
    assert len(step._programs) == 1  # the learning rate is a value of the program, not a constant
    state_cpu, state_dev = opt_cpu.state_dict()["state"], opt_dev.state_dict()["state"]
    for i in state_cpu:
        assert float(state_dev[i]["step"]) == float(state_cpu[i]["step"]) == 4
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state_dev[i][key].cpu(), state_cpu[i][key], rtol=1e-4, atol=1e-7)


def test_sgd_with_momentum_and_weight_decay_equals_pytorchs_on_cpu():
    """SGD's momentum buffers start as PyTorch's first step makes them (the gradient itself)."""
    cpu, dev = cpu_and_device(layers=2)
    opt_cpu, opt_dev = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3) for m in (cpu, dev))
    step = tpu_backend.TrainStep(dev, sequence_loss, opt_dev)
    for inputs, targets in batches(3):
        opt_cpu.zero_grad()
        expected = sequence_loss(cpu(inputs), targets)
        expected.backward()
        opt_cpu.step()
        assert step(inputs, targets).item() == pytest.approx(expected.item(), rel=1e-5)  # CPU batches move in
    assert max_difference(cpu, dev) < 2e-5


def test_parameters_are_updated_in_place_and_a_new_batch_shape_compiles_a_new_program():
    _, dev = cpu_and_device(layers=2)
    optimizer = torch.optim.AdamW(dev.parameters(), lr=1e-3)
    step = tpu_backend.TrainStep(dev, sequence_loss, optimizer, remat="full")
    weight = dev.head.weight
    before = weight.detach().cpu().clone()
    for inputs, targets in batches(1) + batches(1, shape=(4, 8)):
        step(inputs, targets)
    assert dev.head.weight is weight and not torch.equal(weight.detach().cpu(), before)
    assert len(step._programs) == 2


def test_what_the_one_program_step_does_not_take_is_refused_by_name():
    _, dev = cpu_and_device(layers=2)
    with pytest.raises(ValueError, match="Adam is not supported; use torch.optim.AdamW or torch.optim.SGD"):
        tpu_backend.TrainStep(dev, sequence_loss, torch.optim.Adam(dev.parameters()))
    with pytest.raises(ValueError, match="amsgrad=False"):
        tpu_backend.TrainStep(dev, sequence_loss, torch.optim.AdamW(dev.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="dampening=0"):
        tpu_backend.TrainStep(
            dev, sequence_loss, torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
        )
    groups = [{"params": list(dev.blocks.parameters())}, {"params": list(dev.head.parameters())}]
    with pytest.raises(ValueError, match="one parameter group is supported, the optimizer has 2"):
        tpu_backend.TrainStep(dev, sequence_loss, torch.optim.AdamW(groups))
    with pytest.raises(ValueError, match="must hold the model's trainable parameters"):
        tpu_backend.TrainStep(dev, sequence_loss, torch.optim.AdamW(dev.head.parameters()))
    cpu = LlamaLM(LlamaConfig(layers=2))
    with pytest.raises(ValueError, match=r"model.to\('tpu'\)"):
        tpu_backend.TrainStep(cpu, sequence_loss, torch.optim.AdamW(cpu.parameters()))


def test_the_models_own_checkpointing_is_named_not_silently_dropped():
    """`torch.utils.checkpoint` inside the model is invisible to the joint trace: a warning says
    to pass `remat`; a reentrant checkpoint (no parameter gradients through it) is refused."""
    from torch.utils.checkpoint import checkpoint

    _, dev = cpu_and_device(layers=2)
    for block in dev.blocks:
        block.forward = lambda x, cos, sin, block=block: checkpoint(block.compute, x, cos, sin, use_reentrant=False)
    step = tpu_backend.TrainStep(dev, sequence_loss, torch.optim.AdamW(dev.parameters()))
    ((inputs, targets),) = batches(1)
    with pytest.warns(UserWarning, match="pass remat='full' or 'matmuls'"):
        step(inputs, targets)

    class Reentrant(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.out = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            return self.out(checkpoint(self.inner, x, use_reentrant=True))

    model = Reentrant().to("tpu")
    step = tpu_backend.TrainStep(model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="use_reentrant=False or leave the checkpointing to remat='full'"):
        step(torch.randn(4, 8), torch.randn(4, 4))


@pytest.mark.parametrize("remat", ["none", "full"])
def test_a_transformers_causal_lm_trains_as_on_cpu(remat):
    """transformers' Llama: decoder layers called with keyword arguments and a tuple of rotary
    tables; with remat its KV cache is off while traced, as transformers does under checkpointing."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = HFLlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    cpu = LlamaForCausalLM(config)
    dev = copy.deepcopy(cpu).to("tpu")
    opt_cpu, opt_dev = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, dev))

    def loss_fn(output, labels):
        return nn.functional.cross_entropy(output.logits[:, :-1].reshape(-1, 128).float(), labels[:, 1:].reshape(-1))

    step = tpu_backend.TrainStep(dev, loss_fn, opt_dev, remat=remat)
    for ids, _ in batches(2, vocab=128):
        opt_cpu.zero_grad()
        expected = loss_fn(cpu(ids), ids)
        expected.backward()
        opt_cpu.step()
        assert step(ids, ids).item() == pytest.approx(expected.item(), rel=1e-5)
        assert max_difference(cpu, dev) < 5e-5
    assert config.use_cache  # given back


def test_a_block_called_with_state_is_not_recomputed():
    class Cache:  # state a block updates: recomputing the block would update it twice
        pass

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x, cache):
            return torch.tanh(self.linear(x))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x):
            cache = Cache()
            for block in self.blocks:
                x = block(x, cache)
            return x

    model = Stack().to("tpu")
    step = tpu_backend.TrainStep(
        model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1), remat="full"
    )
    with pytest.raises(TypeError, match="Block is called with a Cache, which recomputing the block"):
        step(torch.randn(4, 8), torch.randn(4, 8))


def test_gradient_clipping_inside_the_program_equals_clip_grad_norm():
    """`max_grad_norm`: every step here is clipped (a large learning rate makes big gradients);
    SGD sees the gradient's scale directly."""
    cpu, dev = cpu_and_device(layers=2)
    opt_cpu, opt_dev = (torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9) for m in (cpu, dev))
    step = tpu_backend.TrainStep(dev, sequence_loss, opt_dev, max_grad_norm=0.05)
    for inputs, targets in batches(3):
        opt_cpu.zero_grad()
        expected = sequence_loss(cpu(inputs), targets)
        expected.backward()
        assert torch.nn.utils.clip_grad_norm_(cpu.parameters(), 0.05) > 0.05  # the clip acts
        opt_cpu.step()
        assert step(inputs, targets).item() == pytest.approx(expected.item(), rel=1e-5)
        assert max_difference(cpu, dev) < 2e-5
    with pytest.raises(ValueError, match="give a positive norm"):
        tpu_backend.TrainStep(dev, sequence_loss, opt_dev, max_grad_norm=0)


def test_dropout_draws_new_masks_each_step_from_the_seeded_device_stream():
    """A step with dropout takes a key from the device's random stream: the same seed gives
    the same losses, another step (or seed) other masks; the masks are the backward's too
    (the loss falls on a batch it is trained on)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # dropout 0.1 in its embeddings, attention, MLP

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)

    def losses(seed: int, steps: int = 4) -> list[float]:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = tpu_backend.TrainStep(model, lambda out, labels: sequence_loss(out.logits, labels), optimizer)
        torch.manual_seed(seed)
        ((inputs, targets),) = batches(1)
        return [step(inputs, targets).item() for _ in range(steps)]

    first, again, other = losses(1), losses(1), losses(2)
    assert first == again and first != other
    assert first[-1] < first[0]
    _, dev = cpu_and_device(layers=2)
    dev.blocks[0].dropout = nn.Dropout(0.1)  # (LlamaLM has none: the refusal reads the traced step)
    dev.blocks[0].compute = lambda x, cos, sin, f=dev.blocks[0].compute, d=dev.blocks[0].dropout: d(f(x, cos, sin))
    step = tpu_backend.TrainStep(dev, sequence_loss, torch.optim.AdamW(dev.parameters()), remat="full")
    with pytest.raises(NotImplementedError, match="a recomputed block would draw new masks"):
        step(*batches(1)[0])


def test_a_tied_weight_is_one_parameter_whose_gradients_add_up():
    """GPT-2's head is its token embedding: one parameter, two uses, one summed gradient."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    torch.manual_seed(0)
    cpu = GPT2LMHeadModel(config)
    dev = copy.deepcopy(cpu).to("tpu")
    assert dev.lm_head.weight is dev.transformer.wte.weight
    opt_cpu, opt_dev = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (cpu, dev))

    def loss_fn(output, labels):
        return sequence_loss(output.logits, labels)

    step = tpu_backend.TrainStep(dev, loss_fn, opt_dev)
    for inputs, targets in batches(2):
        opt_cpu.zero_grad()
        expected = loss_fn(cpu(inputs), targets)
        expected.backward()
        opt_cpu.step()
        assert step(inputs, targets).item() == pytest.approx(expected.item(), rel=1e-5)
        assert max_difference(cpu, dev) < 2e-5
    assert dev.lm_head.weight is dev.transformer.wte.weight  # still tied after the trace


def test_an_array_someone_else_holds_is_not_donated():
    """Parameters and moments are donated (updated in place) only while their tensors alone
    hold them: a JAX array taken with `tpu_backend.to_jax` stays readable."""
    model = nn.Linear(4, 2).to("tpu")
    step = tpu_backend.TrainStep(model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.5))
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    step(x, y)
    held = tpu_backend.to_jax(model.weight)
    before = held.copy()
    step(x, y)
    assert bool((held == before).all())  # not deleted, not changed
    assert not torch.equal(model.weight.detach().cpu(), torch.from_numpy(before.__array__()))


def test_parameters_are_updated_in_place_after_a_failed_torch_compile_in_the_process():
    """After a `torch.compile` has failed once (Trainer's fallback for a step it cannot
    compile), Python passes every argument to a Python function with one more reference; the
    donation check counted through such a call and stopped donating for the rest of the
    process: every step held the parameters and moments twice. Both compiled steps still
    write the parameters into their own buffers."""
    from torch._dynamo.exc import BackendCompilerFailed

    def refuse(gm, example_inputs):
        raise NotImplementedError("no lowering, on purpose")

    with pytest.raises(BackendCompilerFailed):
        torch.compile(nn.Linear(4, 2), backend=refuse)(torch.randn(3, 4))

    def buffer(t: torch.Tensor) -> int:  # the address only: holding the array forbids donating it
        return tpu_backend.tensor.payload_of(t).array.unsafe_buffer_pointer()

    model = nn.Linear(4, 2).to("tpu")
    step = tpu_backend.TrainStep(model, nn.functional.mse_loss, torch.optim.AdamW(model.parameters(), lr=0.1))
    step(torch.randn(3, 4), torch.randn(3, 2))  # makes the moments
    before = buffer(model.weight)
    step(torch.randn(3, 4), torch.randn(3, 2))
    assert buffer(model.weight) == before and not step._keeping_programs

    weight = torch.randn(64, 64)
    scale = torch.compile(lambda w: w.mul_(0.5), backend="tpu")  # returns the input it wrote
    on_device = weight.to("tpu")
    scale(on_device)
    before = buffer(on_device)
    assert scale(on_device) is on_device and buffer(on_device) == before
    torch.testing.assert_close(on_device.cpu(), weight * 0.25, rtol=0, atol=0)
