"""The eager dispatcher: connects the ATen -> JAX table to the PrivateUse1 key.

The work is split by concern in `tpu_backend/eager/` (modes, errors, arguments, runner,
debug, variants, registration, fallback; see its docstring). This module is the one
place the rest of the device imports from, and re-exports the public names.

For every functional overload in `tpu_backend.ops.registry.JAX_LOWERINGS` a PrivateUse1
kernel is registered, plus the in-place (`add_`) and `.out` variants derived from it.
Ops with no kernel reach one catch-all fallback (functional form, `torch._decomp`, the
opt-in CPU fallback, else "no tpu lowering for aten.X (called from <file:line>)").

The seam for every execution mode is `execute(op, args, kwargs)` (an `OpRunner` per op):
it turns torch arguments into (dynamic JAX values, hashable static template) with
`flatten_args`, runs the lowering (strict/debug) or records it (fused), and returns JAX
results; kernels wrap those as tpu tensors (`tensor.wrap`) or write them into existing
ones (`tensor.write`).
"""

from __future__ import annotations

from tpu_backend.eager import modes as _modes
from tpu_backend.eager.arguments import fill_template, flatten_args
from tpu_backend.eager.debug import debug_check
from tpu_backend.eager.errors import TpuDebugError, TpuLoweringError, user_frame
from tpu_backend.eager.fallback import register_fallback
from tpu_backend.eager.modes import (
    CPU_FALLBACK_COUNTS,
    DECOMPOSED_COUNTS,
    EAGER_MODES,
    cpu_fallback_counts,
    get_eager_mode,
    set_cpu_fallback,
    set_eager_mode,
)
from tpu_backend.eager.registration import check_device_index, register_kernel, register_table
from tpu_backend.eager.runner import CACHE_STATS, JitCacheStats, OpRunner, clear_jit_cache, execute, runner
from tpu_backend.eager.variants import functional_variant, inplace_variant, out_variant, write_result

__all__ = [
    "CACHE_STATS",
    "CPU_FALLBACK_COUNTS",
    "DECOMPOSED_COUNTS",
    "EAGER_MODES",
    "JitCacheStats",
    "OpRunner",
    "TpuDebugError",
    "TpuLoweringError",
    "check_device_index",
    "clear_jit_cache",
    "cpu_fallback_counts",
    "debug_check",
    "execute",
    "fill_template",
    "flatten_args",
    "functional_variant",
    "get_eager_mode",
    "inplace_variant",
    "out_variant",
    "register_fallback",
    "register_kernel",
    "register_table",
    "runner",
    "set_cpu_fallback",
    "set_eager_mode",
    "user_frame",
    "write_result",
]


def __getattr__(name: str):
    # The process-wide switches live in `eager.modes`; read them live from there.
    if name in ("_mode", "_cpu_fallback"):
        return getattr(_modes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
