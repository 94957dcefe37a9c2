"""A whole training step as ONE program on the device, in JAX's memory: `tpu_backend.TrainStep`.

    step = tpu_backend.TrainStep(model, loss_fn, optimizer, remat="full")
    for inputs, targets in batches:
        loss = step(inputs, targets)          # forward, backward and update: one XLA program

`torch.compile` of the usual `loss.backward(); optimizer.step()` runs a step as a forward
program, a backward program and an optimizer program: the saved activations cross from the
first to the second as outputs, and the gradients and moments sit beside the parameters
while the third runs. Here the step is the one `tpu_backend.aot` plans for a pod
(`aot/capture.py`): AOTAutograd's joint forward + backward graph and PyTorch's own foreach
update (AdamW with `capturable=True`, or SGD), lowered to one JAX function, jitted with the
parameters and the optimizer's state donated: the saved activations are temporaries of the
one program, each gradient is consumed inside it, the parameters and moments are updated in
place. `remat` checkpoints the model's repeated blocks as training takes it ("full" keeps
each block's input, "matmuls" its products with weights too; `aot/remat.py`);
`max_grad_norm` clips the gradients in the program as `clip_grad_norm_` does. Dropout draws
its masks from the device's random stream (`torch.manual_seed` seeds it), a new key per step.

The optimizer is a `torch.optim.AdamW` or `torch.optim.SGD` with one parameter group holding
the model's trainable parameters; its state lives in `optimizer.state` as PyTorch's capturable
implementation keeps it (`step` a device tensor, `exp_avg`, `exp_avg_sq`; `momentum_buffer`),
so `optimizer.state_dict()` saves and loads it. The learning rate is read at every call and
passed to the program as a value: a scheduler changes it without a new program. A new batch
shape traces and compiles a new program.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from tpu_backend import random as device_random
from tpu_backend import tensor as device_tensor
from tpu_backend.aot.capture import SETTINGS, StepGraph, trace_step
from tpu_backend.compile.cache import record_compile, record_hit

PROGRAM_NAME = "train_step"


class _Program(NamedTuple):
    """A compiled step and the positions of the arguments it donates."""

    compiled: Callable
    donated: tuple[int, ...]

    def __call__(self, *arrays):
        return self.compiled(*arrays)


class TrainStep:
    """`TrainStep(model, loss, optimizer, remat="none", inputs=1, max_grad_norm=None)(*batch) -> loss`:
    the model takes `batch[:inputs]`, `loss(output, *batch[inputs:])` is minimised, the
    gradients clipped to `max_grad_norm` first as `clip_grad_norm_` does (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        loss: Callable,
        optimizer: torch.optim.Optimizer,
        *,
        remat: str = "none",
        inputs: int = 1,
        max_grad_norm: float | None = None,
    ):
        self.model, self.loss, self.optimizer, self.remat, self.n_inputs = model, loss, optimizer, remat, inputs
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(
                f"TrainStep: max_grad_norm={max_grad_norm!r}; give a positive norm, or None for no clipping"
            )
        self.max_grad_norm = max_grad_norm
        self.kind, self.settings = optimizer_settings(optimizer)
        self.params = [p for p in model.parameters() if p.requires_grad]
        group = optimizer.param_groups[0]["params"]
        if [id(p) for p in group] != [id(p) for p in self.params]:
            raise ValueError(
                "TrainStep: the optimizer's parameter group must hold the model's trainable parameters, in "
                f"model.parameters() order ({len(group)} given, the model trains {len(self.params)})"
            )
        if any(p.device.type != "tpu" for p in self.params):
            raise ValueError("TrainStep: move the model to the device first (model.to('tpu'))")
        self.buffers = [b for _, b in model.named_buffers()]
        self._programs: dict[tuple, tuple[StepGraph, _Program]] = {}
        self._keeping_programs: dict[tuple, _Program] = {}
        self._lr: tuple[float, jax.Array] | None = None

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer's state in the step's order (made as PyTorch makes it, where missing)."""
        state = self.optimizer.state
        for p in self.params:
            if not state[p]:
                if self.kind == "adamw":
                    state[p] = {
                        "step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
                else:
                    state[p] = {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format)}
        keys = ("exp_avg", "exp_avg_sq", "step") if self.kind == "adamw" else ("momentum_buffer",)
        return [state[p][key] for key in keys for p in self.params]

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        state = self.state_tensors()
        written = [*self.params, *state]
        device_tensor.flush()  # pending fused-mode work on the parameters lands first
        arrays = [device_tensor.read(t) for t in written]
        arrays += [self._learning_rate()]
        arrays += [device_tensor.read(b) for b in self.buffers]
        arrays += [_array(t) for t in batch]
        shapes = tuple((tuple(t.shape), t.dtype) for t in batch)
        if shapes not in self._programs:
            self._programs[shapes] = self._compile(batch, arrays)
        else:
            record_hit(PROGRAM_NAME)
        step, program = self._programs[shapes]
        if step.needs_rng:  # dropout: this step's masks from the device's random stream
            arrays.insert(0, device_random.next_key())
        if not device_tensor.held_only_by_their_tensors(arrays, program.donated):
            # an array someone else holds too (`tpu_backend.to_jax(p)`): not donated, not deleted
            program = self._keeping(shapes, batch, arrays)
        loss, *new = program(*arrays)
        for index, value in zip(step.written, new):
            device_tensor.write(written[index], value)
        self.optimizer._opt_called = True  # what optimizer.step() marks for LR schedulers
        return device_tensor.wrap(loss)

    def _compile(self, batch, arrays) -> tuple[StepGraph, _Program]:
        """Trace the step for `batch`'s shapes and compile it for `arrays` (counted in
        `torch.tpu.cache_stats()` as the program "train_step")."""
        began = time.perf_counter()
        inputs, targets = batch[: self.n_inputs], batch[self.n_inputs :]
        step = trace_step(self.model, inputs, targets, self.loss, self.kind, self.remat, self.settings)
        return step, self._lowered(step, arrays, began, donate=True)

    def _lowered(self, step: StepGraph, arrays, began: float, donate: bool) -> _Program:
        key = [device_random.next_key()] if step.needs_rng else []  # (its shape only)
        # 0-d step counts are copied, not donated
        donated = tuple(i + len(key) for i in step.written if step.inputs[i].shape) if donate else ()
        clip = None if self.max_grad_norm is None else functools.partial(clip_by_total_norm, self.max_grad_norm)
        lowered = jax.jit(step.function(reduced=clip), donate_argnums=donated).lower(*key, *arrays)
        traced = time.perf_counter()
        program = _Program(lowered.compile(), donated)
        record_compile(PROGRAM_NAME, time.perf_counter() - began, trace_seconds=traced - began)
        return program

    def _keeping(self, shapes, batch, arrays) -> _Program:
        """The program for `shapes` that donates nothing (compiled on first need)."""
        if shapes not in self._keeping_programs:
            step = self._programs[shapes][0]
            arrays = arrays[1:] if step.needs_rng else arrays
            self._keeping_programs[shapes] = self._lowered(step, arrays, time.perf_counter(), donate=False)
        return self._keeping_programs[shapes]

    def _learning_rate(self) -> jax.Array:
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self._lr is None or self._lr[0] != lr:
            self._lr = (lr, jax.device_put(np.float32(lr)))
        return self._lr[1]


def optimizer_settings(optimizer: torch.optim.Optimizer) -> tuple[str, dict]:
    """("adamw" or "sgd", the hyperparameters the traced update bakes in), or a ValueError
    naming what the one-program step does not take."""
    if len(optimizer.param_groups) != 1:
        raise ValueError(
            f"TrainStep: one parameter group is supported, the optimizer has {len(optimizer.param_groups)}"
        )
    group = optimizer.param_groups[0]
    if type(optimizer) is torch.optim.AdamW:
        if group["amsgrad"]:
            raise ValueError("TrainStep: AdamW(amsgrad=True) is not supported; use amsgrad=False")
        return "adamw", {key: group[key] for key in SETTINGS["adamw"]}
    if type(optimizer) is torch.optim.SGD:
        if group["momentum"] and group["dampening"]:
            # PyTorch's first step copies the gradient into the momentum buffer undamped; the
            # program's buffers start at zero, which equals that copy only without dampening
            raise ValueError("TrainStep: SGD with dampening is not supported; use dampening=0")
        return "sgd", {key: group[key] for key in SETTINGS["sgd"]}
    raise ValueError(
        f"TrainStep: {type(optimizer).__name__} is not supported; use torch.optim.AdamW or torch.optim.SGD "
        "(or torch.compile(backend='tpu') of the usual loss.backward(); optimizer.step())"
    )


def clip_by_total_norm(max_norm: float, grads: list[jax.Array]) -> list[jax.Array]:
    """`torch.nn.utils.clip_grad_norm_(..., max_norm)` inside the program: each gradient's 2-norm,
    the norm of those, and every gradient scaled by min(1, max_norm / (total + 1e-6))."""
    norms = [jnp.linalg.norm(g.astype(jnp.float32).ravel()).astype(g.dtype) for g in grads]
    total = jnp.linalg.norm(jnp.stack([n.astype(jnp.float32) for n in norms]))
    scale = jnp.minimum(max_norm / (total + 1e-6), 1.0)
    return [g * scale.astype(g.dtype) for g in grads]


def _array(t: torch.Tensor) -> jax.Array:
    if t.device.type == "tpu":
        return device_tensor.read(t)
    return device_tensor.cpu_to_jax(t)
