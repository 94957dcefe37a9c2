"""Users' own JAX (and Pallas) functions as PyTorch ops: `torch.tpu.jax_op`.

    @torch.tpu.jax_op("mylib::swish")
    def swish(x: jax.Array, beta: float = 1.0) -> jax.Array:
        return x * jax.nn.sigmoid(beta * x)

    y = swish(torch.randn(8, device="tpu"), 2.0)   # a tpu tensor; y.sum().backward() works

The decorator registers a `torch.library` custom op (`torch.ops.mylib.swish`) and
returns its `CustomOpDef`:
- **schema** from the signature: parameters annotated `jax.Array` (or `torch.Tensor`, or
  not annotated) are tensors (`Optional[...]`: may be None); `int`, `float`, `bool`,
  `str` are static values (each distinct value compiles once: a Pallas kernel may close
  over them). The return annotation says how many tensors come back (`jax.Array`, or
  `tuple[jax.Array, jax.Array]`; none: one).
- **shapes** from `jax.eval_shape` of the function (the fake kernel): fake tensors,
  `torch.compile`, AOTAutograd and `torch.export` need nothing else.
- **on "tpu" tensors** the function is an entry of the device's one lowering table
  (`tpu_backend.ops.registry`), so strict eager jits it per shape, fused eager records it
  into the step's program, and `torch.compile(backend="tpu")` / `tpu_backend.export`
  trace it inside their programs: the same JAX function in every mode.
- **on CPU tensors** it runs through JAX on copies (handy to compare with a reference).
- **autograd** through `jax.vjp` of the function (a `jax.custom_vjp` function brings its
  own rule: the way to give a Pallas kernel a backward kernel), or through
  `backward=bwd`, a JAX function `bwd(grad, *args)` returning one gradient per tensor
  argument (None where there is none); `grad` has the output's structure. The backward
  is itself a custom op (`<name>_backward`) in the table, so compiled training steps
  hold it as one node.

Gradients flow to floating-point tensor arguments only. The function is traced with JAX's
default 32-bit types, as its author wrote it (the device itself runs with 64-bit types on),
unless a tensor argument is 64-bit: a Pallas kernel's grid needs 32-bit on a TPU.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import typing
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import torch

from tpu_backend import dispatch
from tpu_backend.ops.registry import jax_dtype, lowers, torch_dtype

_TENSOR_TYPES = (jax.Array, torch.Tensor, jnp.ndarray, inspect.Parameter.empty)
_STATIC_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}
_DEFAULT_NAMESPACE = "jax_ops"


class JaxOpError(TypeError):
    """A function `jax_op` cannot turn into an op (the message names the parameter)."""


def _optional_of(annotation):
    """`X` for `Optional[X]` / `X | None`, else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1 and len(typing.get_args(annotation)) == 2:
            return rest[0]
    return None


def _schema_type(name: str, annotation) -> tuple[str, bool]:
    """(schema type, is a tensor) of one parameter."""
    inner = _optional_of(annotation)
    if inner is not None:
        schema, is_tensor = _schema_type(name, inner)
        return schema + "?", is_tensor
    if annotation in _TENSOR_TYPES:
        return "Tensor", True
    if annotation in _STATIC_TYPES:
        return _STATIC_TYPES[annotation], False
    raise JaxOpError(
        f"jax_op: parameter {name!r} is annotated {annotation!r}; use jax.Array for tensors "
        "(Optional[jax.Array] when it may be None) or int/float/bool/str for static values"
    )


def _output_count(annotation) -> int:
    if annotation in _TENSOR_TYPES:
        return 1
    if typing.get_origin(annotation) is tuple:
        items = typing.get_args(annotation)
        if items and Ellipsis not in items and all(item in _TENSOR_TYPES for item in items):
            return len(items)
    raise JaxOpError(
        f"jax_op: return annotation {annotation!r} is not supported; use jax.Array or "
        "tuple[jax.Array, ...] with one entry per output"
    )


def _default(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return repr(value).replace("'", '"')
    return repr(value)


def _returns(count: int) -> str:
    return "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"


class _Signature:
    """What the schema, the fake kernel and the backward need to know about `fn`."""

    def __init__(self, fn: Callable):
        signature = inspect.signature(inspect.unwrap(fn), eval_str=True)
        self.names, self.schema_args, self.tensor_positions = [], [], []
        for position, (name, parameter) in enumerate(signature.parameters.items()):
            if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                raise JaxOpError(f"jax_op: parameter {name!r} must be positional (no *args, **kwargs or keyword-only)")
            schema_type, is_tensor = _schema_type(name, parameter.annotation)
            argument = f"{schema_type} {name}"
            if parameter.default is not parameter.empty:
                argument += f"={_default(parameter.default)}"
            self.names.append(name)
            self.schema_args.append(argument)
            if is_tensor:
                self.tensor_positions.append(position)
        if not self.tensor_positions:
            raise JaxOpError("jax_op: the function takes no tensor (jax.Array) argument")
        self.outputs = _output_count(signature.return_annotation)

    def schema(self) -> str:
        return f"({', '.join(self.schema_args)}) -> {_returns(self.outputs)}"

    def backward_schema(self) -> str:
        plain = [argument.split("=")[0] for argument in self.schema_args]  # the backward is called with all
        grads = [f"Tensor grad_{i}" for i in range(self.outputs)]
        return f"({', '.join(plain + grads)}) -> {_returns(len(self.tensor_positions))}"


def _as_outputs(out, count: int, name: str) -> tuple:
    """The function's result as a tuple of `count` arrays (or abstract values)."""
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outputs) != count or not all(hasattr(o, "shape") and hasattr(o, "dtype") for o in outputs):
        raise JaxOpError(
            f"jax_op {name}: the function returned {jax.tree_util.tree_structure(out)}, but its return "
            f"annotation promises {count} array(s); annotate it as "
            f"{'jax.Array' if len(outputs) == 1 else 'tuple[' + ', '.join(['jax.Array'] * len(outputs)) + ']'}"
        )
    return tuple(outputs)


def _is_differentiable(value) -> bool:
    return value is not None and jnp.issubdtype(value.dtype, jnp.inexact)


def _vjp_backward(fn: Callable, signature: _Signature) -> Callable:
    """`bwd(grad, *args)` by `jax.vjp` of `fn` with respect to its floating-point tensor args."""

    def backward(grad, *args):
        positions = [p for p in signature.tensor_positions if _is_differentiable(args[p])]

        def of_differentiable(*values):
            full = list(args)
            for position, value in zip(positions, values):
                full[position] = value
            return fn(*full)

        _, pullback = jax.vjp(of_differentiable, *[args[p] for p in positions])
        grads = dict(zip(positions, pullback(grad)))
        return tuple(grads.get(p) for p in signature.tensor_positions)

    return backward


def _op_exists(qualified: str) -> bool:
    namespace, op_name = qualified.split("::")
    return hasattr(getattr(torch.ops, namespace), op_name)


def _default_name(fn: Callable) -> str:
    """`jax_ops::<function name>`, numbered when a function of that name was registered already."""
    base = f"{_DEFAULT_NAMESPACE}::{fn.__name__}"
    name, index = base, 1
    while _op_exists(name):
        index += 1
        name = f"{base}_{index}"
    return name


_WIDE_DTYPES = {jnp.dtype(t) for t in ("int64", "uint64", "float64", "complex128")}


def _jax_defaults(args):
    """Where a user's function is traced: with JAX's default 32-bit types (what its author
    wrote it for) unless a tensor argument is 64-bit. The device runs with
    `jax_enable_x64` on (PyTorch's int64/float64), and in 64-bit mode a Pallas grid's index
    maps return i64, which Mosaic refuses on a TPU ("failed to legalize operation
    'func.return' ... (i32, i64)")."""
    wide = any(getattr(a, "dtype", None) in _WIDE_DTYPES for a in args)
    return contextlib.nullcontext() if wide else jax.enable_x64(False)


def _register(fn: Callable, name: str, backward: Optional[Callable]):
    if name.count("::") != 1:
        raise ValueError(f"jax_op: op name {name!r} must be 'namespace::name' (e.g. 'mylib::swish')")
    signature = _Signature(fn)
    count = signature.outputs

    def forward_jax(*args):
        with _jax_defaults(args):
            outputs = _as_outputs(fn(*args), count, name)
        return outputs[0] if count == 1 else outputs

    user_backward = backward or _vjp_backward(fn, signature)

    def _tensors(args):  # static values (ints, floats) stay static for eval_shape
        return [args[p] for p in signature.tensor_positions]

    def _with(args, tensors):
        full = list(args)
        for position, tensor in zip(signature.tensor_positions, tensors):
            full[position] = tensor
        return full

    def backward_jax(*args_and_grads):
        args, grads = args_and_grads[:-count], args_and_grads[-count:]
        outs = jax.eval_shape(lambda *tensors: forward_jax(*_with(args, tensors)), *_tensors(args))
        outs = (outs,) if count == 1 else outs
        grads = tuple(g.astype(o.dtype) for g, o in zip(grads, outs))
        with _jax_defaults(args):
            result = user_backward(grads[0] if count == 1 else grads, *args)
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        if len(result) != len(signature.tensor_positions):
            raise JaxOpError(
                f"jax_op {name}: backward returned {len(result)} gradient(s); expected one per tensor "
                f"argument ({len(signature.tensor_positions)}: "
                f"{[signature.names[p] for p in signature.tensor_positions]}), None where there is none"
            )
        # a custom op returns tensors only: "no gradient" travels as an empty array
        empty = jnp.zeros((0,), jnp.float32)
        grads_out = tuple(empty if g is None else g for g in result)
        return grads_out[0] if len(grads_out) == 1 else grads_out

    # (imported here: importing kernel_ops registers its table entries, which must
    # happen after `import tpu_backend` has registered allocation and copies)
    from tpu_backend.kernel_ops import _on_cpu

    def on_cpu(*args):
        return _on_cpu(forward_jax, *args)

    def backward_on_cpu(*args):
        return _on_cpu(backward_jax, *args)

    op = torch.library.custom_op(name, on_cpu, mutates_args=(), schema=signature.schema())
    backward_op = torch.library.custom_op(
        f"{name}_backward", backward_on_cpu, mutates_args=(), schema=signature.backward_schema()
    )

    def abstract(jax_function, *args):
        """Fake tensors for `jax_function(*args)`'s outputs, from jax.eval_shape."""
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        specs = []
        for a in args:
            if isinstance(a, torch.Tensor):
                if any(isinstance(size, torch.SymInt) for size in a.shape):
                    raise NotImplementedError(
                        f"jax_op {name}: symbolic (dynamic) sizes are not supported; "
                        "compile with static shapes (torch.compile(dynamic=False))"
                    )
                specs.append(jax.ShapeDtypeStruct(tuple(a.shape), jax_dtype(a.dtype)))
            else:
                specs.append(a)
        positions = [i for i, a in enumerate(specs) if isinstance(a, jax.ShapeDtypeStruct)]

        def of_arrays(*arrays):
            full = list(specs)
            for i, array in zip(positions, arrays):
                full[i] = array
            return jax_function(*full)

        outs = jax.eval_shape(of_arrays, *[specs[i] for i in positions])
        outs = outs if isinstance(outs, tuple) else (outs,)
        tensors = tuple(torch.empty(o.shape, dtype=torch_dtype(o.dtype), device=device) for o in outs)
        return tensors[0] if len(tensors) == 1 else tensors

    op.register_fake(lambda *args: abstract(forward_jax, *args))
    backward_op.register_fake(lambda *args: abstract(backward_jax, *args))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[p] for p in signature.tensor_positions])
        ctx.statics = {i: v for i, v in enumerate(inputs) if i not in signature.tensor_positions}

    def autograd_backward(ctx, *grads):
        args = [None] * len(signature.names)
        for p, saved in zip(signature.tensor_positions, ctx.saved_tensors):
            args[p] = saved
        for i, value in ctx.statics.items():
            args[i] = value
        result = backward_op(*args, *[g.contiguous() for g in grads])
        result = result if isinstance(result, tuple) else (result,)
        out = [None] * len(signature.names)
        for p, grad in zip(signature.tensor_positions, result):
            out[p] = (
                grad if (args[p] is not None and args[p].is_floating_point() and grad.shape == args[p].shape) else None
            )
        return tuple(out)

    op.register_autograd(autograd_backward, setup_context=setup_context)

    for custom, jax_function in ((op, forward_jax), (backward_op, backward_jax)):
        lowers(custom._opoverload)(jax_function)  # the table connects it to the dispatcher at once
    for custom in (op, backward_op):
        # Python floats are static: a Pallas kernel may close over them (no traced scalars)
        dispatch.runner(custom._opoverload).dynamic_floats = False
    op.jax_function = fn
    op.backward_op = backward_op
    return op


def jax_op(name=None, fn=None, /, *, backward: Optional[Callable] = None):
    """Turn JAX function `fn` into a PyTorch op (see the module docstring).

    `@jax_op`, `@jax_op("lib::name")`, `@jax_op("lib::name", backward=bwd)` or
    `jax_op("lib::name", fn)`. Returns the op's `torch.library.CustomOpDef`."""
    if callable(name):  # bare @jax_op
        name, fn = None, name

    def decorate(function: Callable):
        return _register(function, name or _default_name(function), backward)

    return decorate if fn is None else decorate(fn)


__all__ = ["JaxOpError", "jax_op"]
