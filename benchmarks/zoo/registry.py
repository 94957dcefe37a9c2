"""The zoo's registry: one `ZooEntry` per model, filled by `@zoo_model(...)` in the family files.

This module (like the whole zoo) depends on torch only, never on our `litert_torch` or
`converter` packages: the benchmark's anchor script loads the zoo by file path inside
another environment whose `litert_torch` is the reference converter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

FAMILIES = ("mlp", "cnn", "segmentation", "audio", "image2image", "transformers", "vit", "video", "optical_flow")


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo.

    name: unique key (`--models` filter, pytest id).
    factory: builds the nn.Module (random weights; `build` seeds and prepares it).
    inputs: the sample input shapes, one tuple per positional argument (float32).
    family: one of FAMILIES.
    fast: True for the small subset that runs in the default test suite.
    summary: what the model is and what it exercises (shown by the benchmark).
    known_issue: None, or why the converter cannot handle it yet (the zoo test xfails it).
    make_inputs: None (float32 `torch.randn` of each shape), or a function
        `(generator) -> tuple of tensors` for other inputs (token ids, masks).
    """

    name: str
    factory: Callable[[], nn.Module]
    inputs: tuple[tuple[int, ...], ...]
    family: str
    fast: bool = False
    summary: str = ""
    known_issue: str | None = None
    make_inputs: Callable[[torch.Generator], tuple] | None = None


ZOO: dict[str, ZooEntry] = {}


def zoo_model(
    name: str,
    inputs,
    family: str,
    fast: bool = False,
    known_issue: str | None = None,
    make_inputs: Callable[[torch.Generator], tuple] | None = None,
):
    """Register the decorated factory as zoo model `name`; its docstring's first line
    becomes the entry's summary. `make_inputs(generator)` replaces the float32 randn
    sample inputs (it must return tensors of the shapes in `inputs`)."""
    if family not in FAMILIES:
        raise ValueError(f"zoo model {name!r}: family {family!r} is not one of {FAMILIES}")
    shapes = tuple(tuple(int(d) for d in shape) for shape in inputs)

    def register(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} is registered twice")
        summary = (factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else ""
        ZOO[name] = ZooEntry(name, factory, shapes, family, fast, summary, known_issue, make_inputs)
        return factory

    return register


def entries(names=None, fast: bool | None = None) -> list[ZooEntry]:
    """Zoo entries in registration order, optionally only those in `names` (unknown names
    raise, listing the valid ones) and/or only the fast (True) or slow (False) ones."""
    if names is not None:
        unknown = [n for n in names if n not in ZOO]
        if unknown:
            raise KeyError(f"unknown zoo model(s) {unknown}; known: {', '.join(ZOO)}")
    return [e for e in ZOO.values() if (names is None or e.name in names) and (fast is None or e.fast == fast)]


def randomize_norm_statistics(model: nn.Module, generator: torch.Generator) -> None:
    """Give every batch norm non-trivial running statistics and affine parameters.

    Freshly built batch norms are identities in eval mode (mean 0, var 1, weight 1,
    bias 0), which would let a wrong batch-norm folding pass go unnoticed.
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=generator) * 0.1)


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The zoo model `name` in eval mode with seeded random weights, and its sample inputs.

    The same name and seed give the same weights and inputs in any process with the same
    torch version (the benchmark relies on it to compare converters on equal models).
    """
    entry = ZOO.get(name)
    if entry is None:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    torch.manual_seed(seed)
    model = entry.factory().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    randomize_norm_statistics(model, generator)
    if entry.make_inputs is not None:
        args = tuple(entry.make_inputs(generator))
    else:
        args = tuple(torch.randn(shape, generator=generator) for shape in entry.inputs)
    return model, args
