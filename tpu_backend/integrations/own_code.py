"""`compile_own(fn, **options)`: `torch.compile` of `fn` under a code object of its own.

Dynamo keeps its compiled graphs, and counts recompiles, per code object. A function that an
integration builds for each model or optimizer from one template shares that template's
code: once the instances seen in a process passed Dynamo's recompile limit (8), every later
one ran eagerly (seen with transformers' compiled decode call after 8 models had sampled).
A copy of the code object gives each instance its own cache and its own limit."""

from __future__ import annotations

import types

import torch


def compile_own(fn, **options):
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return torch.compile(own, **options)
