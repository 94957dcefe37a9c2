"""Models shared by the compile tests (CPU and device)."""

from __future__ import annotations

import torch
from torch import nn


class ChattyModel(nn.Module):
    """A forward with two graph breaks: a print and a `.item()` that steers Python control flow."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.first(x))
        print("hidden mean computed")
        if h.mean().item() > 0:  # data-dependent branch: Dynamo breaks the graph here
            h = h * 2
        return self.second(h)
