"""What a TPU's compiler refuses, and what the device does instead: the one table.

Found by compiling every lowering of the table, on the arguments PyTorch's OpInfo samples
really pass, for a TPU v5e with libtpu's compiler (`tools/tpu_op_sweep.py`; libtpu 0.0.42.1,
JAX 0.10.2). Outside this table everything compiles (float32 SVD, which aborted XLA, is
fixed in its lowering: `ops/linalg._svd`). Each `ChipLimit` names the ops, the
argument dtypes that trigger it, what XLA does with them, and the action:

- "host": eager mode (strict, debug, and fused, which runs such an op at once instead of
  recording it) runs the op on the host's CPU device with the same lowering, warns once
  per (op, dtype) and counts it in `cpu_fallback_counts()`; inside one compiled program
  (torch.compile, the compile-step) there is no host, so the op raises
  `TpuChipLimitError` there, before XLA sees it;
- "raise": raises `TpuChipLimitError` everywhere: a host round trip would hide a cost
  the user must see.

The rule is a function of (op, dtypes, platform) (`limit_for`); the platform is TPU when
JAX's default backend is one, while `kernels.tpu.compile_for`/`lowering_for` compiles for
a chip, or inside `platform("tpu")` (how CPU tests force it). The check runs when a
lowering is traced (compiled), never per call: the guarded lowerings cost nothing on hits.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass

import jax
import numpy as np
import torch

from tpu_backend.eager.errors import TpuLoweringError

aten = torch.ops.aten


@dataclass(frozen=True)
class ChipLimit:
    ops: frozenset  # ATen overloads
    dtypes: frozenset  # argument dtype names that trigger it ("float64", "int64")
    action: str  # "host" or "raise"
    reason: str  # what the TPU compiler does with them (seen in the sweep)
    advice: str  # what the user can do to stay on the chip


# Dense factorizations and solvers (everything in ops/linalg.py but matrix products).
_DECOMPOSITIONS = frozenset(
    [
        aten.linalg_inv_ex.default,
        aten.linalg_cholesky_ex.default,
        aten.linalg_qr.default,
        aten._linalg_det.default,
        aten._linalg_slogdet.default,
        aten._linalg_solve_ex.default,
        aten.linalg_solve_triangular.default,
        aten.triangular_solve.default,
        aten.linalg_matrix_exp.default,
        aten._linalg_eigh.default,
        aten._linalg_svd.default,
        aten.cholesky_solve.default,
        aten.cholesky_inverse.default,
        aten.linalg_lu_factor_ex.default,
        aten.linalg_lu.default,
        aten.linalg_lu_solve.default,
        aten.lu_unpack.default,
        aten.cholesky.default,
        aten.geqrf.default,
        aten.linalg_householder_product.default,
        aten.ormqr.default,
        aten.linalg_lstsq.default,
        aten.linalg_ldl_factor_ex.default,
        aten.linalg_ldl_solve.default,
    ]
)
_INTEGER_PRODUCTS = frozenset(
    [
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten.baddbmm.default,
        aten.addbmm.default,
        aten.addmv.default,
        aten.mv.default,
        aten.dot.default,
        aten.vdot.default,
        aten.convolution.default,
        aten._convolution.default,
    ]
)
# Lowered to bit manipulation of the float (bitcasts, shifts, masks).
_FLOAT_BITS = frozenset(
    [
        aten.copysign.Tensor,
        aten.copysign.Scalar,
        aten.frexp.Tensor,
        aten.nextafter.default,
        aten.signbit.default,
    ]
)

LIMITS: tuple[ChipLimit, ...] = (
    ChipLimit(
        _DECOMPOSITIONS,
        frozenset({"float64"}),
        "host",
        "XLA's TPU compiler implements LU only for float32/complex64 ('Only F32 and C64 types are "
        "implemented in LuDecomposition'), and the float64 SVD, eigh and QR it emulates take "
        "10-30 s to compile",
        "compute in float32 (x.float()) to stay on the chip",
    ),
    ChipLimit(
        _INTEGER_PRODUCTS,
        frozenset({"int64"}),
        "host",
        "XLA's TPU compiler has no int64 matrix product or convolution ('While rewriting computation "
        "to not contain X64 element types ... dot/convolution')",
        "multiply in int32 or float32 to stay on the chip",
    ),
    ChipLimit(
        _FLOAT_BITS,
        frozenset({"float64"}),
        "host",
        "XLA's TPU compiler fails on the float64 bit manipulation they lower to ('Binary op and with "
        "different element types: s32 and u32')",
        "compute in float32 to stay on the chip",
    ),
    ChipLimit(
        frozenset([aten._fft_r2c.default]),
        frozenset({"float64"}),
        "raise",
        "XLA's TPU FFT takes float32 and complex64 only ('Unexpected operand type for FFT: f64'), "
        "and the device cannot hold the complex128 result",
        "compute the transform in float32 (x.float())",
    ),
)

_BY_OP: dict = {}
for _limit in LIMITS:
    for _op in _limit.ops:
        _BY_OP.setdefault(_op, []).append(_limit)


class TpuChipLimitError(TpuLoweringError):
    """An op, on these dtypes, that a TPU's compiler cannot compile (see `LIMITS`)."""

    def __init__(self, op, dtype: str, limit: ChipLimit):
        self.op, self.dtype, self.limit = op, dtype, limit
        where = " inside a compiled program (torch.compile)" if limit.action == "host" else ""
        super().__init__(
            f"{op} on {dtype} tensors cannot run on a TPU{where}: {limit.reason}. "
            f"{limit.advice[0].upper()}{limit.advice[1:]}, or move the tensors to CPU (x.cpu())"
            + ("; in eager mode it runs on the host by itself." if limit.action == "host" else ".")
        )


# --------------------------------------------------------------------------- the platform

_state = threading.local()
_forced: list[str] = []


@contextlib.contextmanager
def platform(name: str):
    """Inside: decide as on `name` ("tpu", "cpu") whatever JAX's backend is (tests)."""
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


@contextlib.contextmanager
def on_host():
    """Inside: lowerings trace for the host CPU device, where every op compiles."""
    previous = getattr(_state, "host", False)
    _state.host = True
    try:
        yield
    finally:
        _state.host = previous


def targets_tpu() -> bool:
    """Whether lowerings traced now compile for a TPU."""
    if getattr(_state, "host", False):
        return False
    if _forced:
        return _forced[-1] == "tpu"
    from kernels import tpu

    return tpu.target_chip() is not None or jax.default_backend() == "tpu"


# --------------------------------------------------------------------------- float64 storage

# A TPU holds float64 as a pair of float32s (measured on a v5e): float32's exponent range and
# about 49 significant bits. A finite value beyond it would become inf on the way to the chip.
FLOAT64_ON_TPU_MAX = float(np.finfo(np.float32).max)


def check_float64_fits(values: np.ndarray) -> None:
    """Refuse float64 `values` bound for a TPU that the chip would turn into inf (never on
    other platforms). Below float32's smallest normal they become 0, and -0.0 becomes 0.0,
    as float32 values do on the chip: not refused."""
    if values.dtype != np.float64 or values.size == 0 or not targets_tpu():
        return
    beyond = np.isfinite(values) & (np.abs(values) > FLOAT64_ON_TPU_MAX)
    if beyond.any():
        index = tuple(int(i) for i in np.argwhere(beyond)[0])
        raise ValueError(
            f"float64 value {float(values[index])!r} at index {index} cannot be moved to a TPU: the chip holds "
            f"float64 as two float32s, in float32's range (|x| <= {FLOAT64_ON_TPU_MAX:.3g}), so it would "
            "become inf. Keep this tensor on the CPU, or scale it into that range before moving it"
        )


# --------------------------------------------------------------------------- the rule


def _dtype_name(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return np.dtype(dtype).name


def limit_for(op, dtypes, platform: str = "tpu") -> ChipLimit | None:
    """The limit that applies to `op` called on tensors of `dtypes` (torch, numpy or JAX
    dtypes, or their names) on `platform`, or None (it compiles there)."""
    if platform != "tpu":
        return None
    names = {d if isinstance(d, str) else _dtype_name(d) for d in dtypes}
    for limit in _BY_OP.get(op, ()):
        if names & limit.dtypes:
            return limit
    return None


def _array_dtypes(value, found: set) -> None:
    if isinstance(value, (jax.Array, jax.core.Tracer)):
        found.add(np.dtype(value.dtype).name)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _array_dtypes(v, found)


def guarded(op, fn):
    """`fn` (the lowering of `op`) checked against `LIMITS` when it is traced for a TPU."""

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if targets_tpu():
            found: set = set()
            _array_dtypes(args, found)
            _array_dtypes(list(kwargs.values()), found)
            limit = limit_for(op, found)
            if limit is not None:
                dtype = sorted(found & limit.dtypes)[0]
                raise TpuChipLimitError(op, dtype, limit)
        return fn(*args, **kwargs)

    checked.chip_limited = True
    return checked


def guard_table() -> None:
    """Wrap the lowerings of every op in `LIMITS` with `guarded` (once, at import)."""
    import dataclasses

    from tpu_backend.ops.registry import LOWERINGS

    for op in _BY_OP:
        lowering = LOWERINGS.get(op)
        if lowering is not None and not getattr(lowering.fn, "chip_limited", False):
            LOWERINGS[op] = dataclasses.replace(lowering, fn=guarded(op, lowering.fn))


# --------------------------------------------------------------------------- eager: the host

_warned: set = set()


def warn_on_host(error: TpuChipLimitError, frame: str) -> None:
    import warnings

    key = (error.op, error.dtype)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"{error.op} on {error.dtype} tensors ran on the host CPU (called from {frame}): "
            f"{error.limit.reason}. {error.limit.advice[0].upper()}{error.limit.advice[1:]}; "
            "see tpu_backend.cpu_fallback_counts()",
            stacklevel=3,
        )


def host_device():
    """JAX's CPU device, where eager mode runs what the chip refuses."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError as error:
        raise RuntimeError(
            "running an op the TPU refuses on the host needs JAX's CPU backend, which JAX_PLATFORMS "
            f"excludes here ({error}): leave JAX_PLATFORMS unset or list cpu too (JAX_PLATFORMS=tpu,cpu)"
        ) from None
