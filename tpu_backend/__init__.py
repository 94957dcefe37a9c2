"""A "tpu" device for PyTorch whose ops run through JAX/XLA.

    import tpu_backend
    model = MyModel().to("tpu")

Importing this package registers the device on PyTorch's PrivateUse1 key, creates
`torch.tpu`, fills the ATen -> JAX lowering table (`tpu_backend.ops`) and connects it to
the dispatcher. On a machine without a TPU, JAX's CPU (or GPU) runtime runs the ops.

Importing it changes two PROCESS-WIDE JAX settings (`JAX_SETTINGS`, applied here and
nowhere else), which other JAX code in the same process sees too:
- `jax_enable_x64=True`: int64 is PyTorch's index dtype, so 64-bit JAX types must exist
  (without it int64 silently becomes int32). Every lowering keeps float32 float32: JAX
  then only produces float64 where PyTorch would.
- `jax_cpu_enable_async_dispatch=False`: on the CPU runtime a small op costs ~5 us
  synchronously versus 25-45 us asynchronously; strict eager is per-op bound there.
- `jax_default_matmul_precision` follows `torch.set_float32_matmul_precision` (PyTorch's
  default "highest", so float32 matmuls agree with CPU; `tpu_backend/precision.py`).
(The persistent compile cache, `tpu_backend/compile/cache.py`, sets JAX's
compilation-cache options when it is enabled.)
"""

from __future__ import annotations

import sys
import types

import jax

from common.package_names import check_top_level_names

# before `kernels` is imported: another package of that name is refused, naming the fix
check_top_level_names(("common", "kernels"))

from common import timm_compat  # noqa: E402

timm_compat.install()  # `import timm` works without a loadable torchvision (tools/setup.sh installs none)

from kernels import tpu as _tpu_chips  # noqa: E402

_tpu_chips.quiet_libtpu_without_chip()  # before JAX starts its backends

JAX_SETTINGS = {"jax_enable_x64": True, "jax_cpu_enable_async_dispatch": False}
for _name, _value in JAX_SETTINGS.items():
    jax.config.update(_name, _value)

import torch  # noqa: E402,F401  (torch before the backend registration)

from tpu_backend import _registration, device  # noqa: E402

_registration.register_backend(device)

import tpu_backend.fake_rules  # noqa: E402,F401  (tpu tensors' shapes where a meta kernel has CUDA's limits)
import tpu_backend.ops  # noqa: E402,F401  (fills the lowering table)
from tpu_backend import (  # noqa: E402
    autocast,
    core_ops,
    dispatch,
    fused,
    host_memory,
    integrations,
    jax_interop,
    kernels,
    modules,
    precision,
    serialization,
    streams,
)
from tpu_backend.dispatch import (  # noqa: E402,F401
    TpuDebugError,
    TpuLoweringError,
    cpu_fallback_counts,
    get_eager_mode,
    set_cpu_fallback,
    set_eager_mode,
)
from tpu_backend.fused import mark_step  # noqa: E402,F401
from tpu_backend.jax_interop import from_jax, to_jax  # noqa: E402,F401
from tpu_backend.jax_op import jax_op  # noqa: E402,F401
from tpu_backend.program_export import export  # noqa: E402,F401
from tpu_backend.tensor import payload_count  # noqa: E402,F401


def _install() -> None:
    core_ops.register()  # before the table: allocation, copies and views win
    dispatch.register_table()
    dispatch.register_fallback()
    autocast.register()
    serialization.install()
    modules.install()
    host_memory.install()
    jax_interop.install()  # DLPack export of tpu tensors through their JAX arrays
    streams.install()  # tensor.record_stream: a no-op with one in-order queue
    precision.install()  # torch.set_float32_matmul_precision -> JAX's matmul precision (default highest)
    integrations.install()  # transformers' save_pretrained on tpu weights
    kernels.install()  # Pallas kernel routers: attention, norms, cross-entropy (tpu_backend/kernels.py)
    from tpu_backend import gradients  # (defines jax_ops: after allocation and copies are registered)

    gradients.install()  # stable float32 backwards for ops whose ATen formula cancels (logcumsumexp)
    device.jax_op = jax_op  # torch.tpu.jax_op (needs the table, so attached after it is filled)
    device.pallas = sys.modules["torch.tpu.pallas"] = types.ModuleType(
        "torch.tpu.pallas", "torch-tpu's `torch.tpu.pallas.jax_op`, for code written against it"
    )
    device.pallas.jax_op = jax_op
    if torch.distributed.is_available():  # dist.init_process_group("tpu"): one process per chip
        from tpu_backend.distributed import compiled_collectives, process_group

        process_group.register()
        compiled_collectives.register_all()  # _c10d_functional ops inside torch.compile(backend="tpu") graphs
    if dispatch.get_eager_mode() == "fused":  # TPU_EAGER_MODE=fused
        fused.enable()


_install()

from tpu_backend import profiler  # noqa: E402  (torch.tpu.profiler)

profiler.install(device)


def register_new_lowerings() -> int:
    """Connect lowerings added to the table after import; returns how many kernels were added.
    Not needed any more (a lowering registered after import connects itself); kept for callers."""
    return dispatch.register_table()


def __getattr__(name: str):
    if name == "TrainStep":  # imported on first use: it brings the planner's tracer (tpu_backend.aot)
        from tpu_backend.train_step import TrainStep

        return TrainStep
    raise AttributeError(f"module 'tpu_backend' has no attribute {name!r}")


__all__ = [
    "TrainStep",
    "TpuDebugError",
    "TpuLoweringError",
    "cpu_fallback_counts",
    "export",
    "from_jax",
    "get_eager_mode",
    "jax_op",
    "mark_step",
    "payload_count",
    "register_new_lowerings",
    "set_cpu_fallback",
    "set_eager_mode",
    "to_jax",
]
