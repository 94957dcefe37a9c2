"""PrivateUse1 kernels built from the lowering table.

For every functional overload in `JAX_LOWERINGS` a kernel is registered, plus the
in-place and `.out` variants derived from it (compute the functional result, write it
back through `tensor.write`). Lowerings registered after import are connected as they
are registered (`registry.on_register`).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable

import jax
import torch

from tpu_backend import native
from tpu_backend import tensor as tpu_tensor
from tpu_backend._registration import DEVICE_NAME
from tpu_backend.eager import modes
from tpu_backend.eager.errors import torch_dtype_name
from tpu_backend.eager.runner import runner
from tpu_backend.eager.variants import _out_names, inplace_variant, out_variant, write_result
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering, on_register

_WRAP = tpu_tensor.wrap
_ARRAY_TYPES: set[type] = set()  # the concrete array classes seen (jax's ArrayImpl, LazyArray): one set test per op


def _wrap_outputs(out):
    if type(out) in _ARRAY_TYPES:  # the common case first: one array
        return _WRAP(out)
    if isinstance(out, (tuple, list)):
        return tuple(_wrap_outputs(o) for o in out)
    if isinstance(out, (jax.Array, tpu_tensor.LazyValue)):
        _ARRAY_TYPES.add(type(out))
        return _WRAP(out)
    return out


def check_device_index(device) -> None:
    """Factory ops name a device; only tpu:0 exists."""
    if device is not None and torch.device(device).index not in (None, 0):
        raise RuntimeError(
            f"device {device} does not exist: the tpu device has one index (tpu:0); "
            "use JAX sharding (a mesh) for several chips"
        )


# Ops that read only their tensor argument's metadata and may name another device:
# `torch.empty_like(x, device="meta")` on a tpu tensor must give a meta tensor (Dynamo's
# guard pickler does exactly this for every guarded parameter).
_METADATA_ONLY_WITH_DEVICE = frozenset(
    ["empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"]
    + ["new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided"]
)


def _on_meta(value):
    if isinstance(value, torch.Tensor) and value.device.type == DEVICE_NAME:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


# Advanced indexing takes CPU index tensors beside a device tensor, as on CUDA (BEiT's
# `table[torch.arange(...)...]`, made on the host): they move to the device first.
_TAKES_CPU_INDICES = frozenset(
    {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl.default}
)


def indices_to_device(args: tuple) -> tuple:
    """(self, indices, ...) with the CPU tensors among `indices` moved to the device."""
    self, indices, *rest = args
    moved = [i.to(DEVICE_NAME) if isinstance(i, torch.Tensor) and i.device.type == "cpu" else i for i in indices]
    return (self, moved, *rest)


def _functional_kernel(op):
    run = runner(op)
    takes_device = any(a.name == "device" for a in op._schema.arguments)
    elsewhere = takes_device and op._schema.name.split("::")[-1] in _METADATA_ONLY_WITH_DEVICE
    if op in _TAKES_CPU_INDICES:
        return lambda *args, **kwargs: _wrap_outputs(run(indices_to_device(args), kwargs))

    def kernel(*args, **kwargs):
        if takes_device and kwargs.get("device") is not None:
            if elsewhere and torch.device(kwargs["device"]).type != DEVICE_NAME:
                # another device's kernel makes it; ours would put it on the tpu
                return op(*[_on_meta(a) for a in args], **kwargs)
            check_device_index(kwargs["device"])
        out = run(args, kwargs)
        return _WRAP(out) if type(out) in _ARRAY_TYPES else _wrap_outputs(out)

    return kernel


def _write_inplace(functional, self, result):
    """An in-place op's tail: the functional op's `result` written into `self` (a tensor,
    or the list of a `_foreach_*_` op, which returns nothing). The compiled path's in-place
    kernels write the plain case themselves and call this for every other one."""
    if isinstance(self, (list, tuple)):  # _foreach_*_: one result per list element, returns ()
        for tensor, value in zip(self, result):
            tpu_tensor.write(tensor, value)
        return None
    is_array = isinstance(result, (jax.Array, tpu_tensor.LazyValue))
    result_dtype = tpu_tensor.torch_dtype(result.dtype) if is_array else self.dtype
    if result_dtype != self.dtype and not torch.can_cast(result_dtype, self.dtype):
        raise RuntimeError(  # ATen's rule (and words) for in-place ops, e.g. int_tensor.mul_(0.5)
            f"result type {torch_dtype_name(result_dtype)} can't be cast to the desired output type "
            f"{torch_dtype_name(self.dtype)}"
        )
    tpu_tensor.write(self, result)
    return self


def _inplace_kernel(functional):
    run = runner(functional)
    moves_indices = functional in _TAKES_CPU_INDICES

    def kernel(self, *args, **kwargs):
        args = (self, *args)
        return _write_inplace(functional, self, run(indices_to_device(args) if moves_indices else args, kwargs, True))

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


_LIBRARIES: dict[str, torch.library.Library] = {}


def _dynamo_frame_hooks():
    """(set_eval_frame, skip_code) from Dynamo's private API, or None when a torch
    upgrade moved them (kernels then pay `torch.compiler.disable`'s wrapper on every call)."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
        from torch._dynamo.eval_frame import skip_code
    except ImportError:
        return None
    return set_eval_frame, skip_code


_FRAME_HOOKS = _dynamo_frame_hooks()


def _opaque_to_dynamo(kernel: Callable) -> Callable:
    """Hide a device kernel from Dynamo. When code between compiled graphs (a graph
    break, `loss.backward()` inside a compiled step) runs eagerly on tpu tensors, Dynamo
    would otherwise try to trace our Python kernels and the JAX code under them.

    `torch.compiler.disable`'s wrapper costs ~1.5 us per call (several Python calls), on
    every op of every eager step. So the wrapper's own frame is one Dynamo never traces
    (`skip_code`), and it pays for `disable` only while a Dynamo callback is installed:
    otherwise (plain eager code) it calls the kernel directly."""
    disabled = torch.compiler.disable(kernel, recursive=True)
    if _FRAME_HOOKS is None:
        return disabled
    set_eval_frame, _ = _FRAME_HOOKS

    def run(*args, **kwargs):
        prior = set_eval_frame(None)
        if prior is None:  # no Dynamo callback: nothing to hide from
            return kernel(*args, **kwargs)
        set_eval_frame(prior)
        return disabled(*args, **kwargs)

    return run


if _FRAME_HOOKS is not None:
    _FRAME_HOOKS[1](_opaque_to_dynamo(lambda: None).__code__)  # every wrapper shares this code object


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


def register_behind_native(op, kernel: Callable) -> bool:
    """Register `kernel` on PrivateUse2, behind a C++ PrivateUse1 kernel of `op` that
    redispatches there (tpu_backend/native); PrivateUse1 counts as taken."""
    added = register_kernel(op, kernel, "PrivateUse2")
    _REGISTERED.add((op, "PrivateUse1"))
    return added


def _is_composite_implicit(op) -> bool:
    # A backend kernel on a CompositeImplicitAutograd op would hide its autograd formula
    # (gradients would silently stop): let those decompose and use the table in compile only.
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


# How strict mode runs a fused optimizer step (`Functionalized.per_tensor`):
# - "auto" (the default on a TPU): one call per parameter (one small program per distinct shape
#   and dtype: a first step compiles in seconds) until the program over the whole list,
#   compiled in the background, is ready; then that one program (one launch per step);
# - "per-tensor": always one call per parameter;
# - "one" (the default elsewhere: XLA:CPU compiles the whole list quickly, and a second thread
#   compiling beside the steps slowed the Trainer tests by 25%): always the one program,
#   compiled on the first step (on a v5e XLA compiles the update tensor by tensor: ~35 s for a
#   374M Llama's 219 tensors; 219 calls per step cost ~190 ms there).
OPTIMIZER_PROGRAMS = os.environ.get("TPU_OPTIMIZER_PROGRAMS")  # None: the platform's default
if OPTIMIZER_PROGRAMS not in (None, "auto", "per-tensor", "one"):
    raise ValueError(f"TPU_OPTIMIZER_PROGRAMS={OPTIMIZER_PROGRAMS!r}: expected 'auto', 'per-tensor' or 'one'")


@functools.cache
def _platform_optimizer_programs() -> str:
    return "auto" if jax.default_backend() == "tpu" else "one"


def _element(args: tuple, positions: tuple, i: int) -> tuple:
    """`args` with each (non-empty) tensor list at `positions` cut to its element `i`."""
    return tuple([arg[i]] if k in positions and arg else arg for k, arg in enumerate(args))


def _functionalized_kernel(op):
    """A mutating op (native_batch_norm's running stats) run through its functional
    lowering: write the new values into the mutated arguments (see ops/norm.py)."""
    spec = JAX_LOWERINGS[op].functionalized
    run = runner(spec.functional)
    returns = op._schema.returns
    returns_self = len(returns) == 1 and returns[0].alias_info is not None  # `-> Tensor(a!)`: self, written
    assert not spec.per_tensor or spec.outputs == 0, f"{op}: a per-tensor op returns nothing"

    def kernel(*args, **kwargs):
        programs = spec.per_tensor and (OPTIMIZER_PROGRAMS or _platform_optimizer_programs())
        if programs and programs != "one" and modes._mode == "strict" and len(args[0]) > 1:
            results = run.run_once_compiled(args, kwargs) if programs == "auto" else None
            if results is None:  # not compiled (yet): one call per element
                for i in range(len(args[0])):
                    kernel(*_element(args, spec.per_tensor, i), **kwargs)
                run.start_pending_compile()
                return None
        else:
            results = run(args, kwargs)
        for arg_index, out_index in spec.writes.items():
            if arg_index < len(args) and args[arg_index] is not None and results[out_index] is not None:
                target, value = args[arg_index], results[out_index]
                if isinstance(target, (list, tuple)):  # a tensor list (the fused optimizers' state)
                    for tensor, element in zip(target, value):
                        tpu_tensor.write(tensor, element)
                else:
                    tpu_tensor.write(target, value)
        if spec.outputs == 0:  # an in-place op returning nothing (`_fused_adam_`)
            return None
        if returns_self:  # `_amp_update_scale_`
            return args[0]
        kept = tuple(results[: spec.outputs])
        return _wrap_outputs(kept[0] if spec.outputs == 1 else kept)  # a one-output op returns a Tensor

    return kernel


_native = native.load()
_native_configured = False


def _configure_native_kernels() -> bool:
    """Hand the compiled path's op kernels what they use from here (once); False when
    there is no compiled path."""
    global _native_configured
    if _native is None:
        return False
    if not _native_configured:
        from jax._src.array import ArrayImpl

        from tpu_backend import fused
        from tpu_backend.eager import modes
        from tpu_backend.eager import runner as runner_module
        from tpu_backend.ops.registry import torch_dtype

        _native.configure_kernels(
            dict(
                modes_dict=vars(modes),
                tensor_dict=vars(tpu_tensor),
                fused_module=fused,
                runner_module=runner_module,
                run_jitted=runner_module._run_jitted,
                compiles_class=runner_module._Compiles,
                note_compile=runner_module._note_native_compile,
                wrap_outputs=_wrap_outputs,
                cpu_to_jax=tpu_tensor.cpu_to_jax,
                torch_dtype=torch_dtype,
                payload_type=tpu_tensor.StoragePayload,
                array_type=ArrayImpl,
                lazy_type=fused.LazyArray,
                sample_tensor=tpu_tensor.new_device_tensor((0,), torch.float32),
            )
        )
        _native_configured = True
    return True


def _register_functional(op) -> int:
    """The functional kernel of a table op. On the compiled path it sits behind the op's C++
    kernel (tpu_backend/native): registered on PrivateUse2, which the C++ kernel redispatches
    to for every call it does not know (and learns from)."""
    kernel = _functionalized_kernel(op) if JAX_LOWERINGS[op].functionalized else _functional_kernel(op)
    if (
        JAX_LOWERINGS[op].functionalized
        or op in _TAKES_CPU_INDICES  # the C++ kernel would read the CPU indices as device arrays
        or (op, "PrivateUse1") in _REGISTERED
        or not _configure_native_kernels()
    ):
        return register_kernel(op, kernel)
    try:
        native_id = _native.install_op_kernel(op._schema.name, op._schema.overload_name)
    except RuntimeError as error:  # a schema the C++ side cannot take: the Python kernel alone
        warnings.warn(f"tpu_backend: no compiled kernel for {op} ({error}); using the Python one", stacklevel=2)
        return register_kernel(op, kernel)
    register_kernel(op, kernel, "PrivateUse2")
    _REGISTERED.add((op, "PrivateUse1"))
    runner(op).native_id = native_id
    return 1


def _register_inplace(op, inplace) -> int:
    """The in-place variant of a table op. On the compiled path, when the functional op has a
    C++ kernel, the in-place op gets one too (in front of its Python kernel, as above): a
    call the functional runner has learned runs its lowering and writes the result in C++."""
    kernel = _inplace_kernel(op)
    native_id = runner(op).native_id
    if native_id is None or (inplace, "PrivateUse1") in _REGISTERED:
        return register_kernel(inplace, kernel)
    try:
        _native.install_inplace_kernel(
            inplace._schema.name, inplace._schema.overload_name, native_id, functools.partial(_write_inplace, op)
        )
    except RuntimeError as error:
        warnings.warn(f"tpu_backend: no compiled kernel for {inplace} ({error}); using the Python one", stacklevel=2)
        return register_kernel(inplace, kernel)
    register_kernel(inplace, kernel, "PrivateUse2")
    _REGISTERED.add((inplace, "PrivateUse1"))
    return 1


def _register_op(op) -> int:
    """Register `op`'s kernel and its derived in-place and out variants; returns how many."""
    if (op, "PrivateUse1") in _REGISTERED:
        return 0
    if _is_composite_implicit(op):
        # the op decomposes, but its `.out` may be a real kernel (conj_physical.out, which
        # torch.fft.ihfft calls): that one runs the table's lowering
        out_op = out_variant(op)
        if out_op is None or out_op in JAX_LOWERINGS or _is_composite_implicit(out_op):
            return 0
        return register_kernel(out_op, _out_kernel(op, out_op))
    added = _register_functional(op)
    inplace = inplace_variant(op)
    if inplace is not None and inplace not in JAX_LOWERINGS:
        added += _register_inplace(op, inplace)
    out_op = out_variant(op)
    if out_op is not None and out_op not in JAX_LOWERINGS and not _out_writes_more_than_out(out_op):
        added += register_kernel(out_op, _out_kernel(op, out_op))
    return added


def _out_writes_more_than_out(out_op) -> bool:
    """An `.out` op that also writes other arguments (`_fused_adam.out`: the gradients and
    moments) and has ATen's CompositeExplicitAutograd kernel: that kernel calls the functional
    kernel and copies every result back, which a derived `.out` kernel (results into `out=`
    only) would not."""
    writes_inputs = any(
        a.alias_info is not None and a.alias_info.is_write and not a.is_out for a in out_op._schema.arguments
    )
    return writes_inputs and torch._C._dispatch_has_kernel_for_dispatch_key(out_op.name(), "CompositeExplicitAutograd")


def _connect_late_lowering(op, lowering: Lowering) -> None:
    if lowering.kind != "op":
        return
    if _is_composite_implicit(op):
        warnings.warn(
            f"{op} has a CompositeImplicitAutograd kernel: eager mode decomposes it before the tpu device "
            "sees it, so this lowering serves torch.compile and fused graphs only; lower the ops it "
            "decomposes into for eager mode (docs/design/device.md, 'Adding a device op')",
            stacklevel=4,
        )
        return
    _register_op(op)


def register_table() -> int:
    """Register every table entry (functional, in-place, out) on PrivateUse1, and connect
    every lowering registered from now on as it is registered; idempotent."""
    added = sum(_register_op(op) for op in list(JAX_LOWERINGS))
    on_register(_connect_late_lowering)
    return added
