"""`OpRunner`: runs one op's lowering on torch arguments, JAX results out.

Strict mode builds one `jax.jit` per (op, static arguments) and lets JAX's own cache key
on shapes and dtypes. Python floats in argument positions are passed to jit as
*dynamic* weakly-typed scalars, so a learning rate or AdamW's per-step bias correction
does not recompile every step; a lowering that branches on such a value in Python is
detected at trace time and its floats become static from then on. Fused mode records
the same bound function instead of running it (`tpu_backend/fused.py`).

An in-place op (`add_`, `_foreach_mul_`) runs its functional op's lowering and writes the
result into `self`. When nothing else can read self's arrays (each is its storage's whole
payload, held by that payload alone: not by the user through `torch.tpu.to_jax`, another
storage, or another argument of the call), strict mode runs a second jitted function of the
same template that *donates* them: XLA writes the results into self's buffers instead of
allocating new ones (on a TPU several times cheaper for an optimizer's foreach updates, and
no second copy of the state is alive). The compiled dispatch path makes the same decision
in C++ (`tpu_backend/native`).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Any, Callable

import jax
import torch
from jax._src.array import ArrayImpl as _ARRAY_IMPL  # JAX's concrete array class (an exact type test is cheap)

from tpu_backend import chip_limits, fused, native
from tpu_backend import tensor as tpu_tensor
from tpu_backend.chip_limits import TpuChipLimitError
from tpu_backend.eager import bounds, modes
from tpu_backend.eager.arguments import _Slot, _ViewSlot, fill_template, flatten_args
from tpu_backend.eager.errors import like_torch, refused_by_both, user_frame
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering, torch_dtype

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


class _NotDonatable(Exception):
    """Raised while tracing a donating program whose results are not self's shapes and
    dtypes (`int_tensor.add_(0.5)`, a half tensor plus a float one): XLA could not write
    them into self's buffers, yet would still delete them. Nothing has run at that point."""


def _self_slots(self_template) -> tuple | None:
    """The dynamic positions of an in-place op's `self` when it reads as whole storage
    arrays (a tensor, or every element of a Tensor[]); None for views and anything else
    (a view is written back by a scatter that reads the old array)."""
    if type(self_template) is _Slot:
        return (self_template.index,)
    if type(self_template) is tuple and self_template and all(type(s) is _Slot for s in self_template):
        return tuple(s.index for s in self_template)
    return None


# TPU_INPLACE_DONATION=0: in-place ops never donate (set before the first op, or call
# `clear_jit_cache()` after changing it: the compiled path keeps what it learned)
INPLACE_DONATION = os.environ.get("TPU_INPLACE_DONATION", "1") != "0"


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


# TPU_CHECK_AT_TRACE=0: an op's program is traced without asking PyTorch's kernels whether
# they accept its arguments (`errors.refused_by_both`; set before the op's first call)
CHECK_AT_TRACE = os.environ.get("TPU_CHECK_AT_TRACE", "1") != "0"
# Python numbers of each kind standing in for traced ones (their values are not known at trace
# time): a call counts as refused only if it is with both sets, so that a check of the value
# (geometric's 0 < p < 1) is never made on a stand-in.
_STAND_IN_NUMBERS = (
    {"f": 0.5, "c": 0.5j, "i": 1, "u": 1, "b": False},
    {"f": 1.5, "c": 1.5j, "i": 2, "u": 2, "b": True},
)


def _refusal(op, template_args, template_kwargs, dynamic) -> Exception | None:
    """What PyTorch raises for this call of `op` at trace time (`errors.refused_by_both`), or None."""
    refused = None
    for numbers in _STAND_IN_NUMBERS:
        args, kwargs, stood_in = _meta_arguments(template_args, template_kwargs, dynamic, numbers)
        refused = refused_by_both(op, args, kwargs)
        if refused is None or not stood_in:
            return refused
    return refused


def _meta_arguments(template_args, template_kwargs, dynamic, numbers: dict) -> tuple[list, dict, bool]:
    """An op's arguments at trace time as PyTorch sees them: meta tensors of the traced
    arrays' shapes and dtypes (a view's own geometry), `numbers` for traced Python numbers;
    and whether there were any."""
    stood_in = False

    def meta(template):
        nonlocal stood_in
        if type(template) is _Slot:
            value = dynamic[template.index]
            if value.ndim == 0 and getattr(value, "weak_type", False):  # a Python number passed traced
                stood_in = True
                return numbers[value.dtype.kind]
            return torch.empty(value.shape, dtype=torch_dtype(value.dtype), device="meta")
        if type(template) is _ViewSlot:
            shape, strides, _ = template.geometry
            return torch.empty_strided(shape, strides, dtype=torch_dtype(dynamic[template.index].dtype), device="meta")
        if type(template) is tuple:
            return [meta(t) for t in template]
        return template

    args, kwargs = [meta(t) for t in template_args], {k: meta(t) for k, t in template_kwargs if k != "key"}
    return args, kwargs, stood_in  # (without a random op's key)


def _with_key(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A random op's arguments plus its `jax.random` key: the device stream's, or one drawn from
    an explicit `torch.Generator` argument, which the lowering then sees as None (so no
    program is keyed on a generator object)."""
    from tpu_backend import random as tpu_random

    generator = kwargs.get("generator")
    if generator is not None:
        return args, dict(kwargs, generator=None, key=tpu_random.key_from_generator(generator))
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Generator):  # positional (`rrelu_with_noise`)
            args = (*args[:i], None, *args[i + 1 :])
            return args, dict(kwargs, key=tpu_random.key_from_generator(arg))
    return args, dict(kwargs, key=tpu_random.next_key())


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
        self.checks_indices = bounds.ENABLED and op in bounds.RULES  # checked by the next sync (bounds.py)
        self.plain = not (self.may_run_on_host or self.needs_rng or self.checks_indices)  # the hot path applies
        self.bound: dict[tuple, Callable] = {}  # fused mode: one bound function per template
        self.host_jitted: dict[tuple, Callable] = {}  # dtypes the chip refuses (chip_limits)
        # in-place calls: template -> (jitted lowering donating self's arrays, their
        # positions, self's dtypes it refused), or None when self is a view (`_donating`)
        self.donating: dict[tuple, tuple | None] = {}
        # The compiled path's id of this op's C++ kernel (tpu_backend/native): the runner tells
        # it which jitted (or recorded) lowering a call it handed over used (`_learn`).
        self.native_id: int | None = None
        # (template, argument types) -> the compile started by `run_once_compiled`; those that failed
        self.background: dict[tuple, Future] = {}
        self.background_failed: set[tuple] = set()
        self.pending_compile: tuple | None = None  # (key, jitted, arguments): see start_pending_compile

    def _learn(self, value) -> None:
        if self.native_id is not None:
            _native.learn(self.native_id, value, self.dynamic_floats)

    def _bound(self, template_args, template_kwargs, traced: bool = False, donated: tuple = ()) -> Callable:
        """The lowering as a function of the dynamic values alone (the template is static).
        `traced`: note the trace in `_Compiles` (strict mode's jitted functions). `donated`:
        the positions of an in-place op's self, whose shapes and dtypes the results must have."""
        lowering_fn = self.lowering.fn
        checked = CHECK_AT_TRACE  # (strict mode's trace for new shapes; fused mode's shape inference)

        def call(*dynamic):
            if traced:
                _Compiles.started = time.perf_counter()
            if checked:
                refused = _refusal(self.op, template_args, template_kwargs, dynamic)
                if refused is not None:
                    raise refused
            args, kwargs = fill_template(template_args, template_kwargs, dynamic)
            out = lowering_fn(*args, **kwargs)
            if donated:
                results = out if isinstance(out, (list, tuple)) else (out,)
                if len(results) != len(donated) or any(
                    result.shape != dynamic[i].shape or result.dtype != dynamic[i].dtype
                    for result, i in zip(results, donated)
                ):
                    raise _NotDonatable
            return out

        return call

    def _jitted(self, template_args, template_kwargs) -> Callable:
        key = (template_args, template_kwargs)
        fn = self.jitted.get(key)
        if fn is None:
            fn = self.jitted[key] = jax.jit(self._bound(template_args, template_kwargs, traced=True))
        return fn

    def _donating(self, template: tuple) -> tuple | None:
        """(jitted lowering donating self's arrays, their positions, the dtypes of self for
        which the results were not self's: `_NotDonatable`) of an in-place call's template,
        or None when self is not whole storage arrays."""
        try:
            return self.donating[template]
        except KeyError:
            pass
        positions = _self_slots(template[0][0]) if template[0] else None
        found = None
        if positions is not None:
            fn = jax.jit(self._bound(*template, traced=True, donated=positions), donate_argnums=positions)
            found = (fn, positions, set())
        self.donating[template] = found
        return found

    def _run_inplace(self, fn: Callable, template: tuple, dynamic: list):
        """Strict mode, an in-place op's functional result: through the donating program
        when nothing else can read self's arrays, else through `fn`."""
        donating = self._donating(template) if INPLACE_DONATION else None
        if donating is not None and tpu_tensor.held_only_by_their_tensors(dynamic, donating[1]):
            fn_donating, positions, refused = donating
            if not refused or dynamic[positions[0]].dtype not in refused:
                try:
                    return _run_jitted(fn_donating, dynamic)
                except _NotDonatable:  # never again for this dtype of self
                    _Compiles.started = None  # a failed trace is neither a compile nor a request
                    CACHE_STATS.python_requests -= 1
                    refused.add(dynamic[positions[0]].dtype)
        return _run_jitted(fn, dynamic)

    def __call__(self, args, kwargs, inplace: bool = False):
        """The op's JAX result(s). `inplace`: the call computes an in-place op's result,
        which is then written into `args[0]` (strict mode may donate its arrays)."""
        try:
            if self.plain and modes._mode != "debug":  # the hot path: no rng key, host check or debug check
                dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
                template = (template_args, template_kwargs)
                try:
                    if modes._mode == "strict":
                        fn = self.jitted.get(template)
                        if fn is not None:
                            if inplace:
                                out = self._run_inplace(fn, template, dynamic)
                                self._learn((fn, self.donating.get(template) if INPLACE_DONATION else None))
                                return out
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
                dynamic = None  # its references would keep self's arrays from being donated
                return self._run(args, kwargs, inplace)  # first call with this template
            if self.needs_rng:
                args, kwargs = _with_key(args, kwargs)
            if self.may_run_on_host and self.lowering.runs_on_host(args, kwargs):
                # output shape depends on values: run eagerly (a host sync)
                dynamic, template_args, template_kwargs = flatten_args(args, kwargs, False)
                dynamic = [tpu_tensor.concrete(value) for value in dynamic]  # fused mode: sync
                args, kwargs = fill_template(template_args, template_kwargs, dynamic)
                return self.lowering.fn(*args, **kwargs)
            out = self._run(args, kwargs, inplace)
            if modes._mode == "debug":
                from tpu_backend.eager.debug import debug_check

                debug_check(self.op, args, kwargs, out)
            elif self.checks_indices:
                bounds.record(self.op, args, kwargs)
            return out
        except Exception as error:  # the failure path: what PyTorch raises for this call (errors.like_torch)
            translated = like_torch(self.op, args, kwargs, error)
            if translated is error:
                raise
            raise translated  # noqa: B904 - like_torch chains (or hides) the lowering's error itself

    def _run(self, args, kwargs, inplace: bool = False):
        """Strict/debug: call the jitted lowering. Fused: record it (placeholders out)."""
        dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
        try:
            if modes._mode == "fused":
                return self._record(template_args, template_kwargs, dynamic)
            fn = self._jitted(template_args, template_kwargs)
            if inplace and modes._mode == "strict":
                return self._run_inplace(fn, (template_args, template_kwargs), dynamic)
            return _run_jitted(fn, dynamic)
        except TpuChipLimitError as error:
            if error.limit.action != "host":
                raise
            return self._on_host(error, (template_args, template_kwargs), dynamic)
        except _TRACE_ERRORS:
            if not self.dynamic_floats:
                raise
            self.dynamic_floats = False  # the lowering branches on a float: make floats static
            self.jitted.clear()
            self.donating.clear()
            self.bound.clear()
            if self.native_id is not None:
                _native.set_dynamic_floats(self.native_id, False)
            return self._run(args, kwargs, inplace)

    def run_once_compiled(self, args, kwargs):
        """Strict mode: the op's results when its program for these argument types has been
        compiled in the background, else None (the caller computes them another way: the
        fused optimizers, one parameter at a time). After the first call with new types the
        caller calls `start_pending_compile`; a compile that fails leaves None for good."""
        dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
        types = tuple((v.shape, v.dtype, v.weak_type) if type(v) is _ARRAY_IMPL else type(v) for v in dynamic)
        key = (template_args, template_kwargs, types)
        job = self.background.get(key)
        if job is None:
            self.pending_compile = (key, jax.jit(self._bound(template_args, template_kwargs)), _abstract(dynamic))
            return None
        if not job.done():
            return None
        if job.exception() is not None:
            if key not in self.background_failed:
                self.background_failed.add(key)
                warnings.warn(
                    f"tpu: {self.op}'s one program did not compile ({type(job.exception()).__name__}: "
                    f"{job.exception()}); its calls keep taking the slower path",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None
        CACHE_STATS.python_requests += 1
        CACHE_STATS.python_hits += 1
        return job.result()(*dynamic)

    def start_pending_compile(self) -> None:
        """Start the compile `run_once_compiled` found missing, counted as a miss. Called once
        the caller has done that call its other way: so the compile (or its load from disk, in
        a second process) does not compete with the first call's own programs."""
        if self.pending_compile is not None:
            key, jitted, arguments = self.pending_compile
            self.pending_compile = None
            self.background[key] = _compile_in_background(jitted, arguments)
            CACHE_STATS.misses += 1
            _count_compiled_program()

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


def _abstract(dynamic: list) -> list:
    """The call's arrays as shapes and dtypes (a compile must not keep them alive)."""
    return [
        jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding, weak_type=v.weak_type)
        if type(v) is _ARRAY_IMPL
        else v
        for v in dynamic
    ]


def _compile_in_background(jitted: Callable, arguments: list) -> Future:
    """`jitted` compiled for `arguments` on a daemon thread (XLA's compile frees the GIL; a
    process that ends first does not wait for it)."""
    job: Future = Future()

    def compile_it():
        try:
            job.set_result(jitted.lower(*arguments).compile())
        except BaseException as error:  # noqa: BLE001 - kept in the future: the op keeps its other path
            job.set_exception(error)

    threading.Thread(target=compile_it, name="tpu-background-compile", daemon=True).start()
    return job


def finish_background_compiles() -> None:
    """Wait for every program compiling in the background (benchmarks time steps after it)."""
    for op_runner in list(_RUNNERS.values()):
        for job in list(op_runner.background.values()):
            job.exception()  # waits; a failed compile leaves its op on its other path


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
        op_runner.donating.clear()
        op_runner.bound.clear()
        op_runner.host_jitted.clear()
        op_runner.background.clear()
        op_runner.background_failed.clear()
        op_runner.pending_compile = None
    if _native is not None:
        _native.forget_calls()
