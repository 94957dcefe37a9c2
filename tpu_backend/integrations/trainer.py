"""Hugging Face `Trainer` on the "tpu" device: the loss bookkeeping without a host read per step.

Trainer's `logging_nan_inf_filter` (on by default) tests every step's loss on the host,
`torch.isnan(loss) or torch.isinf(loss)`, and adds the mean of the losses logged so far
instead of a non-finite one. The test reads the loss back, so the host waited for the chip
at every step and could not prepare the next one while the chip ran this one
(transformers skips the test on XLA devices for that reason). On the device the same rule
runs on the device: each micro-step's loss comes out of `training_step` already replaced
by `_tr_loss / (1 + global_step - _globalstep_last_logged)` where it is not finite (one
program, `finite_or_mean`), and Trainer's own test of that loss is off for the moment it
runs (`args.logging_nan_inf_filter` is False from the end of `training_step` until
Trainer's next call, `floating_point_ops`, then restored). The sums Trainer logs are the
ones it computes on CPU. With one process, `compute_loss` also skips its token-count
scaling, which is `loss *= 1` there (a program and its backward each step).
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax.numpy as jnp
import torch

from tpu_backend import random as device_random
from tpu_backend.integrations.post_import import when_imported

DEVICE_TYPE = "tpu"


def finite_or_mean_jax(loss, total, count):
    return jnp.where(jnp.isfinite(loss), loss, total / count).astype(loss.dtype)


@functools.cache
def finite_or_mean_op():
    """`tpu_trainer::finite_or_mean(loss, total, count)`: `loss` where it is finite, else
    `total / count`, as one op of the device's table (`count` a float: a value of the
    program, not a constant of it). Made when Trainer is first used on the device."""
    from tpu_backend import dispatch
    from tpu_backend.ops.registry import lowers

    @torch.library.custom_op("tpu_trainer::finite_or_mean", mutates_args=())
    def finite_or_mean(loss: torch.Tensor, total: torch.Tensor, count: float) -> torch.Tensor:
        return torch.where(torch.isfinite(loss), loss, total / count).to(loss.dtype)

    @finite_or_mean.register_fake
    def _(loss, total, count):
        return torch.empty_like(loss)

    lowers(finite_or_mean._opoverload)(finite_or_mean_jax)
    dispatch.register_table()
    return finite_or_mean


@contextlib.contextmanager
def _bookkeeping_on_device(trainer):
    """Inside one `_run_epoch`, the trainer's own methods wrapped (as instance attributes):
    - with `logging_nan_inf_filter`, `training_step` filters its loss on the device
      (`finite_or_mean`), and Trainer's host test is off from there until
      `floating_point_ops`, the next thing Trainer calls;
    - `compute_loss` does not multiply the loss by 1: with one process Trainer's token-count
      scaling (`average_tokens_across_devices`) is `loss *= 1`, two programs a step (the
      product and its backward). Set only where that scale is 1."""
    args, own, filtering = trainer.args, vars(trainer), trainer.args.logging_nan_inf_filter
    names = ("training_step", "floating_point_ops", "compute_loss")
    replaced = {name: own[name] for name in names if name in own}
    step, flops, compute_loss = (getattr(trainer, name) for name in names)
    finite_or_mean = finite_or_mean_op()

    @functools.wraps(step)
    def training_step(*arguments, **keywords):
        loss = step(*arguments, **keywords)
        if loss.device.type != DEVICE_TYPE or trainer._tr_loss.device != loss.device:
            return loss  # (Trainer's own check then runs, and raises for a loss on another device)
        count = 1 + trainer.state.global_step - trainer._globalstep_last_logged
        args.logging_nan_inf_filter = False
        return finite_or_mean(loss, trainer._tr_loss, float(count))

    @functools.wraps(flops)
    def floating_point_ops(*arguments, **keywords):
        args.logging_nan_inf_filter = True
        return flops(*arguments, **keywords)

    @functools.wraps(compute_loss)
    def compute_loss_unscaled(*arguments, **keywords):
        args.average_tokens_across_devices = False
        try:
            return compute_loss(*arguments, **keywords)
        finally:
            args.average_tokens_across_devices = True

    _compile_label_smoother(trainer)
    if args.logging_nan_inf_filter:
        trainer.training_step, trainer.floating_point_ops = training_step, floating_point_ops
    if (
        args.average_tokens_across_devices
        and args.n_gpu <= 1
        and trainer.accelerator.num_processes // trainer.get_tp_size() == 1
    ):
        trainer.compute_loss = compute_loss_unscaled
    try:
        yield
    finally:
        args.logging_nan_inf_filter = filtering
        for name in names:
            own.pop(name, None)
        own.update(replaced)  # (an instance's own methods, set before: as they were)


def _compile_label_smoother(trainer) -> None:
    """`label_smoothing_factor`: Trainer smooths the loss outside the model, about 30 ops a
    step (log-softmax, gather, masks, sums) and as many in the backward, one program each.
    Where accelerate compiles the step, the smoother is compiled too (once per trainer;
    it runs op by op, with one warning, if it cannot be)."""
    from tpu_backend.integrations.accelerate import _CompiledOrEager
    from tpu_backend.integrations.own_code import compile_own

    smoother = trainer.label_smoother
    if smoother is None or isinstance(smoother, _CompiledOrEager) or not trainer.accelerator._tpu_compiles_step:
        return

    def smooth(*arguments, **keywords):
        return smoother(*arguments, **keywords)

    trainer.label_smoother = _CompiledOrEager(compile_own(smooth, backend="tpu"), smoother, "the label smoothing")


def _patch_run_epoch(trainer_module) -> None:
    trainer_class = trainer_module.Trainer
    run_epoch = trainer_class._run_epoch
    if getattr(run_epoch, "_tpu_aware", False):
        return

    @functools.wraps(run_epoch)
    def run_epoch_on_device(self, *args, **kwargs):
        if self.args.device.type != DEVICE_TYPE:
            return run_epoch(self, *args, **kwargs)
        with _bookkeeping_on_device(self):
            return run_epoch(self, *args, **kwargs)

    run_epoch_on_device._tpu_aware = True
    trainer_class._run_epoch = run_epoch_on_device


def _rng_state_file(trainer, directory) -> str:
    """Where Trainer keeps a checkpoint's random states (one file per process)."""
    single = trainer.args.world_size <= 1
    return os.path.join(directory, "rng_state.pth" if single else f"rng_state_{trainer.args.process_index}.pth")


def _patch_rng_state(trainer_module) -> None:
    """A checkpoint keeps the random states of the CPU and of the accelerators Trainer knows
    (CUDA, XLA, NPU, ...), so that a resumed run draws what the run that never stopped would;
    the device's state is kept beside them ("tpu"). Without it a run resumed on the device drew
    other dropout masks from there on."""
    trainer_class = trainer_module.Trainer
    save, load = trainer_class._save_rng_state, trainer_class._load_rng_state
    if getattr(save, "_tpu_aware", False):
        return

    def read(path: str) -> dict:
        with trainer_module.safe_globals():  # (the NumPy state, as Trainer reads the file)
            return torch.load(path, weights_only=True)

    @functools.wraps(save)
    def save_rng_state(self, output_dir: str) -> None:
        save(self, output_dir)
        if self.args.device.type == DEVICE_TYPE:
            device_random.save_into_states_file(_rng_state_file(self, output_dir), DEVICE_TYPE, read)

    @functools.wraps(load)
    def load_rng_state(self, checkpoint: str | None) -> None:
        load(self, checkpoint)
        if checkpoint is not None and self.args.device.type == DEVICE_TYPE:
            device_random.load_from_states_file(_rng_state_file(self, checkpoint), DEVICE_TYPE, read)

    save_rng_state._tpu_aware = True
    trainer_class._save_rng_state, trainer_class._load_rng_state = save_rng_state, load_rng_state


def install() -> None:
    when_imported("transformers.trainer", _patch_run_epoch)
    when_imported("transformers.trainer", _patch_rng_state)
