"""Dynamo's own cache for `torch.compile(backend="tpu")`: a second process skips Dynamo's
trace too (issue 32). Opt-in: `TPU_DYNAMO_CACHE=on`, or `enable()` before `torch.compile`.

PyTorch 2.13's *caching precompile* (`torch._dynamo.config.caching_precompile`,
`torch/_dynamo/package.py`) keeps, per compiled function, Dynamo's output (the
transformed bytecode, its guards, the inlined functions' source hashes) together with
the backend's compiled graphs, and installs them at `torch.compile` time in a later
process: no bytecode tracing. The backend's part is AOTAutograd's bundled cache entry
(`BundledAOTAutogradCacheArtifact`), which for us holds `graph_cache.TpuGraphCode`: on a
load it rebuilds our callable from its record (`post_compile`), and the programs come
from the lowered-program store. Nothing of ours runs at call time outside that callable,
so the installed bytecode calls the same code a fresh compile would.

What PyTorch leaves out, and what covers it here:

- Its key is the function's qualified name and first line (`Llama.forward`), not the
  backend: an entry is stored and loaded only for this backend, under SHA-256 of that
  name, the backend's options, our environment (versions, our source hash, JAX flags,
  kernel mode: `program_cache.environment_key`, `graph_cache.key_tag`) and the hashes of
  Dynamo's and AOTAutograd's configuration.
- It drops the guards that compare object identities (`ID_MATCH`, `CLOSURE_MATCH`,
  `DICT_VERSION`, `WEAKREF_ALIVE` and those built on them: which function `F.silu` or a
  global `rotate` is, which module `torch` is). Each dropped guard's object is recorded
  here by what it is (a module by name; a function by module, qualified name and a hash
  of its code; a builtin or class by module and name) and looked up again by the guard's
  own source (`G['rotate']`, `L['self'].act`) before an entry is installed: a different
  object misses. A function compiled with a dropped guard on an object that has no such
  description (an arbitrary instance, a dictionary's version) is not stored.
- The source hashes of every inlined function are PyTorch's own check (a changed
  `forward` misses); tensor guards (shapes, dtypes, devices, strides, requires_grad) and
  value guards (ints, floats, strings, the global grad/autocast state) are kept.

Entries live in `<cache folder>/dynamo/*.dynamo` through `VerifiedDiskCache`; a corrupt
entry, one that does not unpickle or fails to install is deleted with a warning and the
function is traced afresh. An entry is written after every frame Dynamo compiles for a
function (a later recompile rewrites it with both). Enabling turns on PyTorch's flag for
the whole process: other backends compiled in it drop the same guards (and are not
stored); hence opt-in.

torch 2.13 problems worked around here (docs/design/device.md, "A second process"): the
first trace after an install in the same module reused Dynamo's global names
(`_advance_unique_ids`); guard states that do not pickle, and graphs Dynamo itself keeps
out of the package (a compiled optimizer step: "named parameters due to static
addresses"), stopped the compile (`_unpicklable_guards_leave_the_package_out`: compiled,
not stored). Elsewhere: AOTAutograd's key without Dynamo's per-process graph name
(`graph_cache`), `empty_like(x, device="meta")` on the device (`eager/registration.py`),
`scan_layers`' class importable by name (`scan.py`).
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import functools
import hashlib
import os
import pickle
import types
import warnings

import torch

from tpu_backend.compile import cache as _cache

SUFFIX = ".dynamo"
ENV = "TPU_DYNAMO_CACHE"
_FORMAT = 1

# The backend key of the `torch.compile` call being set up (None: not ours)
_LOADING: contextvars.ContextVar[str | None] = contextvars.ContextVar("tpu_dynamo_cache_loading", default=None)
# The entry that call loaded (its key), if any
_LOADED: contextvars.ContextVar[str | None] = contextvars.ContextVar("tpu_dynamo_cache_loaded", default=None)
_installed = False


def requested() -> bool:
    return os.environ.get(ENV, "off").strip().lower() not in _cache._DISABLED_VALUES


def enabled() -> bool:
    return _installed and _cache.cache_dir() is not None


def enable() -> bool:
    """Turn the cache on for this process (before `torch.compile`). False when this torch
    lacks caching precompile, or the disk cache or AOTAutograd's cache is off."""
    global _installed
    if _installed:
        return True
    from tpu_backend.compile import graph_cache

    if _cache.cache_dir() is None or not graph_cache.enabled():
        return False  # nothing to store the backend's part in (TPU_CACHE_DIR / TPU_AOT_CACHE off)
    try:
        from torch._dynamo import eval_frame, guards, package, precompile_context
    except ImportError:
        return False
    needed = [
        (package, "DiskDynamoCache"),
        (package, "PrecompileCacheEntry"),
        (eval_frame, "OptimizeContext"),
        (precompile_context, "PrecompileContext"),
        (guards, "pickle_guards_state"),
    ]
    if any(not hasattr(owner, name) for owner, name in needed) or not hasattr(
        torch._dynamo.config, "caching_precompile"
    ):
        return False
    _unpicklable_guards_leave_the_package_out(guards)
    store = _TpuDynamoStore()
    package.DynamoCache = store  # read by name at compile and load time
    precompile_context.DynamoCache = store  # torch.compiler.save_cache_artifacts
    _wrap_optimize_context(eval_frame.OptimizeContext)
    torch._dynamo.config.caching_precompile = True
    _installed = True
    return True


def store() -> _cache.VerifiedDiskCache | None:
    """Dynamo's entries inside the current cache folder (None when the disk layer is off)."""
    return _cache.sub_store("dynamo", SUFFIX)


def counters() -> dict[str, int]:
    """Loads in this process: hit, miss, identity_miss (a dropped guard's object changed),
    rejected (PyTorch refused the entry: changed source, versions), saved, unstorable."""
    from torch._dynamo.utils import counters as torch_counters

    found = torch_counters["tpu_dynamo_cache"]
    return {name: found.get(name, 0) for name in ("hit", "miss", "identity_miss", "rejected", "saved", "unstorable")}


def _count(name: str) -> None:
    from torch._dynamo.utils import counters as torch_counters

    torch_counters["tpu_dynamo_cache"][name] += 1


# --------------------------------------------------------------------- keys


def _backend_key(compiler) -> str | None:
    """The key of a `torch.compile` backend if it is ours (with its options), else None."""
    from tpu_backend.compile.backend import BACKEND_NAME, tpu

    if getattr(compiler, "compiler_fn", compiler) is not tpu:
        return None
    kwargs = getattr(compiler, "kwargs", {})
    return f"backend {BACKEND_NAME} {sorted(kwargs.items())!r} dynamic {getattr(compiler, 'dynamic', None)!r}"


def _entry_key(source_id: str, backend_key: str) -> str:
    from tpu_backend.compile import graph_cache, program_cache

    text = "\n".join(
        [
            f"format {_FORMAT}",
            source_id,
            backend_key,
            program_cache.environment_key(),
            graph_cache.key_tag(),
            f"dynamo config {_config_text(torch._dynamo.config)}",
            f"functorch config {_config_text(torch._functorch.config)}",
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _config_text(config) -> str:
    """A configuration module's settings that are not marked compile-ignored, in a stable
    order (torch's own `get_hash` reprs sets as they iterate: a new hash per process)."""

    def stable(value):
        if isinstance(value, (set, frozenset)):
            return sorted(map(stable, value), key=repr)
        if isinstance(value, dict):
            return sorted(((stable(k), stable(v)) for k, v in value.items()), key=repr)
        if isinstance(value, (list, tuple)):
            return [stable(v) for v in value]
        return value

    settings = config._get_dict(ignored_keys=list(config._compile_ignored_keys), readonly_values=True)
    text = repr(sorted((name, stable(value)) for name, value in settings.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------- dropped guards

_DROPPED_TYPES = ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")


def _dropped(entry) -> bool:
    """PyTorch's own rule (torch/_dynamo/guards.py, CheckFunctionManager) for the guards
    caching precompile leaves out."""
    derived = entry.derived_guard_types
    return entry.guard_type in _DROPPED_TYPES or "ID_MATCH" in derived or "DICT_VERSION" in derived


def _code_hash(code: types.CodeType) -> str:
    """A hash of what a code object does (`marshal` output varies between processes)."""

    def text(value):
        if isinstance(value, types.CodeType):
            parts = (value.co_code, value.co_names, value.co_varnames, value.co_freevars, value.co_cellvars)
            return ("code", value.co_qualname, parts, [text(c) for c in value.co_consts])
        if isinstance(value, frozenset):
            return ("frozenset", sorted(map(repr, value)))
        if isinstance(value, tuple):
            return tuple(text(v) for v in value)
        return value

    return hashlib.sha256(repr(text(code)).encode()).hexdigest()[:24]


_BUILTIN_KINDS = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)


def describe(value) -> tuple | None:
    """What `value` is, in terms another process can check; None when it cannot be told."""
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.FunctionType):
        return ("function", value.__module__, value.__qualname__, _code_hash(value.__code__))
    if isinstance(value, _BUILTIN_KINDS):
        owner = getattr(value, "__self__", None)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            return None  # a method bound to some instance
        return ("builtin", getattr(value, "__module__", None), value.__qualname__, describe(owner) if owner else None)
    if isinstance(value, type):
        return ("class", value.__module__, value.__qualname__)
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return ("op", str(value))
    if isinstance(value, types.MethodType) and isinstance(value.__self__, (types.ModuleType, type)):
        return ("method", describe(value.__func__), describe(value.__self__))
    if value is None or type(value) in (bool, int, float, str):
        return ("value", type(value).__name__, value)
    return None


class _Scope(dict):
    """A module's globals as a guard's `G`, with the aliases Dynamo installs (imports and
    the builtins dictionary) filled in."""

    def __init__(self, module_globals: dict, imports: dict[str, str]):
        super().__init__(module_globals)
        self.imports = imports

    def __missing__(self, name):
        import importlib

        if name in self.imports:
            return importlib.import_module(self.imports[name])
        if name.startswith("__builtins_dict__"):
            return builtins.__dict__
        raise KeyError(name)


def _check(checks: list, entry, fn) -> bool:
    """Each dropped guard's object, looked up again by its source, is what it was."""
    import sys

    from torch._dynamo.guards import _get_closure_vars

    imports: dict[str, str] = {}
    for code in entry.dynamo.codes:
        imports.update(code.import_sources)
    local = {"self": fn.__self__} if isinstance(fn, types.MethodType) else {}
    scopes: dict[str, _Scope] = {}
    for module, name, expected in checks:
        if module not in sys.modules:
            return False
        if module not in scopes:
            scopes[module] = _Scope(sys.modules[module].__dict__, imports)
        try:
            # Dynamo's own source names: `G['rotate']`, `self.act`, `L['self'].act`
            value = eval(name, {**_get_closure_vars(), "G": scopes[module], "L": local}, dict(local))  # noqa: S307
        except Exception:  # noqa: BLE001 - a source that no longer resolves: a miss
            return False
        if describe(value) != expected:
            return False
    return True


def _recording_filter(package, original):
    """A guard filter that keeps what `original` keeps and records, for the package, what
    caching precompile is about to drop."""

    def guard_filter(entries):
        global _serializing
        _serializing = package  # the guard state pickled next is this package's
        _set_building(package)
        keep = list(original(entries)) if original is not None else [True] * len(entries)
        current = package._current_entry
        for kept, entry in zip(keep, entries):
            if not kept or not _dropped(entry):
                continue
            described = describe(entry.value) if entry.has_value else None
            if described is None or current is None:
                package._tpu_unstorable = f"{entry.guard_type} guard on {entry.name}"
                continue
            package._tpu_checks.append((current.python_module, entry.name, described))
        return keep

    guard_filter._tpu_recording = True
    return guard_filter


# --------------------------------------------------------------------- torch's hooks


def _wrap_optimize_context(cls) -> None:
    original = cls.__call__
    if getattr(original, "_tpu_dynamo_cache", False):
        return

    def __call__(self, fn):
        convert = getattr(self.callback, "_torchdynamo_orig_backend", None)
        backend_key = _backend_key(getattr(convert, "_torchdynamo_orig_backend", None))
        package = getattr(self, "_package", None)
        if backend_key is None or package is None or package.is_initialized() or not enabled():
            return original(self, fn)
        package._tpu_key = backend_key
        package._tpu_checks, package._tpu_unstorable = [], None
        hooks = getattr(convert, "_hooks", None)
        if hooks is not None and not getattr(hooks.guard_filter_fn, "_tpu_recording", False):
            hooks.guard_filter_fn = _recording_filter(package, hooks.guard_filter_fn)
        token, loaded = _LOADING.set(backend_key), _LOADED.set(None)
        try:
            result = original(self, fn)
        except Exception as error:  # noqa: BLE001 - an entry that fails to install: trace afresh
            key = _LOADED.get()
            if key is None:
                raise
            _LOADED.set(None)
            _discard(key, f"failed to install ({type(error).__name__}: {error})")
            with contextlib.suppress(Exception):
                package.uninstall()
            package.__init__(fn=None, dynamo=None, ignore_inlined_sources=False)
            package._tpu_key, package._tpu_checks, package._tpu_unstorable = backend_key, [], None
            _LOADING.set(None)
            return original(self, fn)
        finally:
            _LOADING.reset(token)
            loaded_key = _LOADED.get()
            _LOADED.reset(loaded)
        if loaded_key is not None:
            # PyTorch installs the entry, or refuses it (changed source) and starts afresh
            main = next(iter(package._codes.values()), None)
            _count("hit" if main is not None and main.guarded_codes else "rejected")
            _advance_unique_ids({entry.python_module for entry in package._codes.values()})
        return result

    __call__._tpu_dynamo_cache = True
    cls.__call__ = __call__


def _advance_unique_ids(module_names) -> None:
    """Move Dynamo's name counter past the globals an installed entry put in its modules.

    The entry brings names made by the first process's counter (`__builtins_dict___0`,
    `__resume_at_30_1`); this process's counter starts again at 0, and a later trace in
    the same module (a guard that fails: another shape) would make the same name and
    stop on "Name '__builtins_dict___0' already exists in scope" (torch 2.13)."""
    import itertools
    import sys

    from torch._dynamo import bytecode_transformation

    highest = -1
    for module_name in module_names:
        for name in list(vars(sys.modules.get(module_name, types))):
            if name.startswith(("__builtins_dict___", "__resume_at_")):
                number = name.rsplit("_", 1)[1]
            elif name.startswith("__compiled_fn_"):
                number = name.split("_")[4]
            else:
                continue
            if number.isdigit():
                highest = max(highest, int(number))
    counter = bytecode_transformation._unique_id_counter
    bytecode_transformation._unique_id_counter = itertools.count(max(highest + 1, next(counter)))


_serializing = None  # the package whose guards are being built (set by the guard filter)


def _unpicklable_guards_leave_the_package_out(guards) -> None:
    """Guards that do not pickle leave the function out of the cache instead of failing its
    compile. In torch 2.13 a `PackageError` while pickling them makes Dynamo bypass the
    package but leaves no guard state, and `_compile_inner` then stops on "check_fn.
    guards_state must not be None"; other errors (a `PicklingError`) stop it at once. For
    our packages the guard state is marked unstorable and left empty (it is never read:
    the package is not stored); other backends' compiles see torch's behaviour."""
    original = guards.pickle_guards_state
    if getattr(original, "_tpu_dynamo_cache", False):
        return

    @functools.wraps(original)
    def pickle_guards_state(*args, **kwargs):
        global _serializing
        package, _serializing = _serializing, None
        try:
            return original(*args, **kwargs)
        except Exception as error:
            if package is None:
                raise
            package._tpu_unstorable = f"guards do not pickle ({type(error).__name__}: {error})"
            if os.environ.get("TPU_DYNAMO_CACHE_VERBOSE"):
                warnings.warn(f"tpu_backend: Dynamo's entry not stored: {package._tpu_unstorable}", stacklevel=2)
            return b""

    pickle_guards_state._tpu_dynamo_cache = True
    guards.pickle_guards_state = pickle_guards_state

    # A graph Dynamo itself leaves out of the package (torch/_dynamo/output_graph.py,
    # `bypass_package`: "Graph contains named parameters due to static addresses", what a
    # compiled optimizer step is) gets no guard state either, and the same assertion
    # stops its compile: for our packages it is compiled and not stored.
    manager = guards.CheckFunctionManager
    init = manager.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        global _serializing
        try:
            init(self, *args, **kwargs)
            package = _serializing or _building
            if kwargs.get("save_guards") and self.guards_state is None and package is not None:
                package._tpu_unstorable = package._tpu_unstorable or "Dynamo bypassed the package"
                self.guards_state = b""
        finally:
            _serializing = None
            _set_building(None)

    __init__._tpu_dynamo_cache = True
    manager.__init__ = __init__


_building = None  # the package whose guards the current CheckFunctionManager builds


def _set_building(package) -> None:
    global _building
    _building = package


def _discard(key: str, why: str) -> None:
    disk = store()
    if disk is not None:
        disk.discard(key, why)


class _Record:
    """What one entry holds: PyTorch's entry (Dynamo's part and the bundled AOTAutograd
    entries) and the dropped guards' objects."""

    def __init__(self, source_id: str, checks: list, entry):
        self.source_id, self.checks, self.entry = source_id, checks, entry


def _make_store_class():
    from torch._dynamo.package import CompilePackage, DiskDynamoCache, PrecompileCacheEntry
    from torch._dynamo.precompile_context import PrecompileContext

    class TpuDynamoStore(DiskDynamoCache):
        """torch's `DynamoCache` while this layer is on: records, writes and loads only
        the packages of `torch.compile(backend="tpu")` (see the module docstring)."""

        def __init__(self):
            super().__init__("")

        def record_package(self, package) -> None:
            backend_key = getattr(package, "_tpu_key", None)
            if backend_key is None:
                return  # another backend's: not recorded, not stored
            super().record_package(package)
            disk = store()
            if disk is None:
                return
            if package._tpu_unstorable:
                _count("unstorable")
                return
            entry = PrecompileCacheEntry.from_cache_entry(
                package.cache_entry(), PrecompileContext._backend_artifacts_by_key
            )
            record = _Record(package.source_id, sorted(set(package._tpu_checks), key=repr), entry)
            try:
                content = pickle.dumps(record)
            except Exception as error:  # noqa: BLE001 - something in the entry does not pickle: not stored
                warnings.warn(f"tpu_backend: Dynamo's entry for {package.source_id} not stored: {error}", stacklevel=2)
                _count("unstorable")
                return
            disk.put(_entry_key(package.source_id, backend_key), content)
            _count("saved")

        def write(self, cache_entry, path: str) -> None:
            pass  # save_cache_artifacts: our entries are written as they are recorded

        def load(self, fn):
            backend_key = _LOADING.get()
            disk = store()
            if backend_key is None or disk is None:
                return None
            source_id = CompilePackage.source_id_from_fn(fn)
            key = _entry_key(source_id, backend_key)
            content = disk.get(key)
            if content is None:
                _count("miss")
                return None
            try:
                record = pickle.loads(content)
                if not isinstance(record, _Record) or record.source_id != source_id:
                    raise TypeError(type(record).__name__)
                record.entry.dynamo.check_versions()
            except Exception as error:  # noqa: BLE001 - unreadable here: rebuilt
                disk.discard(key, f"does not load ({type(error).__name__})")
                return None
            if not _check(record.checks, record.entry, fn):
                _count("identity_miss")
                return None
            for backend in record.entry.backends.values():
                PrecompileContext.record_artifact(backend)
            _LOADED.set(key)
            return record.entry

        def clear(self) -> None:
            pass

    return TpuDynamoStore


def _TpuDynamoStore():
    return _make_store_class()()


__all__ = ["counters", "describe", "enable", "enabled", "requested", "store"]
