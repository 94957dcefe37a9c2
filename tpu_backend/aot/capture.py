"""A training step as ONE ATen graph, traced on fake tensors: no weight is ever allocated.

The step is the one `torch.compile(backend="tpu")` compiles into one program per step
(docs/architecture.md, "One program per training step"; `tests.tpu_backend.models.
functional_train_step`): gradients by `torch.func.grad_and_value` of a `functional_call`,
then PyTorch's own foreach optimizer update (`torch.optim.adamw.adamw` with
`capturable=True`, or `torch.optim.sgd.sgd`). Here the parameters and the optimizer
state are the step's arguments instead of closed-over tensors, so the graph can be
traced with fake "tpu" tensors of any size (an 8B model costs no memory) and its
arguments given shardings.

`make_fx` traces it through the device's own dispatch (the kernel routers of
`tpu_backend.kernels`, the backend's decompositions) and `functionalize` turns the
optimizer's in-place writes into `copy_` nodes, which `lift_input_mutations` (the
backend's) makes trailing outputs: the same graph form `compile_for_tpu` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call, functionalize, grad_and_value
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_backend.compile.backend import decompositions, lift_input_mutations

OPTIMIZERS = ("adamw", "sgd")

# What each argument of the step is; `role` decides its sharding (plan.py).
PARAM, EXP_AVG, EXP_AVG_SQ, MOMENTUM, STEP_COUNT, BUFFER, BATCH = (
    "parameter",
    "exp_avg",
    "exp_avg_sq",
    "momentum",
    "step",
    "buffer",
    "batch",
)


@dataclass(frozen=True)
class StepInput:
    """One argument of the traced step: `name` (a parameter's or buffer's name, or
    `inputs[i]`/`targets[i]`), its role, shape and dtype; `of` names the parameter an
    optimizer state belongs to."""

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    of: str | None = None

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * self.dtype.itemsize


@dataclass
class StepGraph:
    """The traced step: `gm` takes `inputs` in order and returns the loss, then the new
    value of each input in `written` (placeholder indices: parameters, optimizer state)."""

    gm: torch.fx.GraphModule
    inputs: list[StepInput]
    written: list[int]


def _spec(value) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of a tensor (any device, meta included) or of a `(shape, dtype)` pair."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    shape, dtype = value
    return tuple(int(d) for d in shape), dtype


def step_inputs(model: nn.Module, inputs: Sequence, targets: Sequence, optimizer: str) -> list[StepInput]:
    """The step's arguments in order: parameters, optimizer state, buffers, the batch."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    params = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters: nothing to train")
    out = [StepInput(n, PARAM, s, d) for n, s, d in params]
    roles = (EXP_AVG, EXP_AVG_SQ) if optimizer == "adamw" else (MOMENTUM,)
    for role in roles:
        out += [StepInput(f"{n}.{role}", role, s, d, of=n) for n, s, d in params]
    if optimizer == "adamw":
        out += [StepInput(f"{n}.step", STEP_COUNT, (), torch.float32, of=n) for n, _, _ in params]
    out += [StepInput(n, BUFFER, tuple(b.shape), b.dtype) for n, b in model.named_buffers()]
    for kind, values in (("inputs", inputs), ("targets", targets)):
        for i, value in enumerate(values):
            out.append(StepInput(f"{kind}[{i}]", BATCH, *_spec(value)))
    return out


def functional_step(
    model: nn.Module, loss: Callable, specs: list[StepInput], n_inputs: int, optimizer: str, lr: float = 1e-3
) -> Callable:
    """`step(*arrays) -> (loss,)` over `specs`' arguments; writes parameters and optimizer
    state in place (the form `compiled_train_step` compiles)."""
    from torch.optim.adamw import adamw
    from torch.optim.sgd import sgd

    names = [s.name for s in specs if s.role == PARAM]
    n = len(names)
    n_buffers = sum(s.role == BUFFER for s in specs)

    def step(*args):
        args = list(args)
        params, args = args[:n], args[n:]
        if optimizer == "adamw":
            exp_avgs, exp_avg_sqs, counts, args = args[:n], args[n : 2 * n], args[2 * n : 3 * n], args[3 * n :]
        else:
            momenta, args = args[:n], args[n:]
        buffer_values, batch = args[:n_buffers], args[n_buffers:]
        buffers = dict(zip([s.name for s in specs if s.role == BUFFER], buffer_values))
        model_inputs, targets = batch[:n_inputs], batch[n_inputs:]

        def loss_of(named):
            return loss(functional_call(model, {**named, **buffers}, tuple(model_inputs)), *targets)

        grads, value = grad_and_value(loss_of)(dict(zip(names, params)))
        grads = [grads[name] for name in names]
        with torch.no_grad():
            if optimizer == "adamw":
                adamw(
                    params,
                    grads,
                    exp_avgs,
                    exp_avg_sqs,
                    [],
                    counts,
                    foreach=True,
                    capturable=True,
                    lr=lr,
                    beta1=0.9,
                    beta2=0.999,
                    weight_decay=0.01,
                    eps=1e-8,
                    amsgrad=False,
                    maximize=False,
                )
            else:
                sgd(
                    params,
                    grads,
                    momenta,
                    foreach=True,
                    lr=lr,
                    momentum=0.9,
                    weight_decay=0.0,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                )
        return (value.detach(),)

    return step


def trace_step(
    model: nn.Module, inputs: Sequence, targets: Sequence, loss: Callable, optimizer: str = "adamw"
) -> StepGraph:
    """Trace one training step of `model` (parameters on any device; build big models on
    `torch.device("meta")`) on fake "tpu" tensors of the shapes of `inputs` (what the model
    takes) and `targets` (what `loss(output, *targets)` takes after the output); tensors
    or `(shape, dtype)` pairs."""
    import tpu_backend  # noqa: F401 - registers the device the fake tensors claim

    specs = step_inputs(model, inputs, targets, optimizer)
    step = functional_step(model, loss, specs, len(inputs), optimizer)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(s.shape, dtype=s.dtype, device="tpu") for s in specs]
        try:
            gm = make_fx(
                functionalize(step, remove="mutations_and_views"),
                decomposition_table=decompositions(),
                tracing_mode="real",
            )(*fakes)
        except RuntimeError as error:
            if "saved tensor hooks" in str(error):
                raise NotImplementedError(
                    "tpu_backend.aot: activation checkpointing (torch.utils.checkpoint, checkpoint_wrapper) cannot "
                    "be traced inside torch.func's gradient yet (it refuses saved-tensor hooks); plan the model "
                    "without it: libtpu's compiler rematerialises on its own when HBM runs short"
                ) from error
            if "functorch transforms" in str(error) and "setup_context" in str(error):
                raise NotImplementedError(
                    "tpu_backend.aot: a Pallas kernel's autograd rule cannot run inside torch.func's gradient yet; "
                    "plan with the kernels off (TPU_KERNELS=off, --kernels off, kernels=False)"
                ) from error
            raise
    written = lift_input_mutations(gm)
    return StepGraph(gm, specs, written)
