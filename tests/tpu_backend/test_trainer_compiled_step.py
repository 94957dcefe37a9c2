"""Trainer on the "tpu" device runs its step as compiled programs, with no flag.

With Trainer's default arguments (AdamW, clipping at 1.0, a linear schedule, the NaN/Inf
loss filter) a steady step is four compiled programs (forward, backward, clipping, the
optimizer) and a few per-op ones (the token count, the backward's seeds, the loss
bookkeeping), compiles nothing after its second step and never reads a value back to the
host. The tiny Llama and the CPU comparison are `test_trainer_integration`'s.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers

import tpu_backend  # noqa: F401
from tests.tpu_backend.test_trainer_integration import (
    COMPILED_ADAMW_ATOL,
    LOSS_ATOL,
    PARAMETER_ATOL,
    assert_same_training,
    logged_losses,
    make_trainer,
    tiny_llama,
    token_dataset,
)
from tpu_backend.compile.cache import compile_stats
from tpu_backend.eager.modes import get_eager_mode
from tpu_backend.eager.runner import CACHE_STATS

MAX_PER_OP_PROGRAMS = 8  # issue 66's bound for a steady default step
HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")


class StepCounters(transformers.TrainerCallback):
    """Per step: (per-op programs run, compiled programs run, programs compiled) so far; with
    `reads_between` (a, b), the host reads of steps a+1 to b (a profile over them)."""

    def __init__(self, reads_between: tuple[int, int] | None = None):
        self.after_step, self.reads, self.reads_between, self.profile = {}, None, reads_between, None

    def on_step_end(self, args, state, control, **kwargs):
        programs = compile_stats().total()
        self.after_step[state.global_step] = (
            CACHE_STATS.requests,
            programs.requests,
            CACHE_STATS.misses + programs.misses,
        )
        if self.reads_between and state.global_step == self.reads_between[0]:
            self.profile = torch.profiler.profile()
            self.profile.__enter__()
        if self.profile is not None and state.global_step == self.reads_between[1]:
            self.profile.__exit__(None, None, None)
            self.reads = sum(e.count for e in self.profile.key_averages() if e.key in HOST_READS)
            self.profile = None

    def per_step(self, first: int, last: int) -> tuple[float, float, int]:
        (a_op, a_compiled, a_compiles), (b_op, b_compiled, b_compiles) = self.after_step[first], self.after_step[last]
        steps = last - first
        return (b_op - a_op) / steps, (b_compiled - a_compiled) / steps, b_compiles - a_compiles


def test_a_default_step_is_four_compiled_programs_a_few_per_op_ones_and_no_host_read(tmp_path):
    trainer = make_trainer(tmp_path, use_cpu=False, logging_steps=100)  # logs only at its end
    counters = StepCounters(reads_between=(2, 5))
    trainer.add_callback(counters)
    trainer.train()
    per_op, compiled, compiles = counters.per_step(2, 5)
    assert compiled == 4  # forward, backward, clipping, AdamW
    assert per_op <= MAX_PER_OP_PROGRAMS
    assert compiles == 0, "programs compiled after the second step"
    assert counters.reads == 0, "a steady step read a value back to the host"
    assert trainer.model._compiled_call_impl is not None  # compiled in place: names as they were
    assert not any(name.startswith("_orig_mod") for name, _ in trainer.model.named_parameters())


def test_label_smoothing_is_compiled_and_trains_as_on_cpu(tmp_path):
    """`label_smoothing_factor`: Trainer smooths the loss outside the model; op by op that
    was ~30 more programs a step (39 per-op programs against 10)."""
    trainers = {"tpu": make_trainer(tmp_path / "tpu", use_cpu=False, label_smoothing_factor=0.1)}
    counters = StepCounters()
    trainers["tpu"].add_callback(counters)
    trainers["tpu"].train()
    per_op, compiled, compiles = counters.per_step(2, 5)
    assert compiled == 6  # forward, smoothing, their backwards, clipping, AdamW
    assert per_op <= MAX_PER_OP_PROGRAMS + 2  # (+ the reads of the loss Trainer logs at every step here)
    assert compiles == 0
    trainers["cpu"] = make_trainer(tmp_path / "cpu", use_cpu=True, label_smoothing_factor=0.1)
    trainers["cpu"].train()
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, COMPILED_ADAMW_ATOL)


def test_gradient_accumulation_adds_the_gradients_in_one_program(tmp_path):
    """With `gradient_accumulation_steps=3`, each micro-step is a default step's programs
    but the optimizer's and the clipping's; autograd's adds of new gradients into held
    ones (a program per parameter and micro-step: 66 per-op programs a step with a log at
    each) are one `_foreach_add_`. Parity with CPU: test_trainer_integration's test."""
    trainer = make_trainer(tmp_path, use_cpu=False, logging_steps=100, gradient_accumulation_steps=3)
    counters = StepCounters()
    trainer.add_callback(counters)
    trainer.train()
    per_op, compiled, compiles = counters.per_step(2, 5)
    assert compiled == 3 * 2 + 2  # forward and backward per micro-step, clipping, AdamW
    assert per_op <= 3 * MAX_PER_OP_PROGRAMS
    assert compiles == 0


class LossTurnsNaN(transformers.Trainer):
    """A trainer whose second micro-step's loss is NaN (its gradient stays the loss's)."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.state.global_step == 1:
            loss = loss + torch.full_like(loss.detach(), float("nan"))
        return loss


def nan_trainer(output_dir, use_cpu: bool) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        use_cpu=use_cpu,
        per_device_train_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        logging_steps=3,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    return LossTurnsNaN(tiny_llama(), args, train_dataset=token_dataset())


def test_a_non_finite_loss_is_logged_as_trainer_logs_it_on_cpu(tmp_path):
    """The NaN/Inf filter runs on the device: the NaN of step 2 counts as the mean of the
    steps logged before it, as transformers' host test makes it on CPU."""
    trainers = {}
    for device in ("tpu", "cpu"):  # (one after the other: accelerate's state is per process)
        trainers[device] = nan_trainer(tmp_path / device, device == "cpu")
        trainers[device].train()
    got, want = logged_losses(trainers["tpu"]), logged_losses(trainers["cpu"])
    assert len(got) == 2 and all(loss == loss for loss in want)  # (NaN != NaN: the filter took it)
    assert got == pytest.approx(want, abs=LOSS_ATOL)
    assert trainers["tpu"].args.logging_nan_inf_filter  # restored after the run


class PlainSGD(torch.optim.Optimizer):
    """An optimizer that is not one of torch.optim's (its step is not compiled)."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_an_optimizer_of_its_own_steps_as_one_fused_program_with_one_warning_naming_it(tmp_path):
    """An optimizer Dynamo may not follow (transformers' Adafactor recompiled at every step)
    runs its step in the fused eager mode: one program, not one per op (474 a step for
    Adafactor on the tiny Llama)."""
    from tpu_backend import fused

    def trainer(device: str) -> transformers.Trainer:
        model = tiny_llama()
        args = make_trainer(tmp_path / device, use_cpu=device == "cpu").args
        optimizers = (PlainSGD(model.parameters(), lr=0.5), None)
        return transformers.Trainer(model, args, train_dataset=token_dataset(), optimizers=optimizers)

    trainers = {"tpu": trainer("tpu")}
    counters = StepCounters()
    trainers["tpu"].add_callback(counters)
    fused.reset_stats()
    with pytest.warns(RuntimeWarning, match=r"the optimizer PlainSGD is not one of torch.optim's.*fused eager") as seen:
        trainers["tpu"].train()
    assert sum("PlainSGD" in str(w.message) for w in seen) == 1
    assert fused.stats()["programs_run"] == trainers["tpu"].args.max_steps
    assert counters.per_step(2, 5)[0] <= MAX_PER_OP_PROGRAMS + 2  # (+ the reads of the loss logged each step)
    assert get_eager_mode() == "strict"
    trainers["cpu"] = trainer("cpu")
    trainers["cpu"].train()
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, PARAMETER_ATOL)


def test_tpu_trainer_compile_0_keeps_the_step_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_TRAINER_COMPILE", "0")
    trainer = make_trainer(tmp_path, use_cpu=False, max_steps=4, logging_steps=100)
    counters = StepCounters()
    trainer.add_callback(counters)
    trainer.train()
    per_op, compiled, _ = counters.per_step(2, 3)
    assert compiled == 0 and per_op > 100
    assert trainer.model._compiled_call_impl is None


def test_torch_compile_without_a_backend_gets_the_tpu_backend_not_inductor(tmp_path):
    trainer = make_trainer(tmp_path, use_cpu=False, torch_compile=True)
    assert trainer.args.torch_compile_backend == "inductor"  # TrainingArguments' default
    assert trainer.accelerator.state.dynamo_plugin.backend.value.lower() == "tpu"


def test_generate_after_training_compiles_what_a_fresh_model_compiles(tmp_path):
    """Trainer leaves the model compiled in place and sets `config.use_cache = False`; greedy
    generate() of 32 new tokens then still decodes with its compiled step (a handful of
    programs, not a set of per-op programs for every new length), with the tokens of the
    same weights on CPU."""
    trainer = make_trainer(tmp_path, use_cpu=False, max_steps=2)
    trainer.train()
    model = trainer.model
    prompt = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(2))
    before = CACHE_STATS.misses + compile_stats().total().misses
    ids = model.generate(prompt.to("tpu"), max_new_tokens=32, do_sample=False)
    assert CACHE_STATS.misses + compile_stats().total().misses - before <= 16
    on_cpu = tiny_llama()
    on_cpu.load_state_dict({name: value.cpu() for name, value in model.state_dict().items()})
    torch.testing.assert_close(ids.cpu(), on_cpu.generate(prompt, max_new_tokens=32, do_sample=False))


def test_a_step_that_cannot_be_compiled_runs_eagerly_with_one_warning(tmp_path, monkeypatch):
    """A compile error (here the "tpu" backend refusing every graph, as it would an op it has
    no lowering for) leaves the model, the optimizer and the clipping eager, each with one
    warning naming it and the error; training goes on as on CPU."""
    from torch._dynamo.backends import registry

    def refuse(gm, example_inputs, **kwargs):
        raise NotImplementedError("no tpu lowering for aten.made_up")

    monkeypatch.setitem(registry._COMPILER_FNS, "tpu", refuse)
    trainers = {"tpu": make_trainer(tmp_path / "tpu", use_cpu=False)}
    with pytest.warns(RuntimeWarning, match=r"could not be compiled \(BackendCompilerFailed") as seen:
        trainers["tpu"].train()
    refused = sorted(str(w.message).split(" could not")[0] for w in seen if "could not be compiled" in str(w.message))
    assert refused == [
        "accelerate on the tpu device: the gradient clipping",
        "accelerate on the tpu device: the model LlamaForCausalLM",
        "accelerate on the tpu device: the optimizer AdamW's step",
    ]
    trainers["cpu"] = make_trainer(tmp_path / "cpu", use_cpu=True)
    trainers["cpu"].train()
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, PARAMETER_ATOL)


def test_the_loss_filter_compiles_for_a_tpu():
    """Trainer's NaN/Inf filter on the device, exported through its lowering and compiled by
    libtpu for a v5e; on CPU tensors the op gives the filter's values."""
    from tests.helpers import compile_for_tpu
    from tpu_backend.integrations.trainer import finite_or_mean_op

    finite_or_mean = finite_or_mean_op()
    total = torch.tensor(6.0)
    assert finite_or_mean(torch.tensor(float("nan")), total, 3.0).item() == 2.0
    assert finite_or_mean(torch.tensor(1.5), total, 3.0).item() == 1.5
    exported = tpu_backend.export(lambda loss, total: finite_or_mean(loss, total, 3.0), (torch.tensor(1.5), total))
    compile_for_tpu(exported.call, *exported.in_avals, chip="v5e")


def test_fused_eager_mode_runs_each_step_as_one_program_as_on_cpu(tmp_path, monkeypatch):
    """In fused eager mode (the compiled step switched off) the optimizer's step ends the
    step's graph, and the reads transformers' mask code makes mid-forward are computed alone:
    one program a step, nothing compiled after the second, losses and parameters as on CPU
    (SGD: its update is the gradient's own scale). Trainer logs every step here: its reads of
    the loss run between steps."""
    from tpu_backend import fused

    monkeypatch.setenv("TPU_TRAINER_COMPILE", "0")
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("fused")
    try:
        trainers = {"tpu": make_trainer(tmp_path / "tpu", use_cpu=False, optim="sgd", learning_rate=0.5)}
        counters = StepCounters()
        trainers["tpu"].add_callback(counters)
        fused.reset_stats()
        trainers["tpu"].train()
        stats = fused.stats()
    finally:
        tpu_backend.set_eager_mode(previous)
    steps = trainers["tpu"].args.max_steps
    assert stats["syncs"]["mark_step"] == steps and stats["reads_alone"] > 0, stats
    # the only other programs: the logging's reads of the loss, between steps
    assert {site.split(":")[0] for site in stats["read_sites"]} == {transformers.trainer.__file__}, stats
    assert counters.per_step(2, steps)[2] == 0, "programs compiled after the second step"
    trainers["cpu"] = make_trainer(tmp_path / "cpu", use_cpu=True, optim="sgd", learning_rate=0.5)
    trainers["cpu"].train()
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, PARAMETER_ATOL)


def test_the_ninth_optimizer_of_a_process_still_steps_as_one_compiled_program():
    """Each Trainer compiles its own optimizer's step. Traced through torch.optim's wrappers,
    whose graph breaks made Dynamo compile the class's shared `step` code guarded on the
    optimizer object, the 9th optimizer of a process (a hyperparameter search) passed Dynamo's
    recompile limit and stepped op by op; the update is compiled alone now, the hooks around it."""
    from tpu_backend.integrations.accelerate import _compiled_optimizer_step

    calls = []
    for index in range(10):
        torch.manual_seed(index)
        cpu = torch.nn.Linear(8, 4)
        model = copy.deepcopy(cpu).to("tpu")
        optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1, fused=m is model) for m in (cpu, model)]
        optimizers[1].register_step_post_hook(lambda optimizer, args, kwargs, index=index: calls.append(index))
        step = _compiled_optimizer_step(optimizers[1])
        for _ in range(2):  # the first makes the optimizer's state
            for m in (cpu, model):
                m(torch.ones(2, 8, device=m.weight.device)).square().sum().backward()
            optimizers[0].step()
            before = (CACHE_STATS.requests, compile_stats().total().requests)
            step()
        # the steady step: one compiled program, no per-op one
        assert (CACHE_STATS.requests - before[0], compile_stats().total().requests - before[1]) == (0, 1)
        torch.testing.assert_close(model.weight.cpu(), cpu.weight.detach(), rtol=0, atol=COMPILED_ADAMW_ATOL)
    assert calls == [index for index in range(10) for _ in range(2)]  # the step's hooks ran, eagerly


def test_a_second_model_of_a_process_compiles_at_its_own_static_sizes(monkeypatch):
    """Dynamo remembers which input sizes changed between calls per code name and line:
    the model and optimizer steps that accelerate compiles for each model shared theirs, so
    a second model of other sizes compiled its forward, backward and optimizer with symbolic
    sizes (bucketed programs; with labels, some failed). Each is its own code now."""
    from tpu_backend.compile import dynamic
    from tpu_backend.integrations.accelerate import _compile_in_place, _compiled_optimizer_step

    bucketed = []
    compile_bucketed = dynamic.compile_bucketed
    monkeypatch.setattr(
        dynamic, "compile_bucketed", lambda gm, name, *a: bucketed.append(name) or compile_bucketed(gm, name, *a)
    )
    for width in (8, 12, 16):
        torch.manual_seed(width)
        cpu = torch.nn.Linear(width, 4)
        model = copy.deepcopy(cpu).to("tpu")
        _compile_in_place(model)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (cpu, model)]
        step = _compiled_optimizer_step(optimizers[1])
        for m in (cpu, model):
            m(torch.ones(width, width, device=m.weight.device)).square().sum().backward()
        optimizers[0].step()
        step()
        torch.testing.assert_close(model.weight.cpu(), cpu.weight.detach(), rtol=1e-6, atol=1e-6)
    assert bucketed == []


def test_gpt2s_forward_with_labels_is_one_graph():
    """GPT-2's class names no loss type: transformers logs a warning when its forward looks
    its loss function up, and a logger call breaks Dynamo's graph (two forward and two
    backward programs a step, the logits written out between them). accelerate's model
    compile looks it up once before."""
    from benchmarks.families import causal_lm as families
    from tpu_backend.integrations.accelerate import _compile_in_place

    torch._dynamo.utils.counters.clear()
    model = families.build("gpt2").to("tpu")
    _compile_in_place(model)
    ids = torch.randint(0, families.VOCAB, (2, 8), device="tpu")
    model(input_ids=ids, labels=ids).loss.backward()
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_gradient_checkpointing_with_dropout_compiles_and_trains_as_without(tmp_path):
    """BERT's defaults keep dropout at 0.1. With `gradient_checkpointing=True` the model did not
    compile (the recomputed dropout's random state had no tpu form: one warning, then op by
    op) and trained on other masks than the forward's (losses apart from step 2, parameters
    0.05 apart). Now compiled, and the same run as without checkpointing."""
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
    )
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 64, (16,), generator=generator) for _ in range(12)]
    data = [{"input_ids": row, "labels": int(row[0] % 3)} for row in rows]
    runs = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(config)
        arguments = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(checkpointing)),
            per_device_train_batch_size=4,
            max_steps=3,
            logging_steps=1,
            learning_rate=1e-2,
            report_to=[],
            disable_tqdm=True,
            save_strategy="no",
            seed=0,
            gradient_checkpointing=checkpointing,
        )
        trainer = transformers.Trainer(model, arguments, train_dataset=data)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # (the fallback's warning)
            trainer.train()
        runs[checkpointing] = trainer
    assert logged_losses(runs[True]) == pytest.approx(logged_losses(runs[False]), abs=1e-6)
    for (name, got), expected in zip(runs[True].model.named_parameters(), runs[False].model.parameters()):
        torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=0, atol=1e-5, msg=name)
