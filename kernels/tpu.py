"""What a TPU asks of a kernel: the chip table, Pallas's block-layout rule, the VMEM a
program needs, and lowering for a named chip on a machine without one.

Every kernel describes its `pallas_call` as a list of `Block`s (the same shapes its
BlockSpecs and scratch use). `violations(blocks, chip)` and `vmem_bytes(blocks, chip)`
read that list; `kernels.check_lowering`, `kernels.tuning` and the "tpu" device's router
(`tpu_backend.kernels`) all decide with these functions, so a shape the router sends to
a kernel is one that `check_lowering` has shown to lower and fit.

Chip parameters (per TensorCore):
| chip | device kind | sublanes x lanes | VMEM | default scoped VMEM | MXU |
| --- | --- | --- | --- | --- | --- |
| v5e | "TPU v5 lite" | 8 x 128 | 128 MiB | 16 MiB | 4 x 128x128 |
| v5p | "TPU v5" | 8 x 128 | 64 MiB | 16 MiB | 4 x 128x128 |
| v6e | "TPU v6 lite" | 8 x 128 | 128 MiB | 32 MiB | 2 x 256x256 |
Sources: VMEM size, MXU count and width, lanes and sublanes: JAX 0.10.2
`jax/_src/pallas/mosaic/tpu_info.py` (`_get_tpu_info_impl`); device kinds: the same
file's `chip_version_from_device_kind`; scoped VMEM (what a kernel may use without
raising `vmem_limit_bytes`): XLA's `xla_tpu_scoped_vmem_limit_kib` default as given in
the Pallas TPU documentation (docs.jax.dev, "Pallas TPU: pipelining"/"TPU details").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    device_kind: str
    sublanes: int
    lanes: int
    vmem_bytes: int
    scoped_vmem_bytes: int
    mxus: int
    mxu_size: int


CHIPS = {
    "v5e": Chip("v5e", "TPU v5 lite", 8, 128, 128 * MiB, 16 * MiB, 4, 128),
    "v5p": Chip("v5p", "TPU v5", 8, 128, 64 * MiB, 16 * MiB, 4, 128),
    "v6e": Chip("v6e", "TPU v6 lite", 8, 128, 128 * MiB, 32 * MiB, 2, 256),
}
DEFAULT_CHIP = "v5e"  # the smallest scoped VMEM of the table: blocks that fit it fit all


def chip(name: str | Chip | None = None) -> Chip:
    if isinstance(name, Chip):
        return name
    name = name or DEFAULT_CHIP
    if name not in CHIPS:
        raise ValueError(f"unknown TPU chip {name!r}; known: {', '.join(CHIPS)}")
    return CHIPS[name]


@dataclasses.dataclass(frozen=True)
class Block:
    """One operand of a `pallas_call` as a program sees it. `block` uses None for a
    squeezed dim (Pallas's convention); role: "in", "out", "scratch" or "smem"."""

    name: str
    array: tuple
    block: tuple
    dtype: object
    role: str = "in"

    @property
    def dims(self) -> tuple:
        return tuple(1 if b is None else b for b in self.block)


def _sublane_multiple(dtype, c: Chip) -> int:
    """Rows per (sublane) tile: 8 for 32-bit, 16 for bf16, 32 for 8-bit (packed)."""
    return c.sublanes * max(1, 4 // np.dtype(dtype).itemsize)


def violations(blocks, c: Chip | str | None = None) -> list[str]:
    """Pallas TPU's block rule for every blocked operand: the last two block dims are
    multiples of (sublanes, lanes) or equal to the array's (rank-1 blocks: the whole
    array, a multiple of sublanes x lanes, or a power of two >= lanes x packing)."""
    c = chip(c)
    problems = []
    for b in blocks:
        if b.role in ("scratch", "smem"):
            continue
        dims = b.dims
        if len(dims) >= 2:
            ok = (dims[-1] == b.array[-1] or dims[-1] % c.lanes == 0) and (
                dims[-2] == b.array[-2] or dims[-2] % c.sublanes == 0
            )
        else:
            size, packing = dims[0], max(1, 4 // np.dtype(b.dtype).itemsize)
            ok = (
                size == b.array[0]
                or size % (c.sublanes * c.lanes) == 0
                or (size >= c.lanes * packing and size & (size - 1) == 0)
            )
        if not ok:
            problems.append(
                f"{b.name}: block {tuple(b.block)} over array {tuple(b.array)} breaks the "
                f"({c.sublanes}, {c.lanes}) rule"
            )
    return problems


def _tile_bytes(dims, dtype, c: Chip) -> int:
    """Bytes of a VMEM buffer, its last two dims padded to whole (sublane, lane) tiles."""
    dims = (1,) * max(0, 2 - len(dims)) + tuple(dims)
    rows = -(-dims[-2] // _sublane_multiple(dtype, c)) * _sublane_multiple(dtype, c)
    cols = -(-dims[-1] // c.lanes) * c.lanes
    return math.prod(dims[:-2]) * rows * cols * np.dtype(dtype).itemsize


def vmem_bytes(blocks, c: Chip | str | None = None) -> int:
    """Per-program VMEM: every input and output block twice (Pallas double-buffers the
    pipeline), scratch once, tile-padded."""
    c = chip(c)
    total = 0
    for b in blocks:
        if b.role == "smem":
            continue
        copies = 1 if b.role == "scratch" else 2
        total += copies * _tile_bytes(b.dims, b.dtype, c)
    return total


def fits(blocks, c: Chip | str | None = None) -> bool:
    return vmem_bytes(blocks, c) <= chip(c).scoped_vmem_bytes


def rejection(blocks, c: Chip | str | None = None) -> str | None:
    """Why a TPU cannot run these blocks (None: it can): a layout rule or the VMEM budget."""
    c = chip(c)
    problems = violations(blocks, c)
    if problems:
        return "layout: " + problems[0]
    used = vmem_bytes(blocks, c)
    if used > c.scoped_vmem_bytes:
        return f"VMEM {used / MiB:.1f} MiB > {c.scoped_vmem_bytes / MiB:.0f} MiB scoped on {c.name}"
    return None


# --------------------------------------------------------------------------- lowering target

_TARGET: list[str] = []  # the chip a `lowering_for` block lowers for, or _HOST (innermost last)
_HOST = "host"  # a `lowering_for_host` block


def target_chip() -> str | None:
    """The chip `lowering_for` names, or None outside it (or inside `lowering_for_host`)."""
    return _TARGET[-1] if _TARGET and _TARGET[-1] != _HOST else None


def targets_host() -> bool:
    """Whether the innermost lowering target is `lowering_for_host`."""
    return bool(_TARGET) and _TARGET[-1] == _HOST


@contextlib.contextmanager
def lowering_for_host():
    """Inside: the kernels lower as on a CPU (no Mosaic call) even where JAX's backend is a
    TPU. For `jax.export.export(..., platforms=["cpu"])` on a TPU machine."""
    _TARGET.append(_HOST)
    try:
        yield
    finally:
        _TARGET.pop()


def _abstract_mesh(c: Chip):
    """A one-device abstract mesh whose device is the chip: Mosaic reads the TPU
    generation (tiling, bf16 support) from the current mesh's device kind."""
    try:
        from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    except ImportError as error:  # pragma: no cover - JAX outside the supported range
        raise ImportError(
            "lowering for a named TPU needs jax.sharding.AbstractDevice/use_abstract_mesh "
            f"(JAX >= 0.10); install jax{SUPPORTED_JAX}"
        ) from error
    device = AbstractDevice(device_kind=c.device_kind, num_cores=1, platform="tpu")
    return use_abstract_mesh(AbstractMesh((1,), ("_chip",), abstract_device=device))


def _use_mesh(mesh):
    from jax.sharding import use_abstract_mesh

    return use_abstract_mesh(mesh.abstract_mesh)


@contextlib.contextmanager
def lowering_for(name: str | Chip | None = None, mesh=None):
    """Inside: the kernels take their compiled TPU path (impl="pallas") whatever JAX's
    backend is, and Mosaic sees chip `name`, as on that device. For
    `jax.export.export(..., platforms=["tpu"])` on a machine without a TPU. `mesh`: a mesh
    of that chip's (compile-only) devices to lower for instead of one chip (the kernels'
    `shard_map`s must see it as the context mesh)."""
    c = chip(name)
    _TARGET.append(c.name)
    try:
        with _abstract_mesh(c) if mesh is None else _use_mesh(mesh):
            yield c
    finally:
        _TARGET.pop()


SUPPORTED_JAX = ">=0.10,<0.12"


def pallas_tpu():
    """`jax.experimental.pallas.tpu`, checked for what the kernels use (its API is
    experimental: a rename in a JAX outside the tested range fails here, by name)."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    missing = [n for n in ("CompilerParams", "PrefetchScalarGridSpec", "VMEM") if not hasattr(pltpu, n)]
    if missing:
        raise ImportError(
            f"kernels: jax.experimental.pallas.tpu in JAX {jax.__version__} lacks {', '.join(missing)}; "
            f"the kernels are tested with jax{SUPPORTED_JAX}"
        )
    return pltpu


def compiler_params(*semantics: str):
    """Mosaic compiler parameters: the grid's dimension semantics ("parallel" or
    "arbitrary"; the last is a sequential reduction axis)."""
    return pallas_tpu().CompilerParams(dimension_semantics=tuple(semantics))


def vmem_scratch(shape, dtype):
    return pallas_tpu().VMEM(tuple(shape), dtype)


# --------------------------------------------------------------------------- compiling for a chip

# A single-host slice per chip: `compile_for` compiles on its first device. Larger
# topologies (a pod) are named directly in `compile_only_devices`.
TOPOLOGIES = {"v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}


def quiet_libtpu_without_chip() -> None:
    """On a machine with libtpu installed but no TPU attached (a CPU host compiling for
    TPU), JAX's start-up asks libtpu for the chip and it prints several lines of warnings
    to stderr. Tell libtpu there is one local host of no chips' type, which silences it.
    libtpu also takes a host-wide lock file (/tmp/libtpu_lockfile) so that one process
    holds the chips; with no chip there is nothing to guard, and without
    ALLOW_MULTIPLE_LIBTPU_LOAD a second process compiling for a TPU at the same time
    (a test's subprocess, another user) fails ("Internal error when accessing libtpu
    multi-process lockfile"). A machine with a TPU (or a user's own settings) is left alone."""
    import os

    if "TPU_ACCELERATOR_TYPE" in os.environ or "TPU_WORKER_HOSTNAMES" in os.environ:
        return
    try:
        from jax._src import hardware_utils

        chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
    except Exception:  # JAX's private helper moved: say nothing, change nothing
        return
    if chips == 0:
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None (then nothing can be compiled for a TPU here)."""
    from importlib import metadata

    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return None


_DEVICES: dict = {}


def compile_only_devices(topology: str):
    """Compile-only TPU devices of a named topology ("v5e:2x2", "v6e:2x2", "v5e:16x16", "v4:2x2x1"...),
    from libtpu's compiler, with no chip attached. Programs placed on them compile with the
    chip's whole compiler (XLA's TPU passes and Mosaic's) and report `memory_analysis()`
    and `cost_analysis()`; they cannot run."""
    if topology not in _DEVICES:
        if libtpu_version() is None:
            raise RuntimeError(
                "compiling for a TPU without one needs libtpu, the version JAX pins for its `tpu` extra "
                "(`pip install 'jax[tpu]==<your jax>'`; tools/setup.sh installs it)"
            )
        from jax.experimental import topologies

        quiet_libtpu_without_chip()
        name, _, shape = topology.partition(":")
        dims = [int(d) for d in shape.split("x")] if shape else [1]
        bounds = tuple(min(d, 2) for d in dims) + (1,) * (3 - len(dims))  # hosts of up to 2x2 chips
        _DEVICES[topology] = topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology,
            # v4 has two TensorCores per chip: "megacore" makes them one device, as on the chip
            chip_config_name="megacore" if name == "v4" else "default",
            chips_per_host_bounds=bounds[:3],
            wrap=(False, False, False),
        ).devices
    return _DEVICES[topology]


def lower_for_device(name: str | Chip | None, fn, *args, static_argnums=()):
    """`jax.jit(fn).lower(...)` placed on one compile-only device of chip `name` (see
    `compile_for`); `.compile()` on the result runs the chip's compiler."""
    import jax
    from jax.sharding import SingleDeviceSharding

    c = chip(name)
    device = compile_only_devices(TOPOLOGIES[c.name])[0]
    sharding = SingleDeviceSharding(device)

    def place(i, a):
        if i in static_argnums or not hasattr(a, "shape"):
            return a
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

    abstract = [place(i, a) for i, a in enumerate(args)]
    with lowering_for(c):
        return jax.jit(fn, static_argnums=static_argnums).lower(*abstract)


def compile_for(name: str | Chip | None, fn, *args, static_argnums=()):
    """`jax.jit(fn)` compiled for one chip of type `name` on this machine (no TPU needed):
    what the chip's compiler refuses raises here. `args` are arrays or ShapeDtypeStructs.
    Kernels inside take their compiled Pallas path (`lowering_for`)."""
    return lower_for_device(name, fn, *args, static_argnums=static_argnums).compile()


def compile_unavailable(name: str | Chip | None = None) -> str | None:
    """Why nothing can be compiled for chip `name` on this machine (None: it can), e.g.
    libtpu is not installed or does not load."""
    c = chip(name)
    if libtpu_version() is None:
        return "libtpu is not installed (`pip install 'jax[tpu]==<your jax>'`; tools/setup.sh installs it)"
    try:
        compile_only_devices(TOPOLOGIES[c.name])
    except Exception as error:  # libtpu present but unusable: the message says why
        return f"libtpu {libtpu_version()} does not load: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None
