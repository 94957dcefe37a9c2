"""Factories the CLI tests convert (`tests.litert_torch.cli_models:NAME`)."""

import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def build():
    torch.manual_seed(0)
    return Small()


def build_with_args():
    return build(), (torch.randn(2, 6),)


def not_a_module():
    return 42


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x)


def build_unsupported():
    return Unsupported(), (torch.randn(3),)


class Deep(torch.nn.Module):
    """Ten Linear layers: a float model a microcontroller check reports op by op."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(10)])

    def forward(self, x):
        return self.layers(x)


def build_deep():
    torch.manual_seed(0)
    return Deep(), (torch.randn(1, 6),)
