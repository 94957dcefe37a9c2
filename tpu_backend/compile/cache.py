"""The compilation cache: statistics, JAX's persistent cache on disk (verified), cache-only mode.

Three layers, from fast to slow, for every program the device compiles:

1. in memory: a `Program` keeps one compiled executable per input signature
   (shapes, dtypes, static values); a repeated signature is a *hit*;
2. on disk: JAX's persistent compilation cache, installed here with our own storage
   backend, `VerifiedDiskCache`. JAX's own file cache trusts its files: a corrupt entry
   warns and recompiles but is never replaced, and a flipped byte can crash the process
   while deserialising. Our backend stores each entry with a header (magic, length,
   SHA-256) and checks it on every read: a bad entry is deleted with a warning, JAX
   recompiles, and the fresh executable replaces it. A *disk hit* skips XLA entirely;
3. XLA: a *miss* compiles.

`CompileStats` counts requests, hits, disk hits, misses and seconds per program name.
Other compile paths (the strict-eager per-op programs) report into the same object with
`record_compile(...)`. `cache_only()` turns every miss into a `CacheMissError` naming
the program, raised *before* XLA compiles (a production job can prove that its cache
is complete).

The cache folder: `set_cache_dir(path)`, else `$TPU_CACHE_DIR`, else
`~/.cache/tpu_backend/xla` (`$XDG_CACHE_HOME` respected). `TPU_CACHE_DIR=off` disables
the disk layer. The folder is installed lazily, at the first compile, by
`ensure_persistent_cache()`; entries are valid across processes because the key leaves
the folder path out (`jax_persistent_cache_enable_xla_caches="none"`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import jax
from jax._src import compilation_cache as _jax_cache
from jax._src.compilation_cache_interface import CacheInterface

from common.files import write_atomic

ENV_CACHE_DIR = "TPU_CACHE_DIR"
_DISABLED_VALUES = {"off", "none", "0", "false", ""}


class CacheMissError(_jax_cache.CacheVerificationError):
    """A program had to be compiled while `cache_only()` was active.

    Raised by the disk cache's `get` for any JAX compile (the message names JAX's cache
    key) and re-raised by `Program` with the program's name and signature. It subclasses
    JAX's `CacheVerificationError` because that is the one error JAX's cache reader lets
    through (it turns every other read error into a warning and compiles), which is how
    a miss stops the compile before it starts.
    """

    def __init__(self, message: str, key: str = ""):
        super().__init__(message, key, b"", b"")


# --------------------------------------------------------------------- statistics


@dataclass
class ProgramStats:
    """Counters for one program name (all its signatures together)."""

    requests: int = 0  # times the program was asked for an executable
    hits: int = 0  # served from memory
    disk_hits: int = 0  # loaded from the persistent cache, no XLA compile
    misses: int = 0  # compiled by XLA
    compile_seconds: float = 0.0  # total build time: tracing + lowering + compiling (or loading)
    trace_seconds: float = 0.0  # the tracing + lowering part (Python: our lowerings, JAX tracing)
    loaded: int = 0  # of the disk hits: executables from the lowered-program cache (nothing traced)

    def add(self, other: "ProgramStats") -> None:
        self.requests += other.requests
        self.hits += other.hits
        self.disk_hits += other.disk_hits
        self.misses += other.misses
        self.compile_seconds += other.compile_seconds
        self.trace_seconds += other.trace_seconds
        self.loaded += other.loaded


@dataclass
class CompileStats:
    """Per-program counters plus disk-cache events (corrupt entries found and removed)."""

    programs: dict[str, ProgramStats] = field(default_factory=dict)
    corrupt_entries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _entry(self, name: str) -> ProgramStats:
        return self.programs.setdefault(name, ProgramStats())

    def record_hit(self, name: str) -> None:
        """`name` was requested and an executable was already in memory."""
        with self._lock:
            entry = self._entry(name)
            entry.requests += 1
            entry.hits += 1

    def record_compile(
        self, name: str, seconds: float, from_disk: bool = False, trace_seconds: float = 0.0, loaded: bool = False
    ) -> None:
        """`name` was requested and had to be built: compiled by XLA, or loaded from disk
        (`loaded`: from the lowered-program cache, without tracing). `seconds` is the
        whole build, `trace_seconds` the part spent tracing/lowering."""
        with self._lock:
            entry = self._entry(name)
            entry.requests += 1
            entry.compile_seconds += seconds
            entry.trace_seconds += trace_seconds
            entry.loaded += int(loaded)
            if from_disk:
                entry.disk_hits += 1
            else:
                entry.misses += 1

    def total(self) -> ProgramStats:
        out = ProgramStats()
        for entry in self.programs.values():
            out.add(entry)
        return out

    def reset(self) -> None:
        with self._lock:
            self.programs.clear()
            self.corrupt_entries = 0

    def summary(self) -> str:
        """A small table: one line per program, then the totals."""
        lines = [
            f"{'program':40s} {'requests':>8s} {'hits':>6s} {'disk':>6s} {'misses':>6s} {'seconds':>8s} {'(trace)':>8s}"
        ]
        rows = sorted(self.programs.items()) + [("TOTAL", self.total())]
        for name, s in rows:
            lines.append(
                f"{name[:40]:40s} {s.requests:8d} {s.hits:6d} {s.disk_hits:6d} {s.misses:6d} "
                f"{s.compile_seconds:8.3f} {s.trace_seconds:8.3f}"
            )
        if self.corrupt_entries:
            lines.append(f"corrupt disk entries replaced: {self.corrupt_entries}")
        return "\n".join(lines)


STATS = CompileStats()


def compile_stats() -> CompileStats:
    """The process-wide compile statistics (live object; `reset()` clears it)."""
    return STATS


def record_compile(name: str, seconds: float, from_disk: bool = False, trace_seconds: float = 0.0) -> None:
    """Report a compile done outside `Program` (e.g. a strict-eager op's jit) into the stats."""
    STATS.record_compile(name, seconds, from_disk, trace_seconds)


def record_hit(name: str) -> None:
    STATS.record_hit(name)


# --------------------------------------------------------------------- cache-only mode

_cache_only_depth = 0
_cache_only_lock = threading.Lock()


@contextlib.contextmanager
def cache_only():
    """Inside this block any program that is neither in memory nor on disk raises
    `CacheMissError` (naming the program) instead of compiling."""
    global _cache_only_depth
    with _cache_only_lock:
        _cache_only_depth += 1
    try:
        yield
    finally:
        with _cache_only_lock:
            _cache_only_depth -= 1


def is_cache_only() -> bool:
    return _cache_only_depth > 0


# --------------------------------------------------------------------- verified disk storage

_MAGIC = b"TPUXLA1\n"
_HEADER = struct.Struct(f">{len(_MAGIC)}sQ32s")  # magic, payload length, sha256(payload)
_SUFFIX = ".xla"


class VerifiedDiskCache(CacheInterface):
    """JAX persistent-cache storage whose entries carry a length and a SHA-256.

    `get` returns None (a miss) for an absent entry, and for a corrupt or truncated one,
    which it deletes with a warning so the recompiled executable replaces it. `put`
    writes atomically (temporary file, then rename), so a killed process never leaves a
    half-written entry under a real name.
    """

    def __init__(self, path: str | os.PathLike, suffix: str = _SUFFIX, refuse_in_cache_only: bool = True):
        self._path = Path(path).expanduser()
        self._path.mkdir(parents=True, exist_ok=True)
        self._suffix = suffix
        # XLA's store is where `cache_only()` refuses a compile; the stores in front of it
        # (lowered programs, AOTAutograd graphs) just miss and let the request go on.
        self._refuse_in_cache_only = refuse_in_cache_only
        self.hits = 0
        self.misses = 0

    @property
    def path(self) -> Path:
        return self._path

    def _file(self, key: str) -> Path:
        if not key or "/" in key or os.sep in key:
            raise ValueError(f"invalid compilation cache key {key!r}")
        return self._path / f"{key}{self._suffix}"

    def get(self, key: str) -> bytes | None:
        path = self._file(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return self._miss(key)
        payload = _unpack(data)
        if payload is None:
            self._discard_corrupt(path, len(data))
            return self._miss(key)
        self.hits += 1
        return payload

    def _miss(self, key: str) -> None:
        self.misses += 1
        if self._refuse_in_cache_only and is_cache_only():
            raise CacheMissError(
                f"cache_only(): JAX program {key!r} is not in the compilation cache at {self._path}; "
                "run once without cache_only() to fill the cache",
                key,
            )
        return None

    def put(self, key: str, value: bytes) -> None:
        path = self._file(key)
        write_atomic(path, [_pack(value)], prefix=".tmp-", suffix=self._suffix, fsync=False)

    def _discard_corrupt(self, path: Path, size: int) -> None:
        self.discard(path.name[: -len(self._suffix)], f"is corrupt or truncated ({size} bytes, checksum mismatch)")

    def discard(self, key: str, why: str) -> None:
        """Delete entry `key` with a warning saying `why` (corrupt, stale, unloadable): the
        program is rebuilt and the entry rewritten."""
        STATS.corrupt_entries += 1
        path = self._file(key)
        warnings.warn(
            f"tpu_backend: compilation cache entry {path} {why}; deleted it, the program will be "
            "rebuilt and the entry rewritten",
            RuntimeWarning,
            stacklevel=3,
        )
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def verify_all(self) -> list[Path]:
        """Check every entry now; delete (and return) the corrupt ones."""
        removed = []
        for path in sorted(self._path.glob(f"*{self._suffix}")):
            if path.name.startswith(".tmp-"):
                continue
            data = path.read_bytes()
            if _unpack(data) is None:
                self._discard_corrupt(path, len(data))
                removed.append(path)
        return removed

    def entries(self) -> list[Path]:
        return sorted(p for p in self._path.glob(f"*{self._suffix}") if not p.name.startswith(".tmp-"))

    def clear(self) -> None:
        for path in self.entries():
            path.unlink()


def _pack(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def _unpack(data: bytes) -> bytes | None:
    """The payload of a stored entry, or None if the entry does not verify."""
    if len(data) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


# --------------------------------------------------------------------- installing the disk layer

_configured_dir: Path | None = None  # set_cache_dir(); None means "from the environment"
_disabled_explicitly = False
_installed: VerifiedDiskCache | None = None
_install_lock = threading.Lock()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpu_backend" / "xla"


def cache_dir() -> Path | None:
    """The folder the disk layer uses (or will use), None if disabled."""
    if _disabled_explicitly:
        return None
    if _configured_dir is not None:
        return _configured_dir
    env = os.environ.get(ENV_CACHE_DIR)
    if env is not None:
        return None if env.strip().lower() in _DISABLED_VALUES else Path(env).expanduser()
    return default_cache_dir()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use `path` for the persistent compilation cache (None disables the disk layer).

    Takes effect immediately, also after programs were compiled: later compiles read and
    write the new folder (executables already in memory stay valid).
    """
    global _configured_dir, _disabled_explicitly
    with _install_lock:
        _configured_dir = None if path is None else Path(path).expanduser()
        _disabled_explicitly = path is None
        _uninstall()
    ensure_persistent_cache()


@contextlib.contextmanager
def using_cache_dir(path: str | os.PathLike | None):
    """Use `path` (None: no disk cache) inside the block; afterwards the previous setting
    comes back exactly, including "not installed yet" (tests use this)."""
    global _configured_dir, _disabled_explicitly
    previous = (_configured_dir, _disabled_explicitly, _installed is not None)
    set_cache_dir(path)
    try:
        yield cache_dir()
    finally:
        with _install_lock:
            _uninstall()
            _configured_dir, _disabled_explicitly = previous[0], previous[1]
        if previous[2]:
            ensure_persistent_cache()


def ensure_persistent_cache() -> VerifiedDiskCache | None:
    """Install the verified disk cache into JAX (once; cheap afterwards).

    Call before compiling anything (the device does it at first use); it configures JAX
    globally for this process: every `jax.jit` compile then goes through the cache.
    """
    global _installed
    if _installed is not None:
        return _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        folder = cache_dir()
        if folder is None:
            return None
        storage = VerifiedDiskCache(folder)
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # Keys must not depend on the folder (else no other process/folder could hit)
        # and nothing may be too small or too fast to cache (strict eager compiles
        # thousands of tiny programs, each worth keeping).
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_enable_compilation_cache", True)
        _plug_into_jax(storage)
        _installed = storage
        return storage


_JAX_HOOKS = ("reset_cache", "_cache", "_cache_initialized", "_cache_initialized_mutex", "CacheVerificationError")


def _plug_into_jax(storage: VerifiedDiskCache) -> None:
    """Make `storage` JAX's persistent-cache backend.

    JAX has no public API for a custom cache backend; its module keeps the backend in
    `_cache` and reads it at every compile (checked against jax 0.10.2). This function
    is the only place that touches those internals."""
    missing = [name for name in _JAX_HOOKS if not hasattr(_jax_cache, name)]
    if missing:
        raise RuntimeError(
            f"tpu_backend: this JAX version ({jax.__version__}) lacks {', '.join(missing)} in "
            "jax._src.compilation_cache, which the verified compilation cache plugs into; "
            "use jax 0.10.x (see constraints.txt) or disable the disk cache with TPU_CACHE_DIR=off"
        )
    _jax_cache.reset_cache()
    with _jax_cache._cache_initialized_mutex:
        _jax_cache._cache = storage
        _jax_cache._cache_initialized = True


def _uninstall() -> None:
    global _installed
    if _installed is None:
        return
    _jax_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", None)
    _installed = None


def disk_cache() -> VerifiedDiskCache | None:
    """The installed disk layer (None before the first compile or when disabled)."""
    return _installed


_sub_stores: dict[Path, VerifiedDiskCache] = {}


def sub_store(name: str, suffix: str) -> VerifiedDiskCache | None:
    """The verified store in folder `name` of the current cache folder (the lowered programs,
    Dynamo's output; None when the disk layer is off), one per folder in this process."""
    folder = cache_dir()
    if folder is None:
        return None
    folder = folder / name
    if folder not in _sub_stores:
        _sub_stores[folder] = VerifiedDiskCache(folder, suffix, refuse_in_cache_only=False)
    return _sub_stores[folder]


def verify_cache() -> list[Path]:
    """Check every entry in the cache folder now; corrupt ones are deleted and returned."""
    storage = ensure_persistent_cache()
    return [] if storage is None else storage.verify_all()


__all__ = [
    "CacheMissError",
    "CompileStats",
    "ProgramStats",
    "VerifiedDiskCache",
    "cache_dir",
    "cache_only",
    "compile_stats",
    "default_cache_dir",
    "disk_cache",
    "ensure_persistent_cache",
    "is_cache_only",
    "record_compile",
    "record_hit",
    "set_cache_dir",
    "using_cache_dir",
    "verify_cache",
]
