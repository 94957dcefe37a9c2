"""`compile_own(fn, **options)`: `torch.compile` of `fn` under a code object of its own.

Dynamo keeps its compiled graphs, and counts recompiles, per code object. A function that an
integration builds for each model or optimizer from one template shares that template's
code: once the instances seen in a process passed Dynamo's recompile limit (8), every later
one ran eagerly (seen with transformers' compiled decode call after 8 models had sampled).
A copy of the code object gives each instance its own cache and its own limit.

Dynamo also remembers which input sizes changed between calls ("automatic dynamic shapes")
per code *name and line*, not per code object. Each copy is therefore named apart
(`call_3`): a second model trained in the process would otherwise start with the sizes
that differed from the first one's (its labels, all of its optimizer's parameters)
compiled as symbolic."""

from __future__ import annotations

import itertools
import types

import torch

_copies = itertools.count(1)


def compile_own(fn, **options):
    n = next(_copies)
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{n}", co_qualname=f"{fn.__code__.co_qualname}_{n}")
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return torch.compile(own, **options)
