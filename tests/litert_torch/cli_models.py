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


class ZeroInitResidual(torch.nn.Module):
    """Two residual conv blocks whose last batch norm starts at weight 0 (timm's
    zero_init_last): each branch adds zero, so folding removes it whole."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)) for _ in range(2)
        )
        for block in self.blocks:
            torch.nn.init.zeros_(block[1].weight)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = torch.relu(x + block(x))
        return x.mean((2, 3))


def build_zero_init_residual():
    torch.manual_seed(0)
    return ZeroInitResidual(), (torch.randn(1, 3, 16, 16),)
