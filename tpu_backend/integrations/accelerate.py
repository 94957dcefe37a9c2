"""Hugging Face accelerate (and so `Trainer`) on the "tpu" device.

transformers finds the device through `torch.accelerator` (it reports "tpu"), but
accelerate 1.15 picks its device and distributed mode from a fixed list of vendors
(`PartialState.default_device`, `_prepare_backend`, `set_device`): with nothing else
on the list it chose the CPU, so `Trainer` kept the model there while
`TrainingArguments.device` said tpu:0. accelerate has no hook for another accelerator,
so three small patches of `PartialState` put the "tpu" device where CUDA would be:

- one process: `default_device` is "tpu" when no vendor accelerate knows is present;
- `accelerate launch` / torchrun (LOCAL_RANK set): the process group uses the
  project's `torch.distributed` backend "tpu" and the mode is MULTI_GPU (accelerate's
  one-device-per-process mode: DDP, and FSDP through its plugin, hang off it);
- each process's device is tpu:0 (one device per process; the chip a process drives is
  chosen by `init_process_group("tpu")` from LOCAL_RANK), and DDP is given no
  `device_ids` (accelerate passes `[local_process_index]`, which names tpu:1 on rank 1)
  and no `find_unused_parameters` (see `_without_find_unused_parameters`).

An optimizer built before `prepare()` follows the model there with nothing from us:
`module.to("tpu")` keeps each Parameter object (`tpu_backend/modules.py`).

`cpu=True` (`use_cpu=True` in `TrainingArguments`) keeps accelerate's own CPU paths.
fp16 is refused by accelerate for a device it does not know; we say what to use (bf16).

accelerate's `DynamoBackend` enum is closed (it names the backends it knows), so
`torch_compile_backend="tpu"` / `accelerate launch --dynamo_backend tpu` were rejected
before reaching `torch.compile`; we add a TPU member (passed on as backend "tpu").

The training step as compiled programs, by default. Run op by op, a Trainer step of a small
Llama launched 330 per-op programs and ran at 13% of the hand-written compiled loop's
speed on a v5e. On the "tpu" device an `Accelerator` (and so `Trainer`) therefore compiles
what a CUDA user's loop runs, with no flag (in one process: under `accelerate launch` the steps
stay eager):
- the model: `prepare()` compiles it with backend "tpu", as `torch_compile=True` does
  (Trainer's `torch_compile=True` without a backend asks for inductor, which cannot
  generate code for this device: it gets "tpu" too);
- the optimizer's step: `optimizer.step()` of a prepared optimizer runs its update as one
  compiled program (the step's hooks around it) when the optimizer is one of `torch.optim`'s;
  any other steps op by op, with one warning naming it;
- gradient clipping: `accelerator.clip_grad_norm_` computes the norm and scales the
  gradients in one compiled program.
`TPU_TRAINER_COMPILE=0` (read when the `Accelerator` is made) keeps all three eager.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import warnings
from typing import Callable

import torch

from tpu_backend import random as device_random
from tpu_backend.integrations.own_code import compile_own
from tpu_backend.integrations.post_import import when_imported

logger = logging.getLogger(__name__)
DEVICE_TYPE = "tpu"
BACKEND = "tpu"  # tpu_backend.distributed.process_group.BACKEND_NAME
COMPILE_ENV = "TPU_TRAINER_COMPILE"  # "0": prepared models, optimizers and clipping run eagerly


def _tpu_is_the_accelerator() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == DEVICE_TYPE


def _patch_partial_state(state_module) -> None:
    partial_state = state_module.PartialState
    if getattr(partial_state, "_tpu_aware", False):
        return
    distributed_type = state_module.DistributedType
    vendor_default = partial_state.default_device.fget

    @functools.wraps(vendor_default)
    def default_device(self) -> torch.device:
        device = vendor_default(self)
        return torch.device(DEVICE_TYPE) if device.type == "cpu" and _tpu_is_the_accelerator() else device

    vendor_prepare_backend = partial_state._prepare_backend

    @functools.wraps(vendor_prepare_backend)
    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, mode = vendor_prepare_backend(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if mode == distributed_type.NO and launched and not cpu and _tpu_is_the_accelerator():
            return backend or BACKEND, distributed_type.MULTI_GPU
        return chosen, mode

    vendor_set_device = partial_state.set_device

    @functools.wraps(vendor_set_device)
    def set_device(self):
        if self.device is None and self.backend == BACKEND and not self._cpu:
            self.device = torch.device(DEVICE_TYPE, torch.tpu.current_device())
            return
        vendor_set_device(self)

    partial_state.default_device = property(default_device)
    partial_state._prepare_backend = _prepare_backend
    partial_state.set_device = set_device
    partial_state._tpu_aware = True


def _compiles_step(accelerator) -> bool:
    """Whether this accelerator compiles the model, the optimizer's step and the clipping: on
    the device in one process, unless TPU_TRAINER_COMPILE=0. (`accelerate launch`'s DDP and
    FSDP keep their eager steps: Dynamo cannot trace DDP's hooks over the device's Python
    process group.)"""
    from accelerate.utils import DistributedType

    return (
        accelerator.device.type == DEVICE_TYPE
        and os.environ.get(COMPILE_ENV, "1") != "0"
        and accelerator.distributed_type == DistributedType.NO
    )


def _tpu_backend_for_inductor(accelerator) -> None:
    """Trainer's `torch_compile=True` without a backend asks for inductor, which has no code
    generation for this device: the dynamo plugin gets backend "tpu" instead."""
    from accelerate.utils import DynamoBackend

    plugin = accelerator.state.dynamo_plugin
    if accelerator.device.type == DEVICE_TYPE and plugin is not None and plugin.backend == DynamoBackend.INDUCTOR:
        logger.info("torch.compile on the tpu device: backend 'tpu' instead of 'inductor'")
        plugin.backend = DynamoBackend.TPU


class _CompiledOrEager:
    """`compiled(...)`, or, once it fails to compile (a Dynamo or backend error: an op with no
    lowering, a construct Dynamo cannot trace), `eager(...)` from then on, with one warning
    naming `what` and the error. (A failure after a graph break may leave the first part of
    that one call run twice.)"""

    def __init__(self, compiled, eager, what: str):
        self.compiled, self.eager, self.what = compiled, eager, what

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException as error:
                self.compiled = None
                reason = _first_lines(error)
                warnings.warn(
                    f"accelerate on the tpu device: {self.what} could not be compiled ({type(error).__name__}: "
                    f"{reason}); it runs op by op from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.eager(*args, **kwargs)


def _first_lines(error: Exception, limit: int = 300) -> str:
    """An error's first line, and its "Explanation:" (Dynamo's: the op it failed on)."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith("Explanation:")][:1]
    return " ".join(line if len(line) <= limit else line[:limit] + "..." for line in kept)


def _compile_in_place(module: torch.nn.Module) -> None:
    """`module.compile(backend="tpu")`, as `nn.Module.compile` does it (the module keeps its
    identity, parameter names and state-dict keys: no `_orig_mod.` wrapper as with
    `torch.compile(module)`), under a code object of its own (`own_code`: `Module._call_impl`
    is one code object for every module)."""

    def call(*args, **kwargs):
        return module._call_impl(*args, **kwargs)

    _resolve_loss_function(module)
    compiled = compile_own(call, backend="tpu")
    module._compiled_call_impl = _CompiledOrEager(compiled, module._call_impl, f"the model {type(module).__name__}")


def _resolve_loss_function(module: torch.nn.Module) -> None:
    """Looks up the outermost transformers model's `loss_function` once, eagerly. The lookup
    logs a warning for a model whose class names no loss type (GPT-2's `GPT2LMHeadModel`),
    and a logger call is a graph break: the compiled forward of such a model was two graphs,
    with the logits (batch x sequence x vocabulary) written out between them."""
    modeling = sys.modules.get("transformers.modeling_utils")
    model = next((m for m in module.modules() if modeling and isinstance(m, modeling.PreTrainedModel)), None)
    if model is not None and "_loss_function" not in vars(model):
        model.loss_function = model.loss_function


# A param group's settings while its compiled step traces and runs (then restored): PyTorch's
# foreach update with its step counts on the device (capturable), and the learning rate as a
# tensor. Dynamo does not trace the fused optimizers (torch.optim marks them
# `torch.compiler.disable`: Trainer's default fused AdamW stayed four eager programs a step),
# and a float learning rate that a scheduler changes is a guarded constant of the foreach
# update: one recompile per step.
_TRACED_GROUP_SETTINGS = {"fused": False, "foreach": True, "capturable": True}


@contextlib.contextmanager
def _traced_settings(optimizer):
    """The optimizer's param groups with `_TRACED_GROUP_SETTINGS` and a tensor learning rate
    inside the block, as they were after it."""
    groups = optimizer.param_groups
    saved = [{key: group[key] for key in (*_TRACED_GROUP_SETTINGS, "lr") if key in group} for group in groups]
    rates = {}  # groups with one rate share its tensor: one transfer to the device
    for group in groups:
        group.update({key: value for key, value in _TRACED_GROUP_SETTINGS.items() if key in group})
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = rates.setdefault(group["lr"], torch.tensor(group["lr"], dtype=torch.float32))
    try:
        yield
    finally:
        for group, values in zip(groups, saved):
            group.update(values)
        optimizer._opt_called = True  # what a scheduler's wrapper of step() records


def _step_in_fused_mode(optimizer) -> None:
    """`optimizer.step()` recorded in the fused eager mode and run as one program at its end
    (or one per host read it makes: transformers' Adafactor reads each parameter's RMS);
    op by op in the debug mode, which checks every op."""
    from tpu_backend.eager import modes

    if modes.get_eager_mode() != "strict":
        optimizer.step()
        return
    modes.set_eager_mode("fused")
    try:
        optimizer.step()
    finally:
        modes.set_eager_mode("strict")  # (runs what is pending)


def _compiled_optimizer_step(optimizer) -> Callable[[], None]:
    """`optimizer.step()` as one compiled program, for the optimizers of torch.optim with a
    foreach update (Dynamo follows them: their state made on the first step, any number of
    param groups, a scheduler's learning rates). Any other's step may do what Dynamo cannot
    follow (transformers' Adafactor keeps its step count as a Python int: one recompile per
    step): it runs in the fused eager mode, with a warning."""
    if not (type(optimizer).__module__.startswith("torch.optim.") and "foreach" in optimizer.defaults):
        warnings.warn(
            f"accelerate on the tpu device: the optimizer {type(optimizer).__qualname__} is not one of "
            "torch.optim's with a foreach update, so its step() is not compiled: it runs in the fused eager "
            "mode (its ops recorded and run as one program, or one per value it reads back to the host) while "
            f"the model and the gradient clipping run compiled; {COMPILE_ENV}=0 runs all of them op by op",
            RuntimeWarning,
            stacklevel=4,
        )
        return functools.partial(_step_in_fused_mode, optimizer)
    # The update alone is compiled: torch.optim's wrappers of step() run around it, eagerly.
    # Traced, `_use_grad`'s graph breaks made Dynamo compile the class's own `step` code as a
    # frame of its own, guarded on the optimizer object: a new optimizer was a recompile of
    # code shared by all, and from the 9th in a process (Dynamo's recompile limit: a
    # hyperparameter search, a notebook) the update ran op by op.
    update = inspect.unwrap(type(optimizer).step)  # (not a scheduler's counting wrapper either)

    def optimizer_step():
        update(optimizer)

    compiled = compile_own(optimizer_step, backend="tpu")

    @torch.optim.Optimizer.profile_hook_step  # step() hooks and profiler range, as optimizer.step() runs them
    def with_hooks(self):
        with torch.set_grad_enabled(self.defaults.get("differentiable", False)):
            compiled()

    def traced_step():
        with _traced_settings(optimizer):
            with_hooks(optimizer)

    return _CompiledOrEager(traced_step, optimizer.step, f"the optimizer {type(optimizer).__qualname__}'s step")


@contextlib.contextmanager
def _gradients_added_in_one_program(models):
    """A backward into gradients that hold a sum already (accumulation: Trainer's or
    accelerate's): they are set aside, the backward writes fresh ones, and one
    `_foreach_add_` adds them back. Autograd would add each gradient in a program of its
    own (the tiny Llama's 3-step accumulation launched 66 per-op programs a step). Not
    where a parameter has a post-accumulate-grad hook: it must see the sum."""
    held = [(p, p.grad) for model in models for p in model.parameters() if p.grad is not None]
    if any(p._post_accumulate_grad_hooks for p, _ in held):
        held = []
    for p, _ in held:
        p.grad = None
    try:
        yield
    finally:
        pairs = [(old, p.grad) for p, old in held if p.grad is not None]
        if pairs:
            torch._foreach_add_([old for old, _ in pairs], [new for _, new in pairs])
        for p, old in held:
            p.grad = old


def _compiled_already(module) -> bool:
    """Compiled by accelerate's dynamo plugin (an `OptimizedModule`) or by the user."""
    from accelerate.utils import is_compiled_module

    return is_compiled_module(module) or module._compiled_call_impl is not None


def _is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _clip_grad_norm(parameters, max_norm, norm_type):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)


def _patch_accelerator(accelerator_module) -> None:
    accelerator_class = accelerator_module.Accelerator
    if getattr(accelerator_class, "_tpu_aware", False):
        return
    vendor_prepare_model = accelerator_class.prepare_model

    @functools.wraps(vendor_prepare_model)
    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        if self.device.type != DEVICE_TYPE:
            return vendor_prepare_model(self, model, device_placement, evaluation_mode)
        if self.num_processes == 1:
            prepared = vendor_prepare_model(self, model, device_placement, evaluation_mode)
        else:
            # ACCELERATE_BYPASS_DEVICE_MAP is accelerate's own switch for DDP without device_ids
            with _environ("ACCELERATE_BYPASS_DEVICE_MAP", "true"), _without_find_unused_parameters(self.ddp_handler):
                prepared = vendor_prepare_model(self, model, device_placement, evaluation_mode)
        if self._tpu_compiles_step and not _compiled_already(prepared):
            _compile_in_place(prepared)
        return prepared

    vendor_prepare_optimizer = accelerator_class.prepare_optimizer

    @functools.wraps(vendor_prepare_optimizer)
    def prepare_optimizer(self, optimizer, device_placement=None):
        prepared = vendor_prepare_optimizer(self, optimizer, device_placement)
        if self._tpu_compiles_step and not hasattr(prepared, "_tpu_compiled_step"):
            prepared._tpu_compiled_step = _compiled_optimizer_step(prepared.optimizer)
        return prepared

    vendor_clip_grad_norm = accelerator_class.clip_grad_norm_

    @functools.wraps(vendor_clip_grad_norm)
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        if not self._tpu_compiles_step:
            return vendor_clip_grad_norm(self, parameters, max_norm, norm_type)
        parameters = list(parameters)
        if any(_is_dtensor(p.grad) for p in parameters):
            return vendor_clip_grad_norm(self, parameters, max_norm, norm_type)
        self.unscale_gradients()
        if self._tpu_clip is None:
            self._tpu_clip = _CompiledOrEager(
                compile_own(_clip_grad_norm, backend="tpu"), _clip_grad_norm, "the gradient clipping"
            )
        return self._tpu_clip(parameters, max_norm, norm_type)

    vendor_backward = accelerator_class.backward

    @functools.wraps(vendor_backward)
    def backward(self, loss, **kwargs):
        if not self._tpu_compiles_step or self.scaler is not None or kwargs:
            vendor_backward(self, loss, **kwargs)
            return
        with _gradients_added_in_one_program(self._models):
            if self.gradient_accumulation_steps == 1:
                loss.backward()  # (accelerate would divide the loss by 1: one more program a step)
            else:
                vendor_backward(self, loss)

    vendor_init = accelerator_class.__init__

    @functools.wraps(vendor_init)
    def __init__(self, *args, **kwargs):
        try:
            vendor_init(self, *args, **kwargs)
        except ValueError as error:
            if "fp16 mixed precision requires a device" in str(error) and "'tpu'" in str(error):
                raise ValueError(
                    "fp16 mixed precision (fp16=True, mixed_precision='fp16') is not supported on the tpu "
                    "device: accelerate has no loss scaler for it. Use bf16=True (mixed_precision='bf16'), "
                    "which TPUs compute natively and which needs no loss scaling."
                ) from error
            raise
        self._tpu_compiles_step, self._tpu_clip = _compiles_step(self), None
        _tpu_backend_for_inductor(self)

    accelerator_class.__init__ = __init__
    accelerator_class.prepare_model = prepare_model
    accelerator_class.prepare_optimizer = prepare_optimizer
    accelerator_class.clip_grad_norm_ = clip_grad_norm_
    accelerator_class.backward = backward
    accelerator_class._tpu_aware = True


def _patch_accelerated_optimizer(optimizer_module) -> None:
    """A prepared optimizer's step() runs its compiled program when the accelerator made one
    (`_compiled_optimizer_step`); with a closure (LBFGS), a loss scaler or gradients not yet
    synchronised (accumulation) it keeps accelerate's own path. In fused eager mode an
    optimizer step that updates the parameters ends the step's graph (`fused.mark_step`), as
    torch_xla's `optimizer_step` does: one program a training step."""
    from tpu_backend import fused

    optimizer_class = optimizer_module.AcceleratedOptimizer
    if getattr(optimizer_class, "_tpu_aware", False):
        return
    vendor_step = optimizer_class.step

    @functools.wraps(vendor_step)
    def step(self, closure=None):
        compiled = getattr(self, "_tpu_compiled_step", None)
        if compiled is None or closure is not None or self.scaler is not None or not self.gradient_state.sync_gradients:
            result = vendor_step(self, closure)
        else:
            result = compiled()
        if self.gradient_state.sync_gradients:
            fused.mark_step()  # fused eager mode: the step's ops run as one program (else a no-op)
        return result

    optimizer_class.step = step
    optimizer_class._tpu_aware = True


@contextlib.contextmanager
def _without_find_unused_parameters(ddp_handler):
    """DDP's reducer stages its map of used parameters in pinned host memory for a
    PrivateUse1 device, and PyTorch gives a Python backend no way to register a pinned
    allocator: `find_unused_parameters=True` (Trainer's default for models without
    gradient checkpointing) fails in the first backward. We run DDP without it and say so;
    a model with a parameter the loss does not use then stops with DDP's own error."""
    if ddp_handler is None or not ddp_handler.find_unused_parameters:
        yield
        return
    logger.warning(
        "DDP on the tpu device: find_unused_parameters=True is not available (PyTorch's DDP "
        "reducer needs a pinned host allocator, which a Python device backend cannot register); "
        "running with find_unused_parameters=False. Every parameter must take part in the loss."
    )
    ddp_handler.find_unused_parameters = False
    try:
        yield
    finally:
        ddp_handler.find_unused_parameters = True


@contextlib.contextmanager
def _environ(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _add_dynamo_backend(dataclasses_module) -> None:
    enum_class = dataclasses_module.DynamoBackend
    if "TPU" in enum_class._value2member_map_:
        return
    member = str.__new__(enum_class, "TPU")
    member._name_ = member._value_ = "TPU"
    enum_class._member_map_["TPU"] = enum_class._value2member_map_["TPU"] = member
    enum_class._member_names_.append("TPU")
    type.__setattr__(enum_class, "TPU", member)


def _patch_send_to_device(data_loader_module) -> None:
    """A prepared data loader moves each batch to the device in one transfer, not one per
    tensor (a transfer costs a TPU host ~0.2 ms however small; a Trainer batch holds two or
    three tensors). Batches that are not plain dicts, lists and tuples of tensors
    (a `BatchEncoding` moves itself), and `skip_keys`, keep accelerate's path."""
    vendor_send_to_device = data_loader_module.send_to_device
    if getattr(vendor_send_to_device, "_tpu_aware", False):
        return

    @functools.wraps(vendor_send_to_device)
    def send_to_device(tensor, device, non_blocking=False, skip_keys=None):
        if skip_keys or type(tensor) not in (dict, list, tuple) or torch.device(device).type != DEVICE_TYPE:
            return vendor_send_to_device(tensor, device, non_blocking=non_blocking, skip_keys=skip_keys)
        from tpu_backend import tensor as device_tensor

        return device_tensor.tree_to_device(tensor, lambda leaf: leaf.to(device, non_blocking=non_blocking))

    send_to_device._tpu_aware = True
    data_loader_module.send_to_device = send_to_device


_RNG_STATE_KEY = "torch_tpu_manual_seed"  # (accelerate's names: "torch_cuda_manual_seed", ...)


def _patch_rng_states(accelerator_module) -> None:
    """`Accelerator.save_state` keeps the random states of the CPU and of the accelerators
    accelerate knows (CUDA, XPU, XLA, ...) so that `load_state` resumes the same draws; the
    device's state is kept beside them. Without it a loop resumed on the device drew other
    dropout masks than the one that never stopped."""
    from accelerate import checkpointing

    save, load = accelerator_module.save_accelerator_state, accelerator_module.load_accelerator_state
    if getattr(save, "_tpu_aware", False):
        return

    def states_file(arguments: inspect.BoundArguments, folder: str):
        return os.path.join(
            arguments.arguments[folder], f"{checkpointing.RNG_STATE_NAME}_{arguments.arguments['process_index']}.pkl"
        )

    def on_device() -> bool:
        return accelerator_module.PartialState().device.type == DEVICE_TYPE

    @functools.wraps(save)
    def save_accelerator_state(*args, **kwargs):
        where = save(*args, **kwargs)
        path = states_file(inspect.signature(save).bind(*args, **kwargs), "output_dir")
        if on_device() and os.path.isfile(path):
            device_random.save_into_states_file(path, _RNG_STATE_KEY, checkpointing.load)
        return where

    @functools.wraps(load)
    def load_accelerator_state(*args, **kwargs):
        loaded = load(*args, **kwargs)
        if on_device():
            path = states_file(inspect.signature(load).bind(*args, **kwargs), "input_dir")
            device_random.load_from_states_file(path, _RNG_STATE_KEY, checkpointing.load)
        return loaded

    save_accelerator_state._tpu_aware = True
    accelerator_module.save_accelerator_state = save_accelerator_state
    accelerator_module.load_accelerator_state = load_accelerator_state


def install() -> None:
    when_imported("accelerate.accelerator", _patch_rng_states)
    when_imported("accelerate.utils.dataclasses", _add_dynamo_backend)
    when_imported("accelerate.state", _patch_partial_state)
    when_imported("accelerate.accelerator", _patch_accelerator)
    when_imported("accelerate.optimizer", _patch_accelerated_optimizer)
    when_imported("accelerate.data_loader", _patch_send_to_device)
