"""Activation lowerings and their backward ops agree with PyTorch's CPU kernels."""

import pytest
import torch
from ops_parity import assert_same, check, run_lowering

aten = torch.ops.aten
torch.manual_seed(0)

# Values on the kinks (0, +-3, +-1) check the exact edge conventions of the gradients.
X = torch.cat([torch.randn(20) * 3, torch.tensor([0.0, 3.0, -3.0, 1.0, -1.0, 0.5, -0.5, 30.0])]).reshape(4, 7)
G = torch.randn(4, 7)
P = torch.rand(4, 7) * 0.9 + 0.05

FORWARD = [
    (aten.relu.default, ()),
    (aten.gelu.default, ()),
    (aten.silu.default, ()),
    (aten.mish.default, ()),
    (aten.softplus.default, (2.0, 5.0)),
    (aten.hardswish.default, ()),
    (aten.hardsigmoid.default, ()),
    (aten.hardtanh.default, (-0.5, 2.0)),
    (aten.elu.default, (1.5, 1.2, 0.8)),
    (aten.selu.default, ()),
    (aten.celu.default, (0.7,)),
    (aten.leaky_relu.default, (0.2,)),
    (aten.hardshrink.default, (0.5,)),
    (aten.softshrink.default, (0.5,)),
    (aten.glu.default, (0,)),
]


@pytest.mark.parametrize("op,extra", FORWARD, ids=[str(op) for op, _ in FORWARD])
def test_activation_forward(op, extra):
    check(op, X, *extra)


def test_gelu_tanh_and_log_sigmoid():
    check(aten.gelu.default, X, approximate="tanh")
    # log_sigmoid's second output is a scratch buffer whose contents differ by backend.
    assert_same(run_lowering(aten.log_sigmoid_forward.default, X)[0], aten.log_sigmoid_forward.default(X)[0])


BACKWARD = [
    (aten.threshold_backward.default, (G, X, 0.0)),
    (aten.threshold_backward.default, (G, X, 0.5)),
    (aten.gelu_backward.default, (G, X)),
    (aten.silu_backward.default, (G, X)),
    (aten.sigmoid_backward.default, (G, torch.sigmoid(X))),
    (aten.tanh_backward.default, (G, torch.tanh(X))),
    (aten.softplus_backward.default, (G, X, 2.0, 5.0)),
    (aten.mish_backward.default, (G, X)),
    (aten.hardswish_backward.default, (G, X)),
    (aten.hardsigmoid_backward.default, (G, X)),
    (aten.hardtanh_backward.default, (G, X, -1.0, 1.0)),
    (aten.leaky_relu_backward.default, (G, X, 0.1, False)),
    (aten.elu_backward.default, (G, 1.5, 1.2, 0.8, False, X)),
    (aten.elu_backward.default, (G, 1.5, 1.2, 0.8, True, aten.elu.default(X, 1.5, 1.2, 0.8))),
    (aten.log_sigmoid_backward.default, (G, X, aten.log_sigmoid_forward.default(X)[1])),
    (aten.logit_backward.default, (G, P)),
    (aten.logit_backward.default, (G, P, 0.2)),
    (aten.glu_backward.default, (G[:, :3], X[:, :6], 1)),
    (aten.hardshrink_backward.default, (G, X, 0.5)),
    (aten.softshrink_backward.default, (G, X, 0.5)),
]


@pytest.mark.parametrize("op,args", BACKWARD, ids=[f"{i}-{op}" for i, (op, _) in enumerate(BACKWARD)])
def test_activation_backward(op, args):
    check(op, *args, atol=1e-5, rtol=1e-4)


def test_gelu_tanh_backward():
    check(aten.gelu_backward.default, G, X, approximate="tanh", rtol=1e-4)


@pytest.mark.parametrize(
    "weight", [torch.tensor([0.25]), torch.tensor([[0.1], [-0.2], [0.3]])], ids=["shared", "per-channel"]
)
def test_prelu_forward_and_backward(weight):
    x = torch.randn(2, 3, 4)
    check(aten._prelu_kernel.default, x, weight)
    check(aten._prelu_kernel_backward.default, torch.randn(2, 3, 4), x, weight, rtol=1e-4)
