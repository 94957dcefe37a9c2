"""The eager dispatcher: connects the ATen -> JAX table to the PrivateUse1 key.

For every functional overload in `tpu_backend.ops.registry.JAX_LOWERINGS` this module
registers a PrivateUse1 kernel, plus the in-place (`add_`) and `.out` variants derived
from it (compute the functional result, write it back through `tensor.write`). Ops with
no kernel reach one catch-all fallback, which tries, in order: the functional form of an
in-place/out op, PyTorch's own decomposition (`torch._decomp`), the opt-in CPU fallback,
and otherwise raises "no tpu lowering for aten.X (called from <file:line>)".

The seam for other execution modes is `execute(op, args, kwargs)` (an `OpRunner` per
op): it turns torch arguments into (dynamic JAX values, hashable static template) with
`flatten_args`, runs the lowering, and returns JAX results; kernels wrap those as tpu
tensors (`tensor.wrap`) or write them into existing ones (`tensor.write`). Part 2's lazy
"fused" mode replaces what `OpRunner._run` does (record instead of run, results as
`jax.eval_shape` placeholders) and keeps the table, `flatten_args` / `fill_template`,
the variant kernels and the fallback unchanged.

Strict mode builds one `jax.jit` per (op, static arguments) and lets JAX's own cache key
on shapes and dtypes. Python floats in argument positions are passed to jit as
*dynamic* weakly-typed scalars, so a learning rate or AdamW's per-step bias correction
does not recompile every step; a lowering that branches on such a value in Python is
detected at trace time and its floats become static from then on.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering, on_register

aten = torch.ops.aten

# ----------------------------------------------------------------------------- modes

EAGER_MODES = ("strict", "debug", "fused")
_mode = os.environ.get("TPU_EAGER_MODE", "strict")
if _mode not in EAGER_MODES:
    raise ValueError(f"TPU_EAGER_MODE={_mode!r}: expected one of {', '.join(EAGER_MODES)}")


def set_eager_mode(mode: str) -> None:
    """Choose how ops run: "strict" (jit-cached, fast), "debug" (synchronous, checked) or
    "fused" (experimental: recorded lazily, one program per step; see tpu_backend/fused.py)."""
    global _mode
    if mode not in EAGER_MODES:
        raise ValueError(f"eager mode {mode!r} is not one of {', '.join(EAGER_MODES)}")
    from tpu_backend import fused

    if mode == "fused":
        fused.enable()
    elif _mode == "fused":
        fused.disable()
    _mode = mode


def get_eager_mode() -> str:
    return _mode


_cpu_fallback = os.environ.get("TPU_CPU_FALLBACK", "0").lower() in ("1", "true", "yes", "on")
CPU_FALLBACK_COUNTS: collections.Counter = collections.Counter()
DECOMPOSED_COUNTS: collections.Counter = collections.Counter()  # ops run via torch._decomp


def set_cpu_fallback(enabled: bool) -> None:
    """Run ops with no tpu lowering on CPU copies (with a warning) instead of raising."""
    global _cpu_fallback
    _cpu_fallback = bool(enabled)


def cpu_fallback_counts() -> dict[str, int]:
    """How many times each op fell back to CPU in this process."""
    return dict(CPU_FALLBACK_COUNTS)


# ----------------------------------------------------------------------------- errors

_INTERNAL_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, jax, sys.modules["tpu_backend"]) if m.__file__
) + (os.path.dirname(os.__file__) + os.sep,)


def user_frame() -> str:
    """'file:line' of the innermost caller outside torch, jax, tpu_backend and the stdlib."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_INTERNAL_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    if threading.current_thread() is not threading.main_thread():
        # Backward runs on autograd's device thread, which has no user frames.
        return "the backward pass; torch.autograd.set_detect_anomaly(True) shows the forward line"
    return "<unknown>"


class TpuLoweringError(NotImplementedError):
    """An ATen op reached the tpu device and nothing could run it."""


class TpuDebugError(FloatingPointError):
    """Debug mode found a NaN/Inf or a shape/dtype that disagrees with PyTorch's meta."""


# ----------------------------------------------------------------------------- args


class _Slot:
    """Placeholder for the i-th dynamic value (array or float) in a static template."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<dynamic {self.index}>"


_SLOTS: list[_Slot] = []


def _slot(index: int) -> _Slot:
    while len(_SLOTS) <= index:
        _SLOTS.append(_Slot(len(_SLOTS)))
    return _SLOTS[index]


def _flatten(value, dynamic: list, dynamic_floats: bool):
    if isinstance(value, torch.Tensor):
        payload = tpu_tensor.payload_if_tpu(value)
        if payload is not None:
            dynamic.append(tpu_tensor.read(value, payload))
        elif value.dim() == 0:  # CPU scalar tensors mix with device tensors, as on CUDA
            dynamic.append(tpu_tensor.cpu_to_jax(value))
        else:
            raise RuntimeError(
                f"expected all tensors on tpu, got a {value.device} tensor of shape {tuple(value.shape)} "
                f"(called from {user_frame()}); move it with .to('tpu')"
            )
        return _slot(len(dynamic) - 1)
    if isinstance(value, jax.Array):  # e.g. the rng key
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if isinstance(value, (list, tuple)):
        return tuple(_flatten(v, dynamic, dynamic_floats) for v in value)
    if type(value) is float and dynamic_floats:
        dynamic.append(value)
        return _slot(len(dynamic) - 1)
    if isinstance(value, torch.Generator):
        return None  # device randomness comes from tpu_backend.random's key stream
    return value


def flatten_args(args, kwargs, dynamic_floats: bool = True):
    """Split torch arguments into (dynamic values, hashable static template of args, kwargs)."""
    dynamic: list = []
    template_args = tuple([_flatten(a, dynamic, dynamic_floats) for a in args])
    template_kwargs = tuple([(k, _flatten(v, dynamic, dynamic_floats)) for k, v in kwargs.items()]) if kwargs else ()
    return dynamic, template_args, template_kwargs


def _fill(template, dynamic):
    if type(template) is _Slot:
        return dynamic[template.index]
    if type(template) is tuple:
        return [_fill(t, dynamic) for t in template]
    return template


def fill_template(template_args, template_kwargs, dynamic):
    """Inverse of `flatten_args`: the lowering's arguments with dynamic values put back."""
    args = [_fill(t, dynamic) for t in template_args]
    kwargs = {k: _fill(t, dynamic) for k, t in template_kwargs}
    return args, kwargs


# ----------------------------------------------------------------------------- executors


class JitCacheStats:
    """Counters of the strict-mode jit cache (torch.tpu.cache_stats() reports them)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.hits = 0
        self.misses = 0
        self.compile_seconds = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(
            requests=self.requests, hits=self.hits, misses=self.misses, compile_seconds=self.compile_seconds
        )


CACHE_STATS = JitCacheStats()
_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def _run_jitted(fn: Callable, dynamic: list):
    """Call a jitted lowering, counting a miss (and its compile time) when JAX compiles."""
    CACHE_STATS.requests += 1
    before = fn._cache_size()
    start = time.perf_counter()
    out = fn(*dynamic)
    if tpu_tensor.SYNC_EACH_COMPUTATION:  # multi-process CPU runs (see tensor.py)
        jax.block_until_ready(out)
    if fn._cache_size() != before:
        CACHE_STATS.misses += 1
        CACHE_STATS.compile_seconds += time.perf_counter() - start
    else:
        CACHE_STATS.hits += 1
    return out


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

    def _jitted(self, template_args, template_kwargs) -> Callable:
        key = (template_args, template_kwargs)
        fn = self.jitted.get(key)
        if fn is None:
            lowering_fn = self.lowering.fn

            def call(*dynamic):
                args, kwargs = fill_template(template_args, template_kwargs, dynamic)
                return lowering_fn(*args, **kwargs)

            fn = self.jitted[key] = jax.jit(call)
        return fn

    def __call__(self, args, kwargs):
        if self.lowering.needs_rng:
            from tpu_backend import random as tpu_random

            kwargs = dict(kwargs, key=tpu_random.next_key())
        if self.lowering.runs_on_host(args, kwargs):
            # output shape depends on values: run eagerly (a host sync)
            dynamic, template_args, template_kwargs = flatten_args(args, kwargs, False)
            dynamic = [tpu_tensor.concrete(value) for value in dynamic]  # fused mode: sync
            args, kwargs = fill_template(template_args, template_kwargs, dynamic)
            return self.lowering.fn(*args, **kwargs)
        out = self._run(args, kwargs)
        if _mode == "debug":
            _debug_check(self.op, args, kwargs, out)
        return out

    def _run(self, args, kwargs):
        dynamic, template_args, template_kwargs = flatten_args(args, kwargs, self.dynamic_floats)
        if _mode == "fused":
            return self._record(dynamic, template_args, template_kwargs, args, kwargs)
        fn = self._jitted(template_args, template_kwargs)
        try:
            return _run_jitted(fn, dynamic)
        except _TRACE_ERRORS:
            if not self.dynamic_floats:
                raise
            self.dynamic_floats = False  # the lowering branches on a float: make floats static
            self.jitted.clear()
            return self._run(args, kwargs)

    def _record(self, dynamic, template_args, template_kwargs, args, kwargs):
        """Fused mode: add this op to the recorded graph; placeholders out."""
        from tpu_backend import fused

        lowering_fn = self.lowering.fn

        def call(*values):
            call_args, call_kwargs = fill_template(template_args, template_kwargs, values)
            return lowering_fn(*call_args, **call_kwargs)

        try:
            return fused.record((self.op, template_args, template_kwargs), call, dynamic)
        except _TRACE_ERRORS:
            if not self.dynamic_floats:
                raise
            self.dynamic_floats = False  # the lowering branches on a float: make floats static
            self.jitted.clear()
            return self._run(args, kwargs)


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


def _wrap_outputs(out):
    if isinstance(out, (tuple, list)):
        return tuple(_wrap_outputs(o) for o in out)
    if isinstance(out, (jax.Array, tpu_tensor.LazyValue)):
        return tpu_tensor.wrap(out)
    return out


def check_device_index(device) -> None:
    """Factory ops name a device; only tpu:0 exists."""
    if device is not None and torch.device(device).index not in (None, 0):
        raise RuntimeError(
            f"device {device} does not exist: the tpu device has one index (tpu:0); "
            "use JAX sharding (a mesh) for several chips"
        )


def _functional_kernel(op):
    run = runner(op)

    def kernel(*args, **kwargs):
        if "device" in kwargs:
            check_device_index(kwargs["device"])
        return _wrap_outputs(run(args, kwargs))

    return kernel


# ----------------------------------------------------------------------------- debug mode


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _leaves(out) -> list:
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _leaves(o)]
    return [out]


def _debug_check(op, args, kwargs, out) -> None:
    """Synchronise, then compare with PyTorch's meta kernel and look for NaN/Inf."""
    where = user_frame()
    results = [o for o in _leaves(out) if isinstance(o, jax.Array)]
    jax.block_until_ready(results)
    kwargs = {k: v for k, v in kwargs.items() if k != "key"}
    try:
        expected = _leaves(op(*_to_meta(args), **_to_meta(kwargs)))
    except Exception:  # no meta kernel: nothing to compare against
        expected = None
    if expected is not None:
        expected = [e for e in expected if isinstance(e, torch.Tensor)]
        got = [(tuple(r.shape), tpu_tensor.torch_dtype(r.dtype)) for r in results]
        want = [(tuple(e.shape), e.dtype) for e in expected]
        if got != want:
            raise TpuDebugError(
                f"tpu lowering of {op} returned (shape, dtype) {got}, PyTorch's meta says {want} "
                f"(called from {where}); fix the lowering in tpu_backend/ops/"
            )
    inputs_finite = all(
        bool(jnp.isfinite(a).all())
        for a in _leaves(flatten_args(args, kwargs, False)[0])
        if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jnp.inexact)
    )
    for index, r in enumerate(results):
        if jnp.issubdtype(r.dtype, jnp.inexact) and not bool(jnp.isfinite(r).all()) and inputs_finite:
            raise TpuDebugError(
                f"{op} produced NaN/Inf in output {index} from finite inputs (called from {where})"
            )


# ----------------------------------------------------------------------------- variants


_INPLACE_NAMES = {"normal_functional": "normal_"}


def _packet_and_overload(op) -> tuple[str, str]:
    return op._schema.name.split("::")[1], op._overloadname


def _namespace(op):
    return getattr(torch.ops, op._schema.name.split("::")[0])


def _argument_signature(schema, skip_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not (skip_out and a.is_out)]


def _same_arguments_overload(packet, op, preferred: str):
    """The overload of `packet` with `op`'s argument names and types (by name first)."""
    if packet is None:
        return None
    wanted = _argument_signature(op._schema, False)
    names = packet.overloads()
    for name in sorted(names, key=lambda n: n != preferred):
        candidate = getattr(packet, name)
        if _argument_signature(candidate._schema, False) == wanted:
            return candidate
    return None


def inplace_variant(op):
    """`aten.add_.Tensor` for `aten.add.Tensor` (None when ATen has none)."""
    name, overload = _packet_and_overload(op)
    packet = getattr(_namespace(op), _INPLACE_NAMES.get(name, name + "_"), None)
    return _same_arguments_overload(packet, op, overload)


def out_variant(op):
    """`aten.add.out` for `aten.add.Tensor`: same non-out arguments, plus `out=` tensors."""
    name, _ = _packet_and_overload(op)
    packet = getattr(_namespace(op), name)
    wanted = _argument_signature(op._schema, False)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _argument_signature(schema, True) == wanted:
            return candidate
    return None


def functional_variant(op):
    """The functional overload an in-place or out op is a variant of (None if not found)."""
    name, overload = _packet_and_overload(op)
    schema = op._schema
    if any(a.is_out for a in schema.arguments):
        wanted = _argument_signature(schema, True)
        packet = getattr(_namespace(op), name, None)
        for candidate_name in packet.overloads() if packet else ():
            candidate = getattr(packet, candidate_name)
            args = candidate._schema.arguments
            if not any(a.is_out for a in args) and _argument_signature(candidate._schema, False) == wanted:
                return candidate
        return None
    if name.endswith("_"):
        base = {v: k for k, v in _INPLACE_NAMES.items()}.get(name, name[:-1])
        return _same_arguments_overload(getattr(_namespace(op), base, None), op, overload)
    return None


def _out_names(op) -> list[str]:
    return [a.name for a in op._schema.arguments if a.is_out]


def write_result(dst: torch.Tensor, value: jax.Array) -> None:
    """Write `value` into `dst`, resizing `dst` first when its shape differs (out= semantics)."""
    if tuple(dst.shape) != tuple(value.shape):
        from tpu_backend.core_ops import resize_

        resize_(dst, value.shape)
    tpu_tensor.write(dst, value)


def _inplace_kernel(functional):
    run = runner(functional)

    def kernel(self, *args, **kwargs):
        result = run((self, *args), kwargs)
        if isinstance(self, (list, tuple)):  # _foreach_*_: one result per list element, returns ()
            for tensor, value in zip(self, result):
                tpu_tensor.write(tensor, value)
            return None
        is_array = isinstance(result, (jax.Array, tpu_tensor.LazyValue))
        result_dtype = tpu_tensor.torch_dtype(result.dtype) if is_array else self.dtype
        if result_dtype != self.dtype and not torch.can_cast(result_dtype, self.dtype):
            raise RuntimeError(  # ATen's rule for in-place ops, e.g. int_tensor.mul_(0.5)
                f"{functional}: result type {result_dtype} can't be cast to the in-place "
                f"output type {self.dtype} (called from {user_frame()})"
            )
        tpu_tensor.write(self, result)
        return self

    return kernel


def _out_kernel(functional, out_op):
    names = _out_names(out_op)
    run = runner(functional)

    def kernel(*args, **kwargs):
        outs = [kwargs.pop(name) for name in names]
        result = run(args, kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for dst, value in zip(outs, results):
            write_result(dst, value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


# ----------------------------------------------------------------------------- registration

_LIBRARIES: dict[str, torch.library.Library] = {}


def _opaque_to_dynamo(kernel: Callable) -> Callable:
    """Hide a device kernel from Dynamo. When code between compiled graphs (a graph
    break, `loss.backward()` inside a compiled step) runs eagerly on tpu tensors, Dynamo
    would otherwise try to trace our Python kernels and the JAX code under them."""
    return torch.compiler.disable(kernel, recursive=True)
_REGISTERED: set = set()


def register_kernel(op, kernel: Callable, key: str = "PrivateUse1") -> bool:
    """Register `kernel` for `op` on `key` once; returns False if it was already there."""
    if (op, key) in _REGISTERED:
        return False
    namespace = op._schema.name.split("::")[0]
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "IMPL")
    _LIBRARIES[namespace].impl(op, _opaque_to_dynamo(kernel), key)
    _REGISTERED.add((op, key))
    return True


def _is_composite_implicit(op) -> bool:
    # A backend kernel on a CompositeImplicitAutograd op would hide its autograd formula
    # (gradients would silently stop): let those decompose and use the table in compile only.
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _functionalized_kernel(op):
    """A mutating op (native_batch_norm's running stats) run through its functional
    lowering: write the new values into the mutated arguments (see ops/norm.py)."""
    spec = JAX_LOWERINGS[op].functionalized
    run = runner(spec.functional)

    def kernel(*args, **kwargs):
        results = run(args, kwargs)
        for arg_index, out_index in spec.writes.items():
            if arg_index < len(args) and args[arg_index] is not None and results[out_index] is not None:
                tpu_tensor.write(args[arg_index], results[out_index])
        return _wrap_outputs(tuple(results[: spec.outputs]))

    return kernel


def _register_op(op) -> int:
    """Register `op`'s kernel and its derived in-place and out variants; returns how many."""
    if (op, "PrivateUse1") in _REGISTERED or _is_composite_implicit(op):
        return 0
    lowering = JAX_LOWERINGS[op]
    added = register_kernel(op, _functionalized_kernel(op) if lowering.functionalized else _functional_kernel(op))
    inplace = inplace_variant(op)
    if inplace is not None and inplace not in JAX_LOWERINGS:
        added += register_kernel(inplace, _inplace_kernel(op))
    out_op = out_variant(op)
    if out_op is not None and out_op not in JAX_LOWERINGS:
        added += register_kernel(out_op, _out_kernel(op, out_op))
    return added


def _connect_late_lowering(op, lowering: Lowering) -> None:
    if lowering.kind == "op":
        _register_op(op)


def register_table() -> int:
    """Register every table entry (functional, in-place, out) on PrivateUse1, and connect
    every lowering registered from now on as it is registered; idempotent."""
    added = sum(_register_op(op) for op in list(JAX_LOWERINGS))
    on_register(_connect_late_lowering)
    return added


# ----------------------------------------------------------------------------- fallback

_active = threading.local()


def _active_ops() -> set:
    if not hasattr(_active, "ops"):
        _active.ops = set()
    return _active.ops


def _mutated_args(op, args, kwargs) -> list[tuple[torch.Tensor, str | int]]:
    mutated = []
    for index, argument in enumerate(op._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name) if argument.kwarg_only or index >= len(args) else args[index]
            if isinstance(value, torch.Tensor):
                mutated.append(value)
    return mutated


def _via_functional(op, args, kwargs):
    """An in-place/out op whose functional form runs on tpu: compute it, then copy back."""
    functional = functional_variant(op)
    if functional is None:
        return NotImplemented
    outs = [kwargs.pop(name) for name in _out_names(op)]
    result = functional(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if outs:
        for dst, value in zip(outs, results):
            write_result(dst, tpu_tensor.read(value))
        return outs[0] if len(outs) == 1 else tuple(outs)
    self = args[0]
    tpu_tensor.write(self, tpu_tensor.read(results[0]))
    return self


def _via_decomposition(op, args, kwargs):
    decomposition = torch._decomp.decomposition_table.get(op)
    if decomposition is None:
        return NotImplemented
    DECOMPOSED_COUNTS[str(op)] += 1
    return decomposition(*args, **kwargs)


def _to_cpu(value):
    if tpu_tensor.is_tpu(value):
        return tpu_tensor.to_cpu_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("cpu")
    return value


def _on_cpu(op, args, kwargs):
    """Run `op` on CPU copies, write mutated arguments back, move results to tpu."""
    CPU_FALLBACK_COUNTS[str(op)] += 1
    if CPU_FALLBACK_COUNTS[str(op)] == 1:
        warnings.warn(
            f"{op} has no tpu lowering and ran on CPU (called from {user_frame()}); "
            "see tpu_backend.cpu_fallback_counts()",
            stacklevel=2,
        )
    cpu_args, cpu_kwargs = _to_cpu(args), {k: _to_cpu(v) for k, v in kwargs.items()}
    if "device" in kwargs and kwargs["device"] is not None:
        cpu_kwargs["device"] = torch.device("cpu")
    result = op(*cpu_args, **cpu_kwargs)
    originals = _mutated_args(op, args, kwargs)
    for original, cpu_value in zip(originals, _mutated_args(op, cpu_args, cpu_kwargs)):
        write_result(original, tpu_tensor.cpu_to_jax(cpu_value))
    by_identity = {id(c): o for o, c in zip(originals, _mutated_args(op, cpu_args, cpu_kwargs))}

    def back(value):
        if isinstance(value, torch.Tensor):
            if id(value) in by_identity:
                return by_identity[id(value)]
            return tpu_tensor.wrap(tpu_tensor.cpu_to_jax(value))
        if isinstance(value, (list, tuple)):
            return type(value)(back(v) for v in value)
        return value

    return back(result)


def _fallback(op, *args, **kwargs):
    active = _active_ops()
    if op not in active:
        active.add(op)
        try:
            for attempt in (_via_functional, _via_decomposition):
                result = attempt(op, args, dict(kwargs))
                if result is not NotImplemented:
                    return result
        finally:
            active.discard(op)
    if _cpu_fallback:
        return _on_cpu(op, args, kwargs)
    raise TpuLoweringError(
        f"no tpu lowering for {op} (called from {user_frame()}). Add a JAX lowering in "
        "tpu_backend/ops/<family>.py, or run it on CPU with tpu_backend.set_cpu_fallback(True) "
        "(or TPU_CPU_FALLBACK=1)."
    )


_FALLBACK_LIB = None


def register_fallback() -> None:
    global _FALLBACK_LIB
    if _FALLBACK_LIB is None:
        _FALLBACK_LIB = torch.library.Library("_", "IMPL")
        _FALLBACK_LIB.fallback(_opaque_to_dynamo(_fallback), "PrivateUse1")


def clear_jit_cache() -> None:
    """Forget the per-op jitted functions (they are rebuilt on next use)."""
    for op_runner in _RUNNERS.values():
        op_runner.jitted.clear()
