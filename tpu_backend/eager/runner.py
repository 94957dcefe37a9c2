"""`OpRunner`: runs one op's lowering on torch arguments, JAX results out.

Strict mode builds one `jax.jit` per (op, static arguments) and lets JAX's own cache key
on shapes and dtypes. Python floats in argument positions are passed to jit as
*dynamic* weakly-typed scalars, so a learning rate or AdamW's per-step bias correction
does not recompile every step; a lowering that branches on such a value in Python is
detected at trace time and its floats become static from then on. Fused mode records
the same bound function instead of running it (`tpu_backend/fused.py`).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable

import jax

from tpu_backend import chip_limits, fused, native
from tpu_backend import tensor as tpu_tensor
from tpu_backend.chip_limits import TpuChipLimitError
from tpu_backend.eager import modes
from tpu_backend.eager.arguments import fill_template, flatten_args
from tpu_backend.eager.errors import user_frame
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering

_native = native.load()


class JitCacheStats:
    """Counters of the strict-mode jit cache (torch.tpu.cache_stats() reports them).
    Calls made by the compiled dispatch path's kernels are counted there (`call_counts`)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.python_requests = 0
        self.python_hits = 0
        self.misses = 0
        self.compile_seconds = 0.0
        self.evictions = 0
        if _native is not None:
            _native.reset_call_counts()

    @property
    def requests(self) -> int:
        return self.python_requests + (_native.call_counts()[0] if _native is not None else 0)

    @property
    def hits(self) -> int:
        return self.python_hits + (_native.call_counts()[1] if _native is not None else 0)

    def as_dict(self) -> dict[str, Any]:
        return dict(
            requests=self.requests,
            hits=self.hits,
            misses=self.misses,
            compile_seconds=self.compile_seconds,
            evictions=self.evictions,
        )


CACHE_STATS = JitCacheStats()
_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


class _Compiles:
    """Whether the jitted call in flight traced (so compiled) its lowering: set by the
    bound function, which only runs when JAX traces. Cheaper per call than asking the
    jitted function for its cache size before and after."""

    started: float | None = None


def _run_jitted(fn: Callable, dynamic: list):
    """Call a jitted lowering, counting a miss (and its compile time) when JAX compiles."""
    CACHE_STATS.python_requests += 1
    _Compiles.started = None
    out = fn(*dynamic)
    if tpu_tensor.SYNC_EACH_COMPUTATION:  # multi-process CPU runs (see tensor.py)
        jax.block_until_ready(out)
    if _Compiles.started is None:
        CACHE_STATS.python_hits += 1
    else:
        _note_native_compile()
    return out


def _note_native_compile() -> None:
    """A jitted call traced (so compiled): count the miss and its compile time. Called by the
    compiled path's kernels too (they count requests and hits themselves)."""
    CACHE_STATS.misses += 1
    CACHE_STATS.compile_seconds += time.perf_counter() - _Compiles.started
    _Compiles.started = None
    _count_compiled_program()


class OpRunner:
    """Runs one ATen op's lowering on torch arguments; JAX results out.

    Holds the op's jitted functions, one per static-argument template (JAX's own cache
    then keys on shapes and dtypes). Kernels close over their runner, so the hot path
    never hashes the OpOverload.
    """

    def __init__(self, op, lowering: Lowering):
        self.op = op
        self.lowering = lowering
        self.dynamic_floats = True  # turned off if the lowering needs concrete floats
        self.jitted: dict[tuple, Callable] = {}
        # Decided once, not per call: whether a call needs the host check or an rng key.
        self.may_run_on_host = lowering.data_dependent or lowering.data_dependent_when is not None
        self.needs_rng = lowering.needs_rng
        self.plain = not (self.may_run_on_host or self.needs_rng)  # the hot path applies
        self.bound: dict[tuple, Callable] = {}  # fused mode: one bound function per template
        self.host_jitted: dict[tuple, Callable] = {}  # dtypes the chip refuses (chip_limits)
        # The compiled path's id of this op's C++ kernel (tpu_backend/native): the runner tells
        # it which jitted (or recorded) lowering a call it handed over used (`_learn`).
        self.native_id: int | None = None

    def _learn(self, value) -> None:
        if self.native_id is not None:
            _native.learn(self.native_id, value, self.dynamic_floats)

    def _bound(self, template_args, template_kwargs, traced: bool = False) -> Callable:
        """The lowering as a function of the dynamic values alone (the template is static).
        `traced`: note the trace in `_Compiles` (strict mode's jitted functions)."""
        lowering_fn = self.lowering.fn

        def call(*dynamic):
            if traced:
                _Compiles.started = time.perf_counter()
            args, kwargs = fill_template(template_args, template_kwargs, dynamic)
            return lowering_fn(*args, **kwargs)

        return call

    def _jitted(self, template_args, template_kwargs) -> Callable:
        key = (template_args, template_kwargs)
        fn = self.jitted.get(key)
        if fn is None:
            fn = self.jitted[key] = jax.jit(self._bound(template_args, template_kwargs, traced=True))
        return fn

    def __call__(self, args, kwargs):
        if self.plain and modes._mode != "debug":  # the hot path: no rng key, host check or debug check
            dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
            template = (template_args, template_kwargs)
            try:
                if modes._mode == "strict":
                    fn = self.jitted.get(template)
                    if fn is not None:
                        out = _run_jitted(fn, dynamic)
                        self._learn(fn)
                        return out
                else:
                    found = self.bound.get(template)
                    if found is not None:
                        out = fused.record(found[0], found[1], dynamic)
                        self._learn(found)
                        return out
            except _TRACE_ERRORS:
                pass  # a float the lowering branches on: `_run` makes floats static
            except TpuChipLimitError as error:  # new dtypes the chip cannot compile
                return self._on_host(error, template, dynamic)
            return self._run(args, kwargs)  # first call with this template
        if self.needs_rng:
            from tpu_backend import random as tpu_random

            kwargs = dict(kwargs, key=tpu_random.next_key())
        if self.may_run_on_host and self.lowering.runs_on_host(args, kwargs):
            # output shape depends on values: run eagerly (a host sync)
            dynamic, template_args, template_kwargs = flatten_args(args, kwargs, False)
            dynamic = [tpu_tensor.concrete(value) for value in dynamic]  # fused mode: sync
            args, kwargs = fill_template(template_args, template_kwargs, dynamic)
            return self.lowering.fn(*args, **kwargs)
        out = self._run(args, kwargs)
        if modes._mode == "debug":
            from tpu_backend.eager.debug import debug_check

            debug_check(self.op, args, kwargs, out)
        return out

    def _run(self, args, kwargs):
        """Strict/debug: call the jitted lowering. Fused: record it (placeholders out)."""
        dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
        try:
            if modes._mode == "fused":
                return self._record(template_args, template_kwargs, dynamic)
            return _run_jitted(self._jitted(template_args, template_kwargs), dynamic)
        except TpuChipLimitError as error:
            if error.limit.action != "host":
                raise
            return self._on_host(error, (template_args, template_kwargs), dynamic)
        except _TRACE_ERRORS:
            if not self.dynamic_floats:
                raise
            self.dynamic_floats = False  # the lowering branches on a float: make floats static
            self.jitted.clear()
            self.bound.clear()
            if self.native_id is not None:
                _native.set_dynamic_floats(self.native_id, False)
            return self._run(args, kwargs)

    def _on_host(self, error: TpuChipLimitError, template: tuple, dynamic: list):
        """Eager: run the lowering on the host's CPU device (the chip's compiler refuses these
        dtypes, `tpu_backend/chip_limits.py`), results back on the default device."""
        if error.limit.action != "host":
            raise error.with_traceback(None)
        chip_limits.warn_on_host(error, user_frame())
        modes.CPU_FALLBACK_COUNTS[str(self.op)] += 1
        host, device = chip_limits.host_device(), jax.devices()[0]
        fn = self.host_jitted.get(template)
        if fn is None:
            fn = self.host_jitted[template] = jax.jit(self._bound(*template))
        values = [tpu_tensor.concrete(v) for v in dynamic]  # fused mode: pending inputs computed
        values = [jax.device_put(v, host) if isinstance(v, jax.Array) else v for v in values]
        with chip_limits.on_host():
            out = fn(*values)
        return jax.device_put(out, device)

    def _record(self, template_args, template_kwargs, dynamic):
        """Fused mode: record the bound lowering; the (op, template) key and the bound
        function are built once per template, not per call."""
        template = (template_args, template_kwargs)
        found = self.bound.get(template)
        if found is None:
            found = self.bound[template] = (fused.OpKey(self.op, *template), self._bound(*template))
        return fused.record(found[0], found[1], dynamic)


_RUNNERS: dict = {}


def runner(op) -> OpRunner:
    """The (cached) runner of a table op."""
    found = _RUNNERS.get(op)
    if found is None:
        found = _RUNNERS[op] = OpRunner(op, JAX_LOWERINGS[op])
    return found


def execute(op, args, kwargs):
    """The seam every mode shares: run table op `op` on torch arguments, JAX results out."""
    return runner(op)(args, kwargs)


# Each compiled XLA executable keeps memory mappings alive; a process that compiles without
# bound (a sweep over every op and shape) exhausts vm.max_map_count (65530) and dies in LLVM
# with "Cannot allocate memory". So past this many programs compiled since the last flush,
# every cached program is dropped and recompiled on next use: a working set smaller than the
# limit costs one recompile per `limit` compiles. Counted on misses only: hits pay nothing.
MAX_LIVE_PROGRAMS = int(os.environ.get("TPU_MAX_LIVE_PROGRAMS", "2000"))
_live_programs = 0
_warned_eviction = False


def _count_compiled_program() -> None:
    global _live_programs
    _live_programs += 1
    if _live_programs > MAX_LIVE_PROGRAMS:
        evict_compiled_programs()


def evict_compiled_programs() -> None:
    """Drop every strict-mode program and JAX's caches (counted in cache_stats()["evictions"])."""
    global _warned_eviction
    CACHE_STATS.evictions += 1
    if not _warned_eviction:
        _warned_eviction = True
        warnings.warn(
            f"tpu: more than {MAX_LIVE_PROGRAMS} programs compiled; dropping the jit caches "
            "(set TPU_MAX_LIVE_PROGRAMS to change the bound)",
            RuntimeWarning,
            stacklevel=2,
        )
    clear_jit_cache()
    jax.clear_caches()


def live_programs() -> int:
    """Programs compiled by strict mode since the last flush (bounded by MAX_LIVE_PROGRAMS)."""
    return _live_programs


def clear_jit_cache() -> None:
    """Forget the per-op jitted functions (they are rebuilt on next use)."""
    global _live_programs
    _live_programs = 0
    for op_runner in _RUNNERS.values():
        op_runner.jitted.clear()
        op_runner.bound.clear()
        op_runner.host_jitted.clear()
    if _native is not None:
        _native.forget_calls()
