"""What differs when the tests run on a TPU chip, named once (docs/tpu.md, "What differs from CPU").

The suite runs on JAX's default backend: CPU here and in CI, the chip on a TPU machine. A
few things cannot hold there as on CPU; a test that meets one says which, by name:

    @pytest.mark.chip_difference("one_process")   # skipped on a TPU, the reason printed
    def test_...(): ...

    def test_...(on_tpu):                          # a tolerance that is looser on the chip
        rtol = chip.tolerance("matmul_passes", cpu=1.3e-6, tpu=1e-4)

A helper process gets `child_env()`: only one process can hold the chip, so it runs on CPU.
`ON_TPU` is decided without starting JAX (the tests' own settings must come first).
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIFFERENCES: dict[str, str] = {
    "one_process": (
        "only one process can hold the chip ('TPU is already in use'): helper processes run on "
        "CPU (child_env), so what they measure about the device is CPU's"
    ),
    "float64": (
        "a TPU has no float64 unit: XLA emulates float64 arithmetic (slowly, and not to float64's last bits) "
        "and stores float64 as two float32s (float32's exponent range: -0.0 and values below 1.2e-38 become 0), "
        "and float64 factorizations and int64 matrix products run on the host (tpu_backend/chip_limits.py)"
    ),
    "matmul_passes": (
        "float32 matrix products and convolutions below 'highest' precision are bfloat16 passes on a "
        "TPU (3 for 'high', 1 for 'medium': about 5 and 3 significant digits); CPU computes float32 at every precision"
    ),
    "transcendentals": (
        "exp, log, tanh, erf, pow, ... are other float32 approximations on a TPU than XLA:CPU's "
        "(a few ulp apart, more near poles and for large arguments)"
    ),
    "summation_order": (
        "a TPU sums reductions and matrix products in another order and tree shape: float32 results "
        "differ from CPU's in the last bits, so bit-exact agreement with PyTorch CPU holds only on CPU"
    ),
    "host_memory": (
        "compiled programs and buffers live in the chip's memory, not in host memory mappings or the host's allocator"
    ),
}


def _tpu_attached() -> bool:
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and "tpu" not in platforms.split(","):
        return False
    try:
        from jax._src import hardware_utils

        chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    except Exception:  # JAX's private helper moved: look for the chip's device files
        return any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0"))
    return chips > 0


ON_TPU: bool = _tpu_attached()


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a helper process: this one's, off the chip (JAX_PLATFORMS=cpu),
    the checkout first on PYTHONPATH and then what this one's held (on a TPU VM, torch)."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path, **extra}


def tolerance(difference: str, cpu, tpu):
    """`tpu` on a TPU, else `cpu`: a bound that differs only where the chip's arithmetic does."""
    if difference not in DIFFERENCES:
        raise KeyError(f"unknown chip difference {difference!r}; add it to tests/chip.py DIFFERENCES")
    return tpu if ON_TPU else cpu
