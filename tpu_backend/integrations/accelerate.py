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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch

from tpu_backend.integrations.post_import import when_imported

logger = logging.getLogger(__name__)
DEVICE_TYPE = "tpu"
BACKEND = "tpu"  # tpu_backend.distributed.process_group.BACKEND_NAME


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


def _patch_prepare_model(accelerator_module) -> None:
    accelerator_class = accelerator_module.Accelerator
    if getattr(accelerator_class, "_tpu_aware", False):
        return
    vendor_prepare_model = accelerator_class.prepare_model

    @functools.wraps(vendor_prepare_model)
    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        if self.device.type != DEVICE_TYPE or self.num_processes == 1:
            return vendor_prepare_model(self, model, device_placement, evaluation_mode)
        # ACCELERATE_BYPASS_DEVICE_MAP is accelerate's own switch for DDP without device_ids
        with _environ("ACCELERATE_BYPASS_DEVICE_MAP", "true"), _without_find_unused_parameters(self.ddp_handler):
            return vendor_prepare_model(self, model, device_placement, evaluation_mode)

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

    accelerator_class.__init__ = __init__
    accelerator_class.prepare_model = prepare_model
    accelerator_class._tpu_aware = True


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


def install() -> None:
    when_imported("accelerate.utils.dataclasses", _add_dynamo_backend)
    when_imported("accelerate.state", _patch_partial_state)
    when_imported("accelerate.accelerator", _patch_prepare_model)
