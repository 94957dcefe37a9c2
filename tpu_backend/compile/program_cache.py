"""The lowered-program cache: a program's compiled executable on disk, found without tracing.

JAX's persistent cache (`cache.py`) is keyed by the StableHLO, so a second process still
traces each program through our lowerings and lowers it before the disk hit. This layer
sits in front of it: `Program._build` first asks for the executable under a key made of
what the program *is* (its identity text: an ATen graph's code and constants, a fused
graph's op list), its input signature, the matmul precision, the donated arguments and
the environment (`environment_key`: JAX, jaxlib, torch and Python versions, a hash of
this project's own source, the JAX backend and its devices, the JAX flags and kernel
mode that change lowerings). A hit deserialises the executable and skips tracing,
lowering and XLA; a miss builds as before and stores the result.

Entries live in `<cache folder>/programs/*.prog`, checksummed like XLA's
(`VerifiedDiskCache`): a corrupt entry, one whose recorded key text differs from the
request's (stale, or a hash collision), or one that fails to load is deleted with a
warning and rebuilt. A miss here never raises under `cache_only()`: the request goes on to
XLA's store, which does. Only executables XLA has just compiled are stored (`save`).

Only programs on one device are cached here (a sharded executable is tied to its device
assignment, which the key does not describe); others keep the StableHLO-keyed path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import jax

from tpu_backend import kernel_mode
from tpu_backend.compile import cache as _cache

SUFFIX = ".prog"
_FORMAT = 2  # bump when the entry layout changes
# JAX flags a lowering can depend on (dtype rules, random numbers, matmul passes).
_JAX_FLAGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_threefry_partitionable",
    "jax_default_prng_impl",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
)
_SOURCE_PACKAGES = ("tpu_backend", "kernels")


def store() -> _cache.VerifiedDiskCache | None:
    """The program store inside the current cache folder (None when the disk layer is off)."""
    return _cache.sub_store("programs", SUFFIX)


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """SHA-256 of this project's device code (every .py under tpu_backend/ and kernels/):
    any edit to a lowering, a kernel or the interpreter changes every key."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _static_environment() -> str:
    import jaxlib
    import torch

    devices = jax.devices()
    return "\n".join(
        [
            f"format {_FORMAT}",
            f"python {sys.version_info[:3]}",
            f"jax {jax.__version__} jaxlib {jaxlib.__version__} torch {torch.__version__}",
            f"source {source_hash()}",
            f"backend {jax.default_backend()} {getattr(devices[0].client, 'platform_version', '')}",
            f"devices {len(devices)} {devices[0].device_kind}",
        ]
    )


def environment_key() -> str:
    """What outside a program decides its executable: versions, our source, the backend,
    the JAX flags and the kernel mode (these two can change while the process runs)."""
    flags = [f"{name}={getattr(jax.config, name, None)!r}" for name in _JAX_FLAGS]
    return "\n".join([_static_environment(), *flags, f"kernels {kernel_mode.mode()} {kernel_mode.implementation()}"])


def single_device(signature: tuple) -> bool:
    """Whether every array of `signature` sits on one device (see the module docstring)."""
    shardings = [item[4] for item in signature if item[0] == "array"]
    return all(s is None or isinstance(s, jax.sharding.SingleDeviceSharding) for s in shardings) and (
        len({tuple(s.device_set) for s in shardings if s is not None}) <= 1
    )


def key_text(identity: str, matmul_precision: str, signature: tuple, donate: tuple) -> str:
    """The text a program's key hashes (the name is left out: it only labels statistics)."""
    return "\n".join(
        [
            environment_key(),
            f"precision {matmul_precision}",
            f"donate {donate}",
            f"signature {signature!r}",
            identity,
        ]
    )


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load(key: str, text: str) -> tuple[Any, Any, dict, int] | None:
    """(executable, output treedef, static outputs, number of outputs) stored under `key`,
    or None. A bad entry (corrupt, written for another key text, unloadable) is deleted
    with a warning."""
    storage = store()
    if storage is None:
        return None
    payload = storage.get(key)
    if payload is None:
        return None
    try:
        entry = pickle.loads(payload)
        if entry["text"] != text:
            storage.discard(key, "was written for another program (stale or a hash collision)")
            return None
        from jax.experimental import serialize_executable

        compiled = serialize_executable.deserialize_and_load(entry["executable"], entry["in_tree"], entry["out_tree"])
    except Exception as error:  # noqa: BLE001 - any failure to load means: rebuild
        storage.discard(key, f"could not be loaded ({type(error).__name__}: {str(error)[:200]})")
        return None
    return compiled, entry["treedef"], entry["static"], entry["n_leaves"]


def save(key: str, text: str, compiled, treedef, static: dict, n_leaves: int) -> bool:
    """Store `compiled` under `key`; False (nothing written) when it cannot be serialised.

    `compiled` must come from XLA's compiler, not from a disk load: with jax 0.10.2 an
    XLA:CPU executable that was itself deserialised serialises without its code ("NOT_FOUND:
    Function broadcast_add_fusion not found" when the copy runs). A program whose
    executable JAX's store already had is therefore not stored here until XLA compiles it
    again; it still skips XLA, not the lowering."""
    storage = store()
    if storage is None:
        return False
    from jax.experimental import serialize_executable

    try:
        executable, in_tree, out_tree = serialize_executable.serialize(compiled)
        payload = pickle.dumps(
            dict(
                text=text,
                executable=executable,
                in_tree=in_tree,
                out_tree=out_tree,
                treedef=treedef,
                static=static,
                n_leaves=n_leaves,
            ),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except Exception:  # noqa: BLE001 - e.g. a static output that does not pickle: stay uncached
        return False
    storage.put(key, payload)
    return True


def enabled() -> bool:
    """`TPU_PROGRAM_CACHE=off` turns this layer off (JAX's persistent cache stays)."""
    return os.environ.get("TPU_PROGRAM_CACHE", "on").strip().lower() not in _cache._DISABLED_VALUES


__all__ = ["environment_key", "key_of", "key_text", "load", "save", "single_device", "source_hash", "store"]
