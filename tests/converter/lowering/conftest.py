"""Shared fixtures for the lowering tests: `Fn` wraps a function as an nn.Module."""

from __future__ import annotations

import torch


class Fn(torch.nn.Module):
    """A module whose forward is `fn` (tests convert single ops written as lambdas)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
