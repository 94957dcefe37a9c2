"""What the "tpu" device's arithmetic gives on this machine's JAX backend, against float64
NumPy: the figures of docs/tpu.md's "What differs from CPU" table, measured.

    python -m benchmarks.device.chip_arithmetic      # on a TPU VM (or CPU, for comparison)

Each row: the largest error relative to the largest exact value (matmuls, sums) or the
largest relative error per element (elementwise functions), one seeded input.
"""

from __future__ import annotations

import numpy as np
import torch

import tpu_backend  # noqa: F401 - registers the device


def _relative_to_max(actual: np.ndarray, exact: np.ndarray) -> float:
    return float(np.max(np.abs(actual - exact)) / np.max(np.abs(exact)))


def _per_element(actual: np.ndarray, exact: np.ndarray) -> float:
    return float(np.max(np.abs(actual - exact) / np.maximum(np.abs(exact), 1e-30)))


def rows() -> list[tuple[str, str]]:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=generator), torch.randn(256, 256, generator=generator)
    exact_mm = a.double().numpy() @ b.double().numpy()
    out = []
    for precision in ("highest", "high", "medium"):
        torch.set_float32_matmul_precision(precision)
        product = (a.to("tpu") @ b.to("tpu")).cpu().double().numpy()
        out.append((f"float32 matmul 256x256, precision {precision!r}", f"{_relative_to_max(product, exact_mm):.1e}"))
    torch.set_float32_matmul_precision("highest")
    x = torch.linspace(-4, 4, 100_001)
    for name in ("tanh", "exp", "sigmoid", "erf"):
        value = getattr(torch, name)(x.to("tpu")).cpu().double().numpy()
        exact = getattr(torch, name)(x.double()).numpy()
        out.append((f"float32 {name} on [-4, 4]", f"{_per_element(value, exact):.1e}"))
    y = torch.randn(1_000_000, generator=generator, dtype=torch.float64)
    out.append(("float64 exp", f"{_per_element(torch.exp(y.to('tpu')).cpu().numpy(), np.exp(y.numpy())):.1e}"))
    total = torch.sum(y.to("tpu")).cpu().item()
    out.append(("float64 sum of 1e6", f"{abs(total - float(np.sum(y.numpy()))) / abs(float(np.sum(y.numpy()))):.1e}"))
    m = torch.randn(64, 64, generator=generator)
    u, s, vh = torch.linalg.svd(m.to("tpu"))
    rebuilt = (u.cpu().double() @ torch.diag(s.cpu().double()) @ vh.cpu().double()).numpy()
    out.append(("float32 SVD 64x64, reconstruction", f"{_relative_to_max(rebuilt, m.double().numpy()):.1e}"))
    inverse = torch.linalg.inv(m.double().to("tpu")).cpu().numpy()
    out.append(("float64 inv 64x64 (host)", f"{_relative_to_max(inverse, np.linalg.inv(m.double().numpy())):.1e}"))
    return out


def main() -> None:
    import jax

    print(f"JAX backend: {jax.devices()[0].device_kind}")
    for what, figure in rows():
        print(f"{what:45s} {figure}")
    print("host fallbacks:", tpu_backend.cpu_fallback_counts())


if __name__ == "__main__":
    main()
