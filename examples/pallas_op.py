"""Write a Pallas kernel, make it a PyTorch op with `torch.tpu.jax_op`, train with it on "tpu".

    .venv/bin/python examples/pallas_op.py              # 150 steps
    .venv/bin/python examples/pallas_op.py --steps 30   # the quick form (the test)

The kernel is a fused bias + GELU (tanh form), `gelu(x + bias)` over (rows, features)
tiles, with a second Pallas kernel for its backward. `jax_op` turns the pair into the
op `torch.ops.examples.bias_gelu` with shapes from `jax.eval_shape`, so the same op runs
in eager mode, in fused eager, under `torch.compile(backend="tpu")`, and on CPU tensors.
A small MLP using it as its activation trains on "tpu" and is checked step by step
against the same MLP in PyTorch on CPU (`F.gelu(h + b, approximate="tanh")`). Finally the
kernels are compiled for a TPU (v5e) by libtpu, Mosaic included, with no TPU needed
(`kernels.tpu.compile_for`): on a TPU the kernel runs compiled by Mosaic, elsewhere in
Pallas's interpreter. `jax_op` traces the function in JAX's default 32-bit mode (the
device itself runs with 64-bit types on), as a Pallas kernel needs on a TPU.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, results_table  # noqa: E402

import tpu_backend  # noqa: E402,F401  (registers the device and torch.tpu)
from kernels import _common  # noqa: E402
from kernels import tpu as tpu_chips  # noqa: E402

BLOCK_ROWS = 32  # a multiple of 8 (TPU sublanes); the feature axis stays whole (a multiple of 128)
SQRT_2_OVER_PI = 0.7978845608028654


# --------------------------------------------------------------------------- the kernels


def _gelu_parts(h):
    inner = SQRT_2_OVER_PI * (h + 0.044715 * h * h * h)
    return jnp.tanh(inner)


def _forward_kernel(x_ref, bias_ref, out_ref):
    h = x_ref[...].astype(jnp.float32) + bias_ref[...].astype(jnp.float32)
    out_ref[...] = (0.5 * h * (1.0 + _gelu_parts(h))).astype(out_ref.dtype)


def _backward_kernel(grad_ref, x_ref, bias_ref, dx_ref):
    h = x_ref[...].astype(jnp.float32) + bias_ref[...].astype(jnp.float32)
    t = _gelu_parts(h)
    slope = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * h * h)
    dx_ref[...] = (grad_ref[...].astype(jnp.float32) * slope).astype(dx_ref.dtype)


def _row_tiled_call(kernel, x, bias, *extra):
    """`kernel` over (BLOCK_ROWS, features) tiles of x (and of `extra`), bias as one (1, features) row."""
    rows, features = x.shape
    block_rows = min(BLOCK_ROWS, rows)
    tile = pl.BlockSpec((block_rows, features), lambda i: (i, 0))
    impl = _common.default_implementation()  # compiled on a TPU (or lowering for one), interpreted elsewhere
    return pl.pallas_call(
        kernel,
        grid=(_common.cdiv(rows, block_rows),),
        in_specs=[tile] * len(extra) + [tile, pl.BlockSpec((1, features), lambda i: (0, 0))],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        **_common.pallas_options(impl, "parallel"),
    )(*extra, x, bias.reshape(1, features))


def bias_gelu_backward(grad, x, bias):
    """The op's backward: one gradient per tensor argument (dx by a kernel, dbias by XLA)."""
    dx = _row_tiled_call(_backward_kernel, x, bias, grad)
    return dx, dx.sum(axis=0).astype(bias.dtype)


@torch.tpu.jax_op("examples::bias_gelu", backward=bias_gelu_backward)
def bias_gelu(x: jax.Array, bias: jax.Array) -> jax.Array:
    """gelu(x + bias), tanh form: x (rows, features), bias (features,)."""
    return _row_tiled_call(_forward_kernel, x, bias)


# --------------------------------------------------------------------------- the model


class BiasGelu(nn.Module):
    """`gelu(x + bias)` through the Pallas op (`use_kernel=False`: PyTorch's own ops)."""

    def __init__(self, features: int, use_kernel: bool = True):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features))
        self.use_kernel = use_kernel

    def forward(self, x):
        if self.use_kernel:
            return bias_gelu(x, self.bias)
        return nn.functional.gelu(x + self.bias, approximate="tanh")


def mlp(use_kernel: bool, features: int = 128) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, features, bias=False), BiasGelu(features, use_kernel), nn.Linear(features, 1))


def regression_data(n: int = 512, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=generator)
    w = torch.randn(16, generator=generator)
    return x, torch.sin(x @ w).unsqueeze(1) + 0.1 * (x[:, :1] ** 2)


def train_losses(model: nn.Module, device: str, steps: int, batch_size: int, lr: float) -> list[float]:
    x, y = regression_data()
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        start = (step * batch_size) % len(x)
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def compiles_for_tpu(rows: int = 64, features: int = 128, chip: str = "v5e") -> str:
    """The op's forward and backward, as the device runs them, compiled for `chip` by
    libtpu (Mosaic included): on the attached TPU, or for a compile-only one on any machine
    with libtpu installed. Where libtpu cannot load they are only lowered (Mosaic's
    compiler does not run then: the answer says so). Raises what the chip refuses."""
    from tpu_backend.ops.registry import lowering_for as table_entry

    x = jax.ShapeDtypeStruct((rows, features), jnp.float32)
    bias = jax.ShapeDtypeStruct((features,), jnp.float32)
    programs = [
        (table_entry(bias_gelu._opoverload).fn, (x, bias)),
        (table_entry(bias_gelu.backward_op._opoverload).fn, (x, bias, x)),
    ]
    if jax.default_backend() == "tpu":
        for fn, args in programs:
            jax.jit(fn).lower(*args).compile()
        return f"compiled on {jax.devices()[0].device_kind}"
    missing = tpu_chips.compile_unavailable(chip)
    for fn, args in programs:
        if missing is None:
            tpu_chips.compile_for(chip, fn, *args)
        else:
            with tpu_chips.lowering_for(chip):
                jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
    return f"compiled for TPU {chip}" if missing is None else f"lowered for TPU {chip} only: {missing}"


def run(steps: int = 150, batch_size: int = 64, lr: float = 3e-3) -> dict:
    on_tpu = train_losses(mlp(use_kernel=True), "tpu", steps, batch_size, lr)
    on_cpu = train_losses(mlp(use_kernel=False), "cpu", steps, batch_size, lr)
    gaps = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(on_tpu, on_cpu)]
    return {
        "steps": steps,
        "loss_start_end": (on_tpu[0], sum(on_tpu[-5:]) / len(on_tpu[-5:])),
        "max_relative_loss_gap_vs_cpu": max(gaps),
        "tpu_check": compiles_for_tpu(),
    }


def report(results: dict) -> None:
    start, end = results["loss_start_end"]
    console.print(
        results_table(
            f"MLP with a Pallas bias+GELU op, trained on tpu ({results['steps']} steps)",
            ["loss start", "loss end", "max rel. gap vs PyTorch CPU", "kernels for TPU"],
            [
                [
                    f"{start:.4f}",
                    f"{end:.4f}",
                    f"{results['max_relative_loss_gap_vs_cpu']:.1e}",
                    results["tpu_check"],
                ]
            ],
        )
    )


def main(argv=None) -> dict:
    return cli(__doc__, run, report, argv, steps=150, batch_size=64, lr=3e-3)


if __name__ == "__main__":
    main()
