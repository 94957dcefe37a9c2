"""A training step as ATen graphs traced on fake tensors: no weight is ever allocated.

The step is the one `torch.compile(backend="tpu")` compiles into one program per step
(docs/design/device.md, "One program per training step"; `benchmarks.models.
functional_train_step`, `functional_step` below): the loss and its gradients, then
PyTorch's own foreach optimizer update (`torch.optim.adamw.adamw` with `capturable=True`,
or `torch.optim.sgd.sgd`) writing parameters and optimizer state in place. It is traced in
two graphs over fake "tpu" tensors of any size (an 8B model costs no memory):

- the joint forward + backward graph, by AOTAutograd itself (`aot_export_module`, as
  `torch.compile` builds it), through the device's dispatch: its kernel routers (the
  Pallas kernels' own autograd rules), the backend's decompositions;
- the optimizer update, by `make_fx` of the functionalized update; its writes become
  trailing outputs (the interpreter's `lift_input_mutations`).

`StepGraph.function()` runs both through the device's FX -> JAX interpreter as ONE
function of (parameters, optimizer state, buffers, batch).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence
from unittest import mock

import torch
import torch.fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call, functionalize, grad_and_value
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_backend.aot.remat import checkpointed_blocks
from tpu_backend.compile.backend import decompositions
from tpu_backend.compile.interpreter import lift_input_mutations
from tpu_backend.kernels import UpcastInsideCrossEntropy

OPTIMIZERS = ("adamw", "sgd")

# What each argument of the step is; `role` decides its sharding (plan.py).
PARAM, EXP_AVG, EXP_AVG_SQ, MOMENTUM, STEP_COUNT, LR, BUFFER, BATCH = (
    "parameter",
    "exp_avg",
    "exp_avg_sq",
    "momentum",
    "step",
    "lr",
    "buffer",
    "batch",
)
# torch.optim's defaults where the plan does not say (AdamW's weight decay is its own 0.01)
SETTINGS = {
    "adamw": dict(betas=(0.9, 0.999), weight_decay=0.01, eps=1e-8, maximize=False),
    "sgd": dict(momentum=0.9, weight_decay=0.0, dampening=0.0, nesterov=False, maximize=False),
}


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
    """The traced step. `joint`: (parameters, buffers, batch) -> (loss, *gradients);
    `update`: (parameters, gradients, *optimizer state) -> the new value of each of its
    inputs in `update_written`. `written`: the step's inputs (indices into `inputs`) the
    step writes, in the order `function()` returns their new values after the loss."""

    joint: torch.fx.GraphModule
    update: torch.fx.GraphModule
    inputs: list[StepInput]
    update_written: list[int]
    # the step's parameter each of the joint graph's parameter inputs reads: a tied weight
    # (GPT-2's head is its embedding) is one parameter of the step and two of the joint graph,
    # whose two gradients add up; None: one for one
    sources: list[int] | None = None

    @property
    def written(self) -> list[int]:
        n = sum(s.role == PARAM for s in self.inputs)
        # update placeholders: params [0, n), gradients [n, 2n), state [2n, ...); the step's
        # inputs: params [0, n), state [n, ...)
        return [i if i < n else i - n for i in self.update_written]

    @property
    def nodes(self) -> int:
        return len(self.joint.graph.nodes) + len(self.update.graph.nodes)

    @functools.cached_property
    def needs_rng(self) -> bool:
        """The step draws random numbers (dropout): `function()` then takes a `jax.random`
        key first."""
        from tpu_backend.compile.interpreter import GraphFunction

        return GraphFunction(self.joint, "aot_forward_backward").needs_rng

    def function(self, gathered: Callable | None = None, reduced: Callable | None = None) -> Callable:
        """`fn(*arrays) -> (loss, *new values of written inputs)` over `inputs`, in JAX
        (`fn(key, *arrays)` when the step `needs_rng`: each call's dropout masks from `key`).
        `gathered(params)`: the parameters as the forward and backward use them (FSDP: each
        gathered from its shards); `reduced(grads)`: the gradients as the update takes them."""
        from tpu_backend.compile.interpreter import GraphFunction

        joint, update = GraphFunction(self.joint, "aot_forward_backward"), GraphFunction(self.update, "aot_update")
        n = sum(s.role == PARAM for s in self.inputs)
        n_state = sum(s.role not in (PARAM, BUFFER, BATCH) for s in self.inputs)

        def step(*arrays):
            key = None
            if joint.needs_rng:
                key, *arrays = arrays
            params, state, rest = arrays[:n], arrays[n : n + n_state], arrays[n + n_state :]
            used = gathered(params) if gathered else params
            if self.sources is not None:
                used = [used[i] for i in self.sources]
            loss, *grads = joint.run([*used, *rest], key)[1]
            if self.sources is not None:  # a tied weight's gradients add up
                total = [None] * n
                for i, g in zip(self.sources, grads):
                    total[i] = g if total[i] is None else total[i] + g
                grads = total
            return (loss, *update(*params, *(reduced(grads) if reduced else grads), *state))

        return step


def _spec(value) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of a tensor (any device, meta included) or of a `(shape, dtype)` pair."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    shape, dtype = value
    return tuple(int(d) for d in shape), dtype


def step_inputs(model: nn.Module, inputs: Sequence, targets: Sequence, optimizer: str) -> list[StepInput]:
    """The step's arguments in order: parameters, optimizer state (the learning rate last, a
    float32 scalar: a scheduler changes it without a new program), buffers, the batch."""
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
    out.append(StepInput("lr", LR, (), torch.float32))
    out += [StepInput(n, BUFFER, tuple(b.shape), b.dtype) for n, b in model.named_buffers()]
    for kind, values in (("inputs", inputs), ("targets", targets)):
        for i, value in enumerate(values):
            out.append(StepInput(f"{kind}[{i}]", BATCH, *_spec(value)))
    return out


def functional_update(optimizer: str, n: int, settings: dict | None = None) -> Callable:
    """`update(*params, *grads, *state)`: PyTorch's foreach AdamW (`capturable=True`; state:
    exp_avgs, exp_avg_sqs, step counts, lr) or SGD (state: momenta, lr), in place. `settings`:
    the optimizer's other hyperparameters (`SETTINGS` for what is not given)."""
    from torch.optim.adamw import adamw
    from torch.optim.sgd import sgd

    options = {**SETTINGS[optimizer], **(settings or {})}

    def update(*args):
        params, grads, state = list(args[:n]), list(args[n : 2 * n]), args[2 * n :]
        lr = state[-1]
        with torch.no_grad():
            if optimizer == "adamw":
                exp_avgs, exp_avg_sqs, counts = (list(state[i * n : (i + 1) * n]) for i in range(3))
                beta1, beta2 = options["betas"]
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
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=options["weight_decay"],
                    eps=options["eps"],
                    amsgrad=False,
                    maximize=options["maximize"],
                )
            else:
                sgd(params, grads, list(state[:n]), foreach=True, lr=lr, **options)

    return update


def functional_step(
    model: nn.Module, loss: Callable, specs: list[StepInput], n_inputs: int, optimizer: str
) -> Callable:
    """`step(*arrays) -> (loss,)` over `specs`' arguments, writing parameters and optimizer
    state in place: the form `torch.compile(backend="tpu")` compiles into one program
    (`compiled_train_step`); the chip and cross checks run the device's own path with it."""
    names = [s.name for s in specs if s.role == PARAM]
    n = len(names)
    n_state = sum(s.role not in (PARAM, BUFFER, BATCH) for s in specs)
    buffer_names = [s.name for s in specs if s.role == BUFFER]
    update = functional_update(optimizer, n)

    def step(*args):
        params, state, rest = args[:n], args[n : n + n_state], args[n + n_state :]
        buffers = dict(zip(buffer_names, rest[: len(buffer_names)]))
        batch = rest[len(buffer_names) :]
        model_inputs, targets = batch[:n_inputs], batch[n_inputs:]

        def loss_of(named):
            return loss(functional_call(model, {**named, **buffers}, tuple(model_inputs)), *targets)

        grads, value = grad_and_value(loss_of)(dict(zip(names, params)))
        update(*params, *[grads[name] for name in names], *state)
        return (value.detach(),)

    return step


def trace_step(
    model: nn.Module,
    inputs: Sequence,
    targets: Sequence,
    loss: Callable,
    optimizer: str = "adamw",
    remat: str = "none",
    settings: dict | None = None,
) -> StepGraph:
    """Trace one training step of `model` (parameters on any device; build big models on
    `torch.device("meta")`) on fake "tpu" tensors of the shapes of `inputs` (what the model
    takes) and `targets` (what `loss(output, *targets)` takes after the output); tensors
    or `(shape, dtype)` pairs. `remat`: the activation checkpointing of the model's
    repeated blocks, "none", "full" or "matmuls" (`remat.py`). `settings`: the optimizer's
    hyperparameters other than the learning rate (`SETTINGS`)."""

    specs = step_inputs(model, inputs, targets, optimizer)
    n = sum(s.role == PARAM for s in specs)
    mode = FakeTensorMode()
    with mode:
        fake = {s.name: torch.empty(s.shape, dtype=s.dtype, device="tpu") for s in specs}
    with mode, checkpointed_blocks(model, remat) as checkpointed:
        joint, sources = _trace_joint(model, loss, specs, fake, len(inputs), checkpointed=bool(checkpointed))
    states = [s for s in specs if s.role not in (PARAM, BUFFER, BATCH)]
    update = functional_update(optimizer, n, settings)

    def update_step(*args):
        update(*args)
        return ()  # its results are its writes (lifted to outputs below)

    with mode:
        grads = [torch.empty(s.shape, dtype=s.dtype, device="tpu") for s in specs[:n]]
        args = [fake[s.name] for s in specs[:n]] + grads + [fake[s.name] for s in states]
        with _as_torch_compile():  # SGD's eager path reads a tensor learning rate as `alpha=-lr`
            traced = make_fx(
                functionalize(update_step, remove="mutations_and_views"), decomposition_table=decompositions()
            )
            gm = traced(*args)
    written = lift_input_mutations(gm)
    step = StepGraph(joint, gm, specs, written, sources)
    if checkpointed and step.needs_rng:
        raise NotImplementedError(
            f"remat={remat!r} with dropout (or another random op) in the step: a recomputed block would draw new "
            "masks. Set the model's dropout to 0 for training with remat, or use remat='none'"
        )
    return step


class _WithLoss(nn.Module):
    """The model and its loss as one module returning `(loss,)` (what `aot_export_module`
    differentiates); parameter and buffer names gain the prefix `model.`."""

    def __init__(self, model: nn.Module, loss: Callable, n_inputs: int):
        super().__init__()
        self.model = model
        self.loss = loss
        self.n_inputs = n_inputs

    def forward(self, *batch):
        return (self.loss(self.model(*batch[: self.n_inputs]), *batch[self.n_inputs :]),)


def _as_torch_compile():
    """Libraries take the code paths they take under `torch.compile` (which traces with
    AOTAutograd too): no host reads of traced values (transformers' packed-sequence check
    in its masks, SGD's `alpha=-lr` of a tensor learning rate)."""
    return mock.patch("torch.compiler.is_compiling", return_value=True)


@contextlib.contextmanager
def _checkpoint_calls():
    """Counts the model's own (non-reentrant) `torch.utils.checkpoint` calls in the block."""
    import torch.utils.checkpoint as checkpoint_module

    calls = []
    generator = checkpoint_module._checkpoint_without_reentrant_generator

    def counted(*args, **kwargs):
        calls.append(1)
        return generator(*args, **kwargs)

    with mock.patch.object(checkpoint_module, "_checkpoint_without_reentrant_generator", counted):
        yield calls


def _trace_joint(
    model: nn.Module, loss: Callable, specs: list[StepInput], fake: dict, n_inputs: int, checkpointed: bool = False
):
    """AOTAutograd's joint graph of `loss(model(inputs), *targets)` with the module's
    parameters and buffers swapped for fake "tpu" tensors (restored after), and
    `StepGraph.sources` (tied weights). `checkpointed`: the trace checkpoints the model's
    blocks (`remat.py`), so the model's own `torch.utils.checkpoint` calls need no warning."""
    from torch._functorch.aot_autograd import aot_export_module

    wrapper = _WithLoss(model, loss, n_inputs)
    swapped = {}  # id(real tensor) -> (its fake stand-in, its spec's name)
    for spec in specs:
        if spec.role in (PARAM, BUFFER):
            owner_name, _, attr = spec.name.rpartition(".")
            owner = model.get_submodule(owner_name)
            real = (owner._parameters if spec.role == PARAM else owner._buffers)[attr]
            stand_in = nn.Parameter(fake[spec.name]) if spec.role == PARAM else fake[spec.name]
            swapped[id(real)] = (stand_in, spec.name)
    saved, seen, tied = [], set(), {}  # tied: joint parameter name -> the step parameter it is
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table in (module._parameters, module._buffers):
            for attr, value in table.items():
                if id(value) not in swapped:
                    continue
                stand_in, name = swapped[id(value)]
                saved.append((table, attr, value))
                if id(value) in seen and isinstance(stand_in, nn.Parameter):
                    # aot_export_module refuses a parameter held twice: the second holder gets its own
                    stand_in = nn.Parameter(torch.empty_like(stand_in))
                    tied[f"model.{prefix}.{attr}" if prefix else f"model.{attr}"] = name
                seen.add(id(value))
                table[attr] = stand_in
    try:
        batch = [fake[s.name] for s in specs if s.role == BATCH]
        with UpcastInsideCrossEntropy(), _checkpoint_calls() as checkpoints, _as_torch_compile():
            gm, signature = aot_export_module(
                wrapper, batch, trace_joint=True, output_loss_index=0, decompositions=decompositions()
            )
    except AssertionError as error:
        if "did not receive a gradient" not in str(error):
            raise
        raise ValueError(
            "a trainable parameter gets no gradient from the loss. Freeze it (requires_grad=False) or, if the "
            "model calls torch.utils.checkpoint(..., use_reentrant=True), use use_reentrant=False or leave the "
            "checkpointing to remat='full' (the one-program step cannot trace a reentrant checkpoint)"
        ) from error
    finally:
        for table, attr, value in saved:
            table[attr] = value
    if checkpoints and not checkpointed:
        warnings.warn(
            "the model calls torch.utils.checkpoint, which a one-program step does not see "
            "(AOTAutograd's joint trace keeps every activation): pass remat='full' or 'matmuls' for checkpointing",
            stacklevel=3,
        )
    names = [s.name for s in specs if s.role == PARAM]
    index = {f"model.{name}": i for i, name in enumerate(names)}
    index.update({joint_name: names.index(name) for joint_name, name in tied.items()})
    if [p for p in signature.parameters if p not in index] or len(set(signature.parameters)) < len(names):
        raise NotImplementedError(  # e.g. frozen parameters (requires_grad=False)
            "tpu_backend.aot: every parameter must be trained (requires_grad=True); AOTAutograd's parameters "
            f"{len(signature.parameters)}, trainable {len(names)}"
        )
    sources = [index[p] for p in signature.parameters]
    return gm, (None if sources == list(range(len(names))) else sources)


def adamw_device_step(model, step: dict):
    """The device's own compiled step for `model` (real weights on "tpu"), the step
    `trace_step` plans with AdamW: `run(inputs, targets) -> (loss,)`, the parameters and
    AdamW state updated in place. For checking a plan against what the device runs."""
    specs = step_inputs(model, step["inputs"], step["targets"], "adamw")
    params = [p for _, p in model.named_parameters()]
    state = [torch.zeros_like(p) for p in params] + [torch.zeros_like(p) for p in params]
    counts = [torch.zeros((), device="tpu") for _ in params]
    lr = torch.tensor(1e-3, device="tpu")
    buffers = [b for _, b in model.named_buffers()]
    compiled = torch.compile(functional_step(model, step["loss"], specs, 1, "adamw"), backend="tpu")
    return lambda inputs, targets: compiled(*params, *state, *counts, lr, *buffers, inputs, targets)
