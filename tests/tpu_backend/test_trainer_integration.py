"""Hugging Face accelerate and `Trainer` on the "tpu" device, as a CUDA user runs them.

Every run is compared with the same run on CPU (`use_cpu=True`): the losses Trainer
logs at every step and the trained parameters. A tiny Llama from a config with random
weights (no dropout), 16-token sequences; all runs share shapes, so the device's
programs compile once for the module.
"""

from __future__ import annotations

import subprocess
import sys

import accelerate
import numpy as np
import pytest
import torch
import transformers

import tpu_backend  # noqa: F401  (registers the device and its accelerate integration)
from tests import chip
from tests.tpu_backend.parity import assert_tensors_match, norm_relative_error

VOCAB, SEQUENCE, EXAMPLES = 64, 16, 12
LOSS_ATOL = 1e-3  # the bound for 6 steps of Trainer against CPU
PARAMETER_ATOL = 1e-4  # elementwise; SGD runs
# AdamW runs on a TPU, per tensor, norm-relative: AdamW's first step moves each element by
# lr * g / (|g| + eps), so an element whose gradient is below eps = 1e-8 moves lr / eps = 1e6
# times any difference in it. The chip's gradients are ~1e-9 (3e-6 norm-relative) from CPU's;
# measured on a v5e: one element 7.30e-4 apart after step 1 (7.29e-4 predicted from the two
# gradients, -7.8e-9 against -5.8e-9), tensors up to 6e-4 norm-relative after 6 steps.
ADAMW_PARAMETER_RTOL_ON_TPU = 2e-3
# The compiled optimizer step (accelerate on the device compiles it) computes AdamW's bias
# corrections as float32 tensors, PyTorch's capturable update; CPU's eager AdamW in Python floats:
# 1 - 0.999 is 1.3e-5 off in float32, so the first updates differ by ~1e-5 relative (seen: two
# steps at lr 0.1 move a parameter 1.7e-6 apart).
COMPILED_ADAMW_ATOL = 1e-5
BF16_PARAMETER_RTOL = 0.1  # seen: 0.06 (CPU bf16 against CPU float32 differ as much)


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def token_dataset(count: int = EXAMPLES, seed: int = 1) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, VOCAB, (SEQUENCE,), generator=generator) for _ in range(count)]
    return [{"input_ids": row, "labels": row} for row in rows]


def make_trainer(output_dir, use_cpu: bool, **arguments) -> transformers.Trainer:
    defaults = dict(
        per_device_train_batch_size=2,
        max_steps=6,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=use_cpu, **{**defaults, **arguments})
    return transformers.Trainer(tiny_llama(), args, train_dataset=token_dataset())


def logged_losses(trainer: transformers.Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def cpu_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().float() for name, p in model.named_parameters()}


def train_both(tmp_path, **arguments) -> dict[str, transformers.Trainer]:
    trainers = {}
    for device, use_cpu in (("tpu", False), ("cpu", True)):
        trainers[device] = make_trainer(tmp_path / device, use_cpu, **arguments)
        trainers[device].train()
        assert trainers[device].accelerator.device.type == device  # (accelerate's state is per process)
    assert {p.device.type for p in trainers["tpu"].model.parameters()} == {"tpu"}
    assert {p.device.type for p in trainers["cpu"].model.parameters()} == {"cpu"}
    return trainers


def assert_same_training(
    got: transformers.Trainer, want: transformers.Trainer, loss_atol: float, parameter_atol: float
):
    got_losses, want_losses = logged_losses(got), logged_losses(want)
    assert len(got_losses) == len(want_losses) == want.args.max_steps
    np.testing.assert_allclose(got_losses, want_losses, rtol=0, atol=loss_atol)
    got_parameters, want_parameters = cpu_parameters(got.model), cpu_parameters(want.model)
    if chip.ON_TPU and "adam" in want.args.optim.value:  # (str() of the enum is its upper-case name)
        assert_tensors_match(got_parameters, want_parameters, "AdamW on a TPU", rtol=ADAMW_PARAMETER_RTOL_ON_TPU)
        return
    for name, expected in want_parameters.items():
        torch.testing.assert_close(got_parameters[name], expected, rtol=0, atol=parameter_atol, msg=name)


def accelerate_one_step(cpu: bool):
    """A plain accelerate loop; the optimizer is built before `prepare()`, as users do."""
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(cpu=cpu)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = []
    for batch in loader:
        batches.append(batch.device.type)
        accelerator.backward(model(batch).square().mean())
        optimizer.step()
        optimizer.zero_grad()
    return accelerator.device, accelerator.distributed_type, model, optimizer, batches


def test_accelerate_save_state_keeps_every_weight_and_load_state_resumes_the_device_draws(tmp_path):
    """`save_state` wrote one weight of a tpu model: accelerate's safetensors clean-up keyed
    tensors by storage address, 0 for every tpu storage, so all looked shared (loading then
    failed: 'Missing key(s) in state_dict: "0.bias"'). It also keeps the device's random state
    beside the CPU's now: after `load_state` a loop with dropout draws what the loop that
    never stopped drew (it drew other masks)."""
    import safetensors.torch

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    model = accelerator.prepare(model)
    x = torch.ones(4, 8, device="tpu")

    def outputs(count: int) -> list:
        return [model(x).detach().cpu() for _ in range(count)]

    outputs(2)
    accelerator.save_state(str(tmp_path / "state"))
    saved = safetensors.torch.load_file(str(tmp_path / "state" / "model.safetensors"))
    assert saved.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(saved[name], value.cpu(), rtol=0, atol=0, msg=name)
    after_saving = outputs(3)
    torch.manual_seed(1)  # (another stream, as a new process would have)
    accelerator.load_state(str(tmp_path / "state"))
    after_loading = outputs(3)
    for expected, got in zip(after_saving, after_loading):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_accelerator_prepares_model_optimizer_and_data_on_tpu():
    device, distributed_type, model, optimizer, batches = accelerate_one_step(cpu=False)
    assert device.type == "tpu"
    assert distributed_type == accelerate.DistributedType.NO
    assert batches == ["tpu", "tpu"]
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    moments = [state["exp_avg"] for state in optimizer.state.values()]
    assert len(moments) == 2 and {m.device.type for m in moments} == {"tpu"}  # the optimizer stepped tpu weights
    cpu_device, _, cpu_model, _, _ = accelerate_one_step(cpu=True)
    assert cpu_device.type == "cpu"  # cpu=True still means CPU
    for name, expected in cpu_model.named_parameters():
        atol = COMPILED_ADAMW_ATOL  # `prepare()` compiled the model and the step (no `_orig_mod.` prefix)
        torch.testing.assert_close(dict(model.named_parameters())[name].cpu(), expected, rtol=0, atol=atol)


@pytest.mark.parametrize("arguments", [{}, {"optim": "sgd", "learning_rate": 0.5}], ids=["default-adamw", "sgd"])
def test_trainer_trains_on_tpu_like_cpu(tmp_path, arguments):
    """Default TrainingArguments (AdamW, linear schedule), and SGD, whose steps keep the
    gradients' scale: 6 steps, losses within 1e-3, parameters elementwise."""
    trainers = train_both(tmp_path, **arguments)
    assert trainers["tpu"].args.device.type == "tpu"
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, PARAMETER_ATOL)


def test_gradient_accumulation_and_clipping_match_cpu(tmp_path):
    trainers = train_both(tmp_path, gradient_accumulation_steps=2, max_grad_norm=0.5)
    grad_norms = [entry["grad_norm"] for entry in trainers["tpu"].state.log_history if "grad_norm" in entry]
    assert max(grad_norms) > 0.5  # clipping took effect
    assert_same_training(trainers["tpu"], trainers["cpu"], LOSS_ATOL, PARAMETER_ATOL)


def test_bf16_autocasts_on_the_device(tmp_path):
    """bf16=True: matmuls run in bfloat16 on "tpu" (as CPU's autocast does); parameters stay float32."""
    trainer = make_trainer(tmp_path / "tpu", use_cpu=False, bf16=True)
    seen = []
    trainer.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    trainer.train()
    assert seen and set(seen) == {torch.bfloat16}
    cpu = make_trainer(tmp_path / "cpu", use_cpu=True, bf16=True)
    cpu.train()
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    # bfloat16 rounding differs between XLA's and CPU's kernels, and Adam turns a flipped
    # sign of a tiny gradient into a full lr-sized step: losses within a bfloat16
    # tolerance, parameters norm-relative (elementwise, CPU bf16 vs CPU fp32 differ as much)
    np.testing.assert_allclose(logged_losses(trainer), logged_losses(cpu), rtol=0, atol=1e-2)
    want = cpu_parameters(cpu.model)
    errors = {name: norm_relative_error(got, want[name]) for name, got in cpu_parameters(trainer.model).items()}
    assert max(errors.values()) < BF16_PARAMETER_RTOL, errors


def test_fp16_is_refused_naming_bf16(tmp_path):
    with pytest.raises(ValueError, match=r"fp16 .*not supported on the tpu device.*Use bf16=True"):
        make_trainer(tmp_path, use_cpu=False, fp16=True)


def test_activation_checkpointing_trains_like_without(tmp_path):
    """activation_checkpointing=True (gradient checkpointing: recomputation in the backward) gives the same steps."""
    runs = [
        make_trainer(tmp_path / str(flag), use_cpu=False, activation_checkpointing=flag, max_steps=2)
        for flag in (True, False)
    ]
    for trainer in runs:
        trainer.train()
    assert runs[0].model.is_gradient_checkpointing and not runs[1].model.is_gradient_checkpointing
    np.testing.assert_allclose(logged_losses(runs[0]), logged_losses(runs[1]), rtol=0, atol=1e-6)
    # compiled, the recomputing backward is another XLA program than the plain one: its sums
    # round differently, and AdamW moves an element whose gradient is near zero by up to
    # lr * (difference / |gradient|) (seen: 3.2e-5 after two steps at lr 1e-2)
    for name, expected in cpu_parameters(runs[1].model).items():
        actual = cpu_parameters(runs[0].model)[name]
        torch.testing.assert_close(actual, expected, rtol=0, atol=PARAMETER_ATOL, msg=name)


def test_save_and_resume_equals_an_uninterrupted_run(tmp_path):
    """Optimizer and scheduler state are saved from the device and read back onto it: a
    run resumed from step 3 ends where the run that never stopped does."""
    uninterrupted = make_trainer(tmp_path / "whole", use_cpu=False)
    uninterrupted.train()
    first_half = make_trainer(tmp_path / "halves", use_cpu=False, save_strategy="steps", save_steps=3)
    first_half.train()
    checkpoint = tmp_path / "halves" / "checkpoint-3"
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "scheduler.pt").exists()
    saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)["state"]
    assert {t.device.type for s in saved.values() for t in s.values()} == {"cpu"}  # a CPU machine reads it

    resumed = make_trainer(tmp_path / "halves", use_cpu=False, save_strategy="steps", save_steps=3)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    state = resumed.optimizer.state
    assert {t.device.type for s in state.values() for t in s.values() if t.dim()} == {"tpu"}
    # the resumed state's history holds steps 1-3 from the checkpoint, then its own 4-6
    np.testing.assert_allclose(logged_losses(resumed), logged_losses(uninterrupted), rtol=0, atol=1e-6)
    for name, expected in cpu_parameters(uninterrupted.model).items():
        torch.testing.assert_close(cpu_parameters(resumed.model)[name], expected, rtol=0, atol=1e-6, msg=name)


def test_a_run_resumed_with_dropout_draws_the_masks_of_the_uninterrupted_one(tmp_path, monkeypatch):
    """The checkpoint keeps the device's random state beside the CPU's: resumed at step 3,
    a model with dropout draws the masks the run that never stopped drew (it drew others)."""
    build = tiny_llama

    def tiny_llama_with_dropout():
        model = build()
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.3
        return model

    monkeypatch.setattr(sys.modules[__name__], "tiny_llama", tiny_llama_with_dropout)  # (make_trainer's)
    uninterrupted = make_trainer(tmp_path / "whole", use_cpu=False)
    uninterrupted.train()
    make_trainer(tmp_path / "halves", use_cpu=False, save_strategy="steps", save_steps=3).train()
    saved = torch.load(tmp_path / "halves" / "checkpoint-3" / "rng_state.pth", weights_only=False)
    assert saved["tpu"].dtype == torch.uint8
    resumed = make_trainer(tmp_path / "halves", use_cpu=False, save_strategy="steps", save_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "halves" / "checkpoint-3"))
    np.testing.assert_allclose(logged_losses(resumed), logged_losses(uninterrupted), rtol=0, atol=1e-6)


def token_accuracy(prediction: transformers.EvalPrediction) -> dict:
    predicted = prediction.predictions.argmax(-1)[:, :-1]
    return {"accuracy": float((predicted == prediction.label_ids[:, 1:]).mean())}


def test_evaluate_with_compute_metrics_matches_cpu(tmp_path):
    results = {}
    for device, use_cpu in (("tpu", False), ("cpu", True)):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / device), use_cpu=use_cpu, per_device_eval_batch_size=4, report_to=[]
        )
        trainer = transformers.Trainer(
            tiny_llama(), args, eval_dataset=token_dataset(8, seed=3), compute_metrics=token_accuracy
        )
        results[device] = trainer.evaluate()
    assert results["tpu"]["eval_accuracy"] == results["cpu"]["eval_accuracy"]
    assert results["tpu"]["eval_loss"] == pytest.approx(results["cpu"]["eval_loss"], abs=1e-4)


@pytest.mark.slow  # about a minute: compiles the forward and backward programs
def test_torch_compile_with_the_tpu_backend_matches_cpu(tmp_path):
    """torch_compile=True, torch_compile_backend="tpu": the compiled model trains like CPU eager."""
    compiled = make_trainer(tmp_path / "tpu", use_cpu=False, torch_compile=True, torch_compile_backend="tpu")
    compiled.train()
    assert compiled.accelerator.state.dynamo_plugin.backend.value.lower() == "tpu"
    eager_cpu = make_trainer(tmp_path / "cpu", use_cpu=True)
    eager_cpu.train()
    assert_same_training(compiled, eager_cpu, LOSS_ATOL, PARAMETER_ATOL)


@pytest.mark.slow  # two processes compile every program on a 2-core machine: minutes each
@pytest.mark.parametrize("strategy", [["--multi_gpu"], ["--use_fsdp", "--fsdp_version", "2"]], ids=["ddp", "fsdp2"])
def test_accelerate_launch_two_processes_match_one_cpu_process(tmp_path, strategy):
    """`accelerate launch --num_processes 2` with DDP or accelerate's FSDP plugin: each
    process trains on its tpu device over the "tpu" torch.distributed backend; 2 x 2
    examples per step train like one CPU process with batches of 4 (same losses and
    parameters)."""
    from tests.tpu_backend.distributed.test_process_group import ROOT, TIMEOUT, free_port, torchrun_env

    script = f"{ROOT}/tests/tpu_backend/distributed/trainer_ddp.py"
    argv = [sys.executable, "-m", "accelerate.commands.launch", *strategy, "--num_processes", "2"]
    argv += ["--main_process_port", str(free_port()), script, str(tmp_path / "launched")]
    done = subprocess.run(argv, cwd=ROOT, env=torchrun_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"accelerate launch failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    report = torch.load(tmp_path / "launched" / "ranked.pt", weights_only=True)

    reference = make_trainer(tmp_path / "cpu", use_cpu=True, per_device_train_batch_size=4)
    reference.train()
    np.testing.assert_allclose(report["losses"], logged_losses(reference), rtol=0, atol=LOSS_ATOL)
    for name, expected in cpu_parameters(reference.model).items():
        torch.testing.assert_close(report["parameters"][name], expected, rtol=0, atol=PARAMETER_ATOL, msg=name)
