"""`Program`: a named JAX function compiled once per input signature, with stats and dumps.

The unit the cache layer counts. A program's arguments are JAX arrays and static
values (Python numbers, bools, None, dtypes...); each distinct signature (array shapes
and dtypes, static values) gets its own executable, built ahead of time with
`jax.jit(...).lower(...).compile()` so that the cost of every build is measured and
attributed to the program's name, `cache_only()` can refuse it, and `dump()` can write
what was compiled.

Non-array outputs (None, Python numbers such as symbolic sizes an FX graph returns) are
recorded while tracing and returned as they were: XLA only returns arrays.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

import jax
import numpy as np
from jax._src.array import ArrayImpl  # the concrete array class: an exact type test is ~10x isinstance
from jax._src.random.prng import PRNGKeyArray

from tpu_backend import native, precision
from tpu_backend.compile import dump as _dump
from tpu_backend.compile import program_cache, rows
from tpu_backend.compile.cache import (
    STATS,
    CacheMissError,
    cache_dir,
    ensure_persistent_cache,
    is_cache_only,
)
from tpu_backend.eager.errors import reraise_as_torch


def is_array(value) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def _is_input_array(value) -> bool:
    """An array argument, or what one will be (`Program.compile_ahead`)."""
    return is_array(value) or isinstance(value, jax.ShapeDtypeStruct)


def _describe(value) -> tuple:
    if _is_input_array(value):
        # The sharding too: an executable is compiled for its inputs' device placement
        # (the same step on one device and on a mesh needs two; tpu_backend.distributed).
        return ("array", value.shape, value.dtype, getattr(value, "weak_type", False), getattr(value, "sharding", None))
    return ("static", type(value), value)  # 1 and 1.0 and True hash alike: keep the type


def signature(args) -> tuple:
    """What decides whether a compiled executable can be reused for `args`."""
    return tuple(_describe(a) for a in args)


def format_signature(sig: tuple) -> str:
    parts = []
    for item in sig:
        if item[0] == "array":
            parts.append(f"{item[2]}{list(item[1])}")
        else:
            parts.append(repr(item[2]))
    return "(" + ", ".join(parts) + ")"


class _Argument:
    """An output that is the program's array argument `position`, unchanged. It is handed
    back by the caller, not by XLA: an executable's outputs never share an argument's
    buffer (without donation), so XLA would copy it. A scanned forward hands every weight
    back for the backward this way: 616 MB copied per step for the 374M Llama."""

    __slots__ = ("position",)

    def __init__(self, position: int):
        self.position = position


class _Repeat:
    """An output that is the same value as the earlier output `index` (a graph that saves
    `x` and its alias `x.detach()` for the backward). XLA would return it twice, copied
    into a second buffer (1 GB for the float32 log-softmax of 8192 x 32000 logits), so the
    caller repeats the array instead."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _RowOf:
    """An output that is row `index` of the stacked array the program returns after its
    outputs, at `base` among those (`rows.py`; programs made with `rows_as_views`)."""

    __slots__ = ("base", "index")

    def __init__(self, base: int, index: int):
        self.base, self.index = base, index


class _Executable:
    """One compiled signature: the XLA executable plus where the static outputs (and the
    arguments handed back, `_Argument`) go."""

    def __init__(self, compiled, treedef, static_leaves: dict[int, Any], n_leaves: int):
        self.compiled = compiled
        self.treedef = treedef
        self.static_leaves = static_leaves
        self.n_leaves = n_leaves
        self.arguments = {i: leaf.position for i, leaf in static_leaves.items() if type(leaf) is _Argument}
        self.repeats = {i: leaf.index for i, leaf in static_leaves.items() if type(leaf) is _Repeat}
        self.rows = {i: leaf for i, leaf in static_leaves.items() if type(leaf) is _RowOf}

    def __call__(self, arrays):
        computed = self.compiled(*arrays)
        if self.static_leaves:
            static, arguments, repeats, row_of = self.static_leaves, self.arguments, self.repeats, self.rows
            bases = computed[self.n_leaves - len(static) :] if row_of else ()
            computed = iter(computed)
            leaves = []
            for i in range(self.n_leaves):
                if i not in static:
                    leaves.append(next(computed))
                elif i in arguments:
                    leaves.append(arrays[arguments[i]])
                elif i in row_of:
                    leaves.append(rows.Row(bases[row_of[i].base], row_of[i].index))
                else:
                    leaves.append(leaves[repeats[i]] if i in repeats else static[i])
            computed = leaves
        return jax.tree_util.tree_unflatten(self.treedef, computed)


_PLAIN_STATICS = (int, float, bool, str, type(None))
_JAX_ARRAY_TYPES = (ArrayImpl, PRNGKeyArray)


class _LastCall:
    """The executable a program ran last, and what a call must repeat to run it again
    without computing its signature: the same matmul precision, the same static values,
    as many arrays with the same weak types. Shapes, dtypes and shardings are checked by
    the executable itself (in C++; a mismatch raises before anything runs)."""

    __slots__ = ("precision", "statics", "weak", "executable")

    def __init__(self, precision_setting: str, statics: tuple, weak: tuple, executable: _Executable):
        self.precision, self.statics, self.weak, self.executable = precision_setting, statics, weak, executable


def _split(args) -> tuple[list, tuple, tuple]:
    """(the arrays among `args`, their weak types, the other arguments with their positions
    and types). Exact type tests: ~10x cheaper than `isinstance` against jax.Array."""
    arrays, weak, statics = [], [], []
    for i, a in enumerate(args):
        kind = type(a)
        if kind in _JAX_ARRAY_TYPES:
            arrays.append(a)
            weak.append(a.aval.weak_type)
        elif kind is np.ndarray:  # fused mode's vector of Python floats
            arrays.append(a)
            weak.append(False)
        else:
            statics.append((i, kind, a))
    return arrays, tuple(weak), tuple(statics)


python_split = _split  # the definition; the same loop in C++ (no bytecode per argument):
if hasattr(native.load(), "split_arrays"):
    _split = functools.partial(native.module.split_arrays, _JAX_ARRAY_TYPES, np.ndarray)


_LIVE: "weakref.WeakSet[Program]" = weakref.WeakSet()


def programs() -> list["Program"]:
    """The programs alive now that have compiled at least one signature (fused eager
    programs and `torch.compile(backend="tpu")` graphs), e.g. to `export()` them."""
    return [p for p in list(_LIVE) if p.signatures]


def _abstract(item: tuple):
    """A signature entry as what `jax.export` traces with: a ShapeDtypeStruct or the static value."""
    return jax.ShapeDtypeStruct(item[1], item[2], weak_type=item[3]) if item[0] == "array" else item[2]


class Program:
    """`fn(*args)` compiled per signature; counted in `compile_stats()` under `name`.

    `source` (optional text, or a function returning it, e.g. the FX graph's code) is
    written next to the StableHLO by `dump()`. `donate`: positions among the array
    arguments whose buffers the program may reuse for its outputs (the caller never
    reads them again). `identity` (optional text, or a function returning it): what
    `fn` computes, completely and stably across processes (an ATen graph's code and
    constants, a fused graph's op list); with it, a second process loads the executable
    from the lowered-program cache (`program_cache.py`) without tracing `fn`.
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        source: str | Callable[[], str] | None = None,
        donate: tuple[int, ...] = (),
        identity: str | Callable[[], str] | None = None,
        rows_as_views: bool = False,
    ):
        self.name = name
        self.fn = fn
        self.source = source
        self.donate = tuple(donate)
        self.identity = identity
        self.rows_as_views = rows_as_views
        # rows_as_views: {output index: (base ordinal, row)} once a signature is built
        self.row_outputs: Future | None = Future() if rows_as_views else None
        # keyed by (matmul precision, signature): torch.set_float32_matmul_precision recompiles
        self._executables: dict[tuple, _Executable] = {}
        self._ahead: dict[tuple, Future] = {}  # signatures compiling on a background thread
        self._last: _LastCall | None = None
        _LIVE.add(self)

    def export(self, platforms=("tpu",), *, chip: str | None = None) -> list:
        """Each compiled signature lowered for `platforms` as a `jax.export.Exported`
        (arguments: the signature's arrays; static values are baked in). For TPU alone
        the lowering sees chip `chip` (`kernels.tpu.lowering_for`). The kernel choice
        (Pallas or XLA) is the one made when the program was traced."""
        from kernels import tpu

        platforms = tuple(platforms)
        exported = []
        with tpu.lowering_for(chip) if platforms == ("tpu",) else contextlib.nullcontext():
            for matmul_precision, sig in self._executables:
                args = [_abstract(item) for item in sig]
                on_arrays, _ = self._array_function(args)
                arrays = [a for a in args if isinstance(a, jax.ShapeDtypeStruct)]
                with jax.default_matmul_precision(matmul_precision):
                    exported.append(jax.export.export(jax.jit(on_arrays), platforms=platforms)(*arrays))
        return exported

    def compiled_texts(self) -> list[str]:
        """The optimized HLO of each compiled signature, as XLA compiled it or as it was
        loaded from disk (which traces nothing): e.g. to see that a loop is still there."""
        return [executable.compiled.as_text() or "" for executable in self._executables.values()]

    def __repr__(self) -> str:
        return f"Program({self.name!r}, {len(self._executables)} compiled signature(s))"

    @property
    def signatures(self) -> list[tuple]:
        return list(dict.fromkeys(sig for _, sig in self._executables))

    def __call__(self, *args):
        try:
            return self._call(args)
        except jax.errors.JaxRuntimeError as error:  # a chip that cannot hold it: PyTorch's OutOfMemoryError
            reraise_as_torch(error)

    def _call(self, args: tuple):
        matmul_precision = precision.sync()
        arrays, weak, statics = _split(args)
        last = self._last
        if last is not None and last.precision == matmul_precision and last.weak == weak and last.statics == statics:
            try:
                result = last.executable(arrays)
            except (TypeError, ValueError):  # other shapes, dtypes or shardings: look the signature up
                pass
            else:
                STATS.record_hit(self.name)
                return result
        key = (matmul_precision, signature(args))
        executable = self._executables.get(key)
        if executable is None:  # a miss (the compile counted, ahead or here)
            executable = self._executables[key] = self._compiled_ahead(key) or self._build(key, args)
        else:
            STATS.record_hit(self.name)
        if all(isinstance(value, _PLAIN_STATICS) for _, _, value in statics):
            self._last = _LastCall(matmul_precision, statics, weak, executable)
        return executable([a for a in args if is_array(a)])

    def compile_ahead(self, args: list) -> None:
        """Start compiling for `args` (ShapeDtypeStructs with the shardings the arrays will
        have, and the static values) on a daemon thread, so that it overlaps other work
        (XLA's compile frees the GIL): the first call with that signature waits for it
        instead of compiling. A compile that fails there is done again by that call, which
        raises the error."""
        key = (precision.sync(), signature(args))
        if key in self._executables or key in self._ahead:
            return
        job: Future = Future()

        def build():
            try:
                job.set_result(self._build(key, args))  # kept by the call that takes it
            except BaseException as error:  # noqa: BLE001 - the call compiles again and raises it
                job.set_exception(error)

        self._ahead[key] = job
        threading.Thread(target=build, name=f"tpu-compile-ahead-{self.name}", daemon=True).start()

    def _compiled_ahead(self, key: tuple) -> _Executable | None:
        """The executable compiled ahead for `key` (waiting for it), or None."""
        job = self._ahead.pop(key, None) if self._ahead else None
        if job is None or job.exception() is not None:
            return None
        return job.result()

    def _build(self, key: tuple, args: tuple) -> _Executable:
        sig = key[1]
        storage = ensure_persistent_cache()
        if is_cache_only() and storage is None:
            raise CacheMissError(
                f"cache_only(): program {self.name!r} {format_signature(sig)} would compile, "
                "but the persistent compilation cache is disabled (set TPU_CACHE_DIR or call set_cache_dir())"
            )
        start = time.perf_counter()
        cached_key = self._program_cache_key(key)
        if cached_key is not None:
            found = program_cache.load(*cached_key)
            if found is not None:
                STATS.record_compile(self.name, time.perf_counter() - start, from_disk=True, loaded=True)
                self._traced_rows(found[2])
                return _Executable(*found)
        on_arrays, traced = self._array_function(args)
        lowered = jax.jit(on_arrays, donate_argnums=self.donate).lower(*[a for a in args if _is_input_array(a)])
        traced_at = time.perf_counter()
        self._traced_rows(traced["static"])
        disk_hits_before = storage.hits if storage is not None else 0
        try:
            compiled = lowered.compile()
        except CacheMissError as miss:
            raise CacheMissError(
                f"cache_only(): program {self.name!r} {format_signature(sig)} is not in the "
                f"compilation cache at {cache_dir()}; run it once without cache_only() to fill the cache",
                miss.cache_key,
            ) from None
        from_disk = storage is not None and storage.hits > disk_hits_before
        STATS.record_compile(
            self.name, time.perf_counter() - start, from_disk=from_disk, trace_seconds=traced_at - start
        )
        _dump.write_program(self.name, format_signature(sig), lowered, self.source)
        executable = _Executable(compiled, traced["treedef"], traced["static"], traced["n_leaves"])
        if cached_key is not None and not from_disk:  # see program_cache.save: fresh executables only
            program_cache.save(*cached_key, compiled, traced["treedef"], traced["static"], traced["n_leaves"])
        return executable

    def _traced_rows(self, static: dict) -> None:
        if self.row_outputs is not None and not self.row_outputs.done():
            with contextlib.suppress(InvalidStateError):  # built on two threads at once
                self.row_outputs.set_result({i: (v.base, v.index) for i, v in static.items() if type(v) is _RowOf})

    def _program_cache_key(self, key: tuple) -> tuple[str, str] | None:
        """(key, key text) of this signature in the lowered-program cache, or None when the
        program is not cached there (no identity, several devices, dumping, layer off)."""
        if self.identity is None or not program_cache.enabled() or _dump.dump_dir() is not None:
            return None
        matmul_precision, sig = key
        if not program_cache.single_device(sig) or program_cache.store() is None:
            return None
        identity = self.identity() if callable(self.identity) else self.identity
        if self.rows_as_views:
            identity += "\nrows returned as views"
        text = program_cache.key_text(identity, matmul_precision, sig, self.donate)
        return program_cache.key_of(text), text

    def _array_function(self, args):
        """(function of the array arguments only, dict its tracing fills with the output
        structure and static outputs)."""
        array_positions = [i for i, a in enumerate(args) if _is_input_array(a)]
        statics = {i: a for i, a in enumerate(args) if not _is_input_array(a)}
        traced: dict[str, Any] = {}

        def on_arrays(*arrays):
            full = list(range(len(args)))
            for i, array in zip(array_positions, arrays):
                full[i] = array
            for i, value in statics.items():
                full[i] = value
            rows.forget()
            leaves, treedef = jax.tree_util.tree_flatten(self.fn(*full), is_leaf=lambda x: x is None)
            # arguments returned unchanged (not donated ones: XLA reuses those buffers anyway)
            argument_at = {id(a): k for k, a in enumerate(arrays) if k not in self.donate}
            static, first_at = {}, {}  # first_at: id -> the first output that is this value
            bases, base_at = [], {}  # rows_as_views: the stacked arrays returned after the outputs
            row_at = _rows_worth_returning(leaves) if self.rows_as_views else {}
            for i, leaf in enumerate(leaves):
                row = row_at.get(i)
                if row is not None:
                    base, k = row
                    if id(base) not in base_at:
                        base_at[id(base)] = len(bases)
                        bases.append(base)
                    static[i] = _RowOf(base_at[id(base)], k)
                elif not isinstance(leaf, jax.Array):
                    static[i] = leaf
                elif id(leaf) in argument_at and arrays[argument_at[id(leaf)]] is leaf:
                    static[i] = _Argument(argument_at[id(leaf)])
                elif id(leaf) in first_at and leaves[first_at[id(leaf)]] is leaf:
                    static[i] = _Repeat(first_at[id(leaf)])
                else:
                    first_at[id(leaf)] = i
            traced["treedef"] = treedef
            traced["n_leaves"] = len(leaves)
            traced["static"] = static
            rows.forget()
            return [leaf for i, leaf in enumerate(leaves) if i not in static] + bases

        return on_arrays, traced


def _rows_worth_returning(leaves: list) -> dict[int, tuple]:
    """{output position: (stacked array, row)} of the outputs noted as rows (`rows.py`),
    for the stacks of which at least half the rows are outputs: returning a stack keeps all
    of it alive, so one row of a large stack stays a plain output."""
    found = {i: rows.row_of(leaf) for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)}
    found = {i: row for i, row in found.items() if row is not None}
    used: dict[int, set] = {}
    for base, k in found.values():
        used.setdefault(id(base), set()).add(k)
    return {i: (base, k) for i, (base, k) in found.items() if 2 * len(used[id(base)]) >= base.shape[0]}


__all__ = ["Program", "format_signature", "is_array", "programs", "signature"]
