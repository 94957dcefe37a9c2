"""Comparing a training run on the device with the same run on CPU: losses, the gradients
after step 1 and the parameters after the last step.

Losses alone miss errors that the optimizer hides (Adam divides a gradient's scale out)
or that cancel in one scalar; gradients and parameters do not.

    cpu_run = record_training(cpu_model, step, batches)
    device_run = record_training(device_model, step, device_batches)
    assert_runs_match(device_run, cpu_run)

Tensors are compared per parameter, norm-relative:

    ||got - want|| <= rtol * ||want|| + floor

computed in float64. The absolute `floor` is for gradients that are zero in exact
arithmetic (a conv bias followed by batch norm, the key part of an attention's input
bias): in float32 they are rounding noise (~1e-9 per element) on both sides, which no
relative tolerance can compare. Parameter elements whose step-1 gradient on CPU is such
noise are compared apart, within an absolute bound, because Adam rescales noise to a
full-size step (the sign of the noise decides which way they move); the rest of each
parameter is compared norm-relative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

GRADIENT_RTOL = 1e-4
PARAMETER_RTOL = 1e-4
LOSS_RTOL = 1e-4
ZERO_GRADIENT_FLOOR = 1e-6  # norm of a gradient that is zero in exact arithmetic, in float32
NOISE_GRADIENT = 1e-7  # a gradient element at most this large may be rounding noise of zero
NOISE_PARAMETER_BOUND = 0.1  # max |got - want| of parameter elements moved only by noise (Adam: <= 2*lr*steps)


def norm_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (infinite when want is zero and got is not)."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    difference = torch.linalg.vector_norm(got - want).item()
    scale = torch.linalg.vector_norm(want).item()
    return difference / scale if scale else (0.0 if difference == 0 else float("inf"))


def tensor_mismatches(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, rtol: float, floor: float | dict[str, float]
) -> list[str]:
    """One line per tensor outside `||got - want|| <= rtol * ||want|| + floor` (empty if none)."""
    problems = []
    if got.keys() != want.keys():
        return [
            f"different tensors: only in got {sorted(got.keys() - want.keys())}, "
            f"only in want {sorted(want.keys() - got.keys())}"
        ]
    for name, expected in want.items():
        actual = got[name]
        if actual is None or expected is None:
            if (actual is None) != (expected is None):
                problems.append(
                    f"{name}: {'no' if actual is None else 'a'} gradient, reference has "
                    f"{'none' if expected is None else 'one'}"
                )
            continue
        if actual.shape != expected.shape:
            problems.append(f"{name}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}")
            continue
        a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
        difference = torch.linalg.vector_norm(a - e).item()
        scale = torch.linalg.vector_norm(e).item()
        allowed = rtol * scale + (floor[name] if isinstance(floor, dict) else floor)
        if not difference <= allowed:  # NaN fails too
            problems.append(
                f"{name}: ||got - want|| = {difference:.3g} > {allowed:.3g} "
                f"(||want|| = {scale:.3g}, ||got|| = {torch.linalg.vector_norm(a).item():.3g}, "
                f"relative {difference / max(scale, 1e-300):.2e})"
            )
    return problems


def assert_tensors_match(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    what: str,
    *,
    rtol: float,
    floor: float | dict[str, float] = 0.0,
) -> None:
    problems = tensor_mismatches(got, want, rtol=rtol, floor=floor)
    assert not problems, f"{what}: {len(problems)} of {len(want)} tensors differ:\n  " + "\n  ".join(problems)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)  # torch.compile's wrapper prefixes every name


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    model = _unwrapped(model)
    return {name: None if p.grad is None else p.grad.detach().cpu().clone() for name, p in model.named_parameters()}


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    model = _unwrapped(model)
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters()}


@dataclass
class TrainingRun:
    losses: list[float]
    first_gradients: dict[str, torch.Tensor | None]  # after step 1's backward (and optimizer step)
    final_parameters: dict[str, torch.Tensor] = field(default_factory=dict)


def record_training(
    model: torch.nn.Module,
    step: Callable[[object, object], torch.Tensor | float],
    batches,
    on_step: Callable[[int], None] | None = None,
) -> TrainingRun:
    """Run `step(inputs, target) -> loss` (a tensor or a float) over `batches` (already on the model's device);
    `step` must leave the step's gradients in `.grad` (i.e. zero them before backward).
    `on_step(i)` runs before step i (e.g. to enter a cache-only guard)."""
    losses, first_gradients = [], {}
    for i, (inputs, target) in enumerate(batches):
        if on_step is not None:
            on_step(i)
        loss = step(inputs, target)
        losses.append(loss if isinstance(loss, float) else loss.item())
        if i == 0:
            first_gradients = gradients(model)
    return TrainingRun(losses, first_gradients, parameters(model))


def language_model_step(forward: Callable, optimizer: torch.optim.Optimizer) -> Callable:
    """A Hugging Face language model's training step for `record_training`:
    `step(input_ids, labels) -> loss` through `forward` (the model, or it compiled)."""

    def step(input_ids, labels):
        optimizer.zero_grad()
        loss = forward(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        return loss

    return step


def noise_masks(first_gradients: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """Per parameter, the elements whose step-1 gradient may be rounding noise of zero."""
    return {name: g.abs() <= NOISE_GRADIENT for name, g in first_gradients.items() if g is not None}


def assert_parameters_match(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    want_first_gradients: dict[str, torch.Tensor | None],
    what: str,
    *,
    rtol: float = PARAMETER_RTOL,
) -> None:
    """Norm-relative, except elements moved only by gradient noise (within an absolute bound)."""
    noise = noise_masks(want_first_gradients)

    def signal(parameters):
        return {name: p.masked_fill(noise[name], 0) if name in noise else p for name, p in parameters.items()}

    assert_tensors_match(signal(got), signal(want), what, rtol=rtol)
    for name, mask in noise.items():
        if mask.any() and name in got:
            worst = (got[name][mask] - want[name][mask]).abs().max().item()
            assert worst <= NOISE_PARAMETER_BOUND, (
                f"{what}: {name}: elements moved by gradient noise only differ by {worst:.3g} > {NOISE_PARAMETER_BOUND}"
            )


def assert_losses_match(got: list[float], want: list[float], what: str, rtol: float = LOSS_RTOL) -> None:
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        relative = abs(a - b) / max(abs(b), 1e-12)
        assert relative <= rtol, (
            f"{what}: step {step + 1}: loss {a:.8g} vs {b:.8g} on cpu (relative "
            f"{relative:.2e} > {rtol:.0e})\ngot: {got}\ncpu: {want}"
        )


def assert_runs_match(
    got: TrainingRun,
    want: TrainingRun,
    what: str,
    *,
    loss_rtol: float = LOSS_RTOL,
    gradient_rtol: float = GRADIENT_RTOL,
    parameter_rtol: float = PARAMETER_RTOL,
) -> None:
    """Losses at every step, gradients after step 1, parameters after the last step."""
    assert_losses_match(got.losses, want.losses, what, loss_rtol)
    assert_tensors_match(
        got.first_gradients,
        want.first_gradients,
        f"{what}: gradients after step 1",
        rtol=gradient_rtol,
        floor=ZERO_GRADIENT_FLOOR,
    )
    assert_parameters_match(
        got.final_parameters,
        want.final_parameters,
        want.first_gradients,
        f"{what}: parameters after step {len(want.losses)}",
        rtol=parameter_rtol,
    )
