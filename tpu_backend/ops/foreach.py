"""The `_foreach_*` family: list-of-tensors versions of pointwise ops (optimizers use them).

Each `_foreach_op.overload` applies one elementwise lowering to every tensor of the
list, so its numerics are exactly those of the single-tensor op. The overload names
say how the second operand is given:
- `default`: unary, `[f(x) for x in self]`
- `Scalar`: one Python number for every tensor
- `List`: a second list of tensors, paired up
- `ScalarList`: one number per tensor
- `Tensor`: one 0-dim tensor for every tensor
Only functional overloads are registered: the in-place forms SGD/Adam/AdamW call
(`_foreach_add_.Scalar`, ...) are derived by the dispatcher, which writes each result
back into the matching list element. Inside one `jax.jit` a whole list is one XLA
computation, which is what makes the foreach path fast on a TPU.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_backend.ops import pointwise, reduction
from tpu_backend.ops._common import jax_dtype
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _register_unary(name: str, fn) -> None:
    def foreach_unary(tensors):
        return [fn(x) for x in tensors]

    foreach_unary.__name__ = f"foreach_{name}"
    foreach_unary.__doc__ = f"`{name}` applied to every tensor of the list."
    lowers(getattr(aten, f"_foreach_{name}").default)(foreach_unary)


_UNARY = {
    "abs": pointwise.absolute,
    "acos": pointwise.acos,
    "asin": pointwise.asin,
    "atan": pointwise.atan,
    "ceil": pointwise.ceil,
    "cos": pointwise.cos,
    "cosh": pointwise.cosh,
    "erf": pointwise.erf,
    "erfc": pointwise.erfc,
    "exp": pointwise.exp,
    "expm1": pointwise.expm1,
    "floor": pointwise.floor,
    "frac": pointwise.frac,
    "lgamma": pointwise.lgamma,
    "log": pointwise.log,
    "log10": pointwise.log10,
    "log1p": pointwise.log1p,
    "log2": pointwise.log2,
    "neg": pointwise.neg,
    "reciprocal": pointwise.reciprocal,
    "round": pointwise.round_half_even,
    "rsqrt": pointwise.rsqrt,
    "sigmoid": pointwise.sigmoid,
    "sign": pointwise.sign,
    "sin": pointwise.sin,
    "sinh": pointwise.sinh,
    "sqrt": pointwise.sqrt,
    "tan": pointwise.tan,
    "tanh": pointwise.tanh,
    "trunc": pointwise.trunc,
    "zero": jnp.zeros_like,
    "clone": lambda x: jnp.array(x, copy=True),
}
for _name, _fn in _UNARY.items():
    _register_unary(_name, _fn)


def _register_binary(name: str, fn, overloads: tuple[str, ...], takes_alpha: bool = False) -> None:
    packet = getattr(aten, f"_foreach_{name}")

    def with_scalar(tensors, scalar):
        return [fn(x, scalar) for x in tensors]

    def with_scalar_list(tensors, scalars):
        return [fn(x, s) for x, s in zip(tensors, scalars)]

    if takes_alpha:

        def with_list(tensors, other, *, alpha=1):
            return [fn(x, y, alpha=alpha) for x, y in zip(tensors, other)]

        def with_tensor(tensors, other, *, alpha=1):
            return [fn(x, other, alpha=alpha) for x in tensors]

    else:

        def with_list(tensors, other):
            return [fn(x, y) for x, y in zip(tensors, other)]

        def with_tensor(tensors, other):
            return [fn(x, other) for x in tensors]

    variants = {"Scalar": with_scalar, "ScalarList": with_scalar_list, "List": with_list, "Tensor": with_tensor}
    for overload in overloads:
        variant = variants[overload]
        lowers(getattr(packet, overload))(variant)


_ALL = ("Scalar", "List", "ScalarList")
_register_binary("add", pointwise.add, _ALL + ("Tensor",), takes_alpha=True)
_register_binary("sub", pointwise.sub, _ALL, takes_alpha=True)
_register_binary("mul", pointwise.mul, _ALL + ("Tensor",))
_register_binary("div", pointwise.div, _ALL + ("Tensor",))
_register_binary("maximum", pointwise.maximum, _ALL)
_register_binary("minimum", pointwise.minimum, _ALL)
_register_binary("clamp_min", pointwise.clamp_min, _ALL)
_register_binary("clamp_max", pointwise.clamp_max, _ALL)
_register_binary("pow", pointwise.power, ("List",))


@lowers(aten._foreach_pow.Scalar)
def foreach_pow_scalar(tensors, exponent):
    return [pointwise.pow_tensor_scalar(x, exponent) for x in tensors]


@lowers(aten._foreach_pow.ScalarList)
def foreach_pow_scalar_list(tensors, exponents):
    return [pointwise.pow_tensor_scalar(x, e) for x, e in zip(tensors, exponents)]


@lowers(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(base, exponents):
    return [pointwise.power(base, e) for e in exponents]


def _scalars_of(scalars, count):
    """ScalarList overloads give numbers; Tensor overloads a 1-d tensor of them."""
    if hasattr(scalars, "shape"):
        return [scalars[i] for i in range(count)]
    return list(scalars)


@lowers(aten._foreach_addcmul.Scalar)
def foreach_addcmul(tensors, tensors1, tensors2, value=1):
    return [pointwise.addcmul(x, a, b, value=value) for x, a, b in zip(tensors, tensors1, tensors2)]


@lowers(aten._foreach_addcmul.ScalarList, aten._foreach_addcmul.Tensor)
def foreach_addcmul_per_tensor(tensors, tensors1, tensors2, scalars):
    values = _scalars_of(scalars, len(tensors))
    return [pointwise.addcmul(x, a, b, value=v) for x, a, b, v in zip(tensors, tensors1, tensors2, values)]


@lowers(aten._foreach_addcdiv.Scalar)
def foreach_addcdiv(tensors, tensors1, tensors2, value=1):
    return [pointwise.addcdiv(x, a, b, value=value) for x, a, b in zip(tensors, tensors1, tensors2)]


@lowers(aten._foreach_addcdiv.ScalarList, aten._foreach_addcdiv.Tensor)
def foreach_addcdiv_per_tensor(tensors, tensors1, tensors2, scalars):
    values = _scalars_of(scalars, len(tensors))
    return [pointwise.addcdiv(x, a, b, value=v) for x, a, b, v in zip(tensors, tensors1, tensors2, values)]


@lowers(aten._foreach_lerp.Scalar)
def foreach_lerp(tensors, tensors1, weight):
    return [pointwise.lerp(x, end, weight) for x, end in zip(tensors, tensors1)]


@lowers(aten._foreach_lerp.List, aten._foreach_lerp.ScalarList)
def foreach_lerp_per_tensor(tensors, tensors1, weights):
    return [pointwise.lerp(x, end, w) for x, end, w in zip(tensors, tensors1, weights)]


@lowers(aten._foreach_norm.Scalar)
def foreach_norm(tensors, ord=2, dtype=None):
    return [reduction.linalg_vector_norm(x, ord, dtype=dtype) for x in tensors]


@lowers(aten._foreach_powsum.Scalar)
def foreach_powsum(tensors, ord=2, dtype=None):
    """sum(|x| ** ord) per tensor: a norm without the final root."""
    return [jnp.sum(jnp.abs(x if dtype is None else x.astype(jax_dtype(dtype))) ** ord) for x in tensors]


@lowers(aten._foreach_max.default)
def foreach_max(tensors):
    return [jnp.max(x) for x in tensors]


@lowers(aten._foreach_copy.default)
def foreach_copy(tensors, src, non_blocking=False):
    return [jnp.broadcast_to(s, x.shape).astype(x.dtype) for x, s in zip(tensors, src)]


@lowers(aten._foreach_mm.default)
def foreach_mm(tensors, mat2s):
    return [jnp.matmul(a, b) for a, b in zip(tensors, mat2s)]
