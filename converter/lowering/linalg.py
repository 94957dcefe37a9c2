"""Matrix products: linear/addmm/mm with a constant weight -> FULLY_CONNECTED, the rest
-> BATCH_MATMUL.

FULLY_CONNECTED takes PyTorch's (out, in) weight as is (y = x W^T + b), so `linear` needs
no weight rearranging; `mm`/`matmul` by a constant (in, out) matrix transpose it (lazily:
rearranged once, as the writer writes it). Inputs of rank > 2 keep their leading dimensions
with `keepNumDims`.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit
from converter.lowering.registry import lowers

aten = torch.ops.aten

_FC_OPTIONS = {"fusedActivationFunction": "NONE", "weightsFormat": "DEFAULT", "asymmetricQuantizeInputs": False}
_BMM_OPTIONS = {"adjX": False, "adjY": False, "asymmetricQuantizeInputs": False}


def _fully_connected(ctx, x: Tensor, weight_out_in: Tensor, bias, out_shape=None) -> Tensor:
    """FULLY_CONNECTED of x (..., in) by an (out, in) weight; the last op of a lowering
    unless `out_shape` is given."""
    options = dict(_FC_OPTIONS, keepNumDims=x.rank > 2)
    if x.rank == 1:  # FULLY_CONNECTED wants a batch: (in,) -> (1, in) -> (out,)
        y = _fully_connected(
            ctx, emit.reshape(ctx, x, (1, x.shape[0])), weight_out_in, bias, out_shape=(1, weight_out_in.shape[0])
        )
        return emit.reshape(ctx, y, (weight_out_in.shape[0],))
    if out_shape is None:
        return ctx.emit("FULLY_CONNECTED", [x, weight_out_in, bias], options)
    return emit.op(ctx, "FULLY_CONNECTED", [x, weight_out_in, bias], options, shape=out_shape, dtype=x.dtype)


def _batch_matmul(ctx, a: Tensor, b: Tensor, final: bool = True) -> Tensor:
    if final:
        return ctx.emit("BATCH_MATMUL", [a, b], _BMM_OPTIONS)
    batch = emit.broadcast_shape(a.shape[:-2], b.shape[:-2])
    return emit.op(ctx, "BATCH_MATMUL", [a, b], _BMM_OPTIONS, shape=(*batch, a.shape[-2], b.shape[-1]), dtype=a.dtype)


@lowers(aten.linear.default)
def linear(ctx, x, weight, bias=None):
    return _fully_connected(ctx, x, weight, bias)


def _is_constant_matrix(t: Tensor) -> bool:
    return t.is_const and t.rank == 2


@lowers(aten.mm.default)
def mm(ctx, a, b):
    if _is_constant_matrix(b):
        return _fully_connected(ctx, a, emit.transpose(ctx, b, (1, 0)), None)
    return _batch_matmul(ctx, a, b)


@lowers(aten.bmm.default)
def bmm(ctx, a, b):
    return _batch_matmul(ctx, a, b)


@lowers(aten.baddbmm.default)
def baddbmm(ctx, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b) over a batch (BLOOM's ALiBi scores)."""
    return _plus_bias(ctx, _batch_matmul(ctx, a, b, final=False), bias, beta, alpha)


def _plus_bias(ctx, product: Tensor, bias: Tensor, beta, alpha) -> Tensor:
    """beta * bias + alpha * product (the node's output)."""
    if alpha != 1:
        product = emit.binary(ctx, "MUL", product, emit.scalar_like(ctx, alpha, product.dtype))
    if beta == 0:
        return emit.reshape(ctx, product, ctx.out_shape())
    if beta != 1:
        bias = emit.binary(ctx, "MUL", bias, emit.scalar_like(ctx, beta, bias.dtype))
    return ctx.emit("ADD", [product, bias], {"fusedActivationFunction": "NONE"})


@lowers(aten.addmm.default)
def addmm(ctx, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b): one FULLY_CONNECTED when b is constant and the bias
    is a plain per-output vector."""
    out_features = b.shape[1]
    vector_bias = bias.rank == 1 or (bias.rank == 2 and bias.shape[0] == 1)
    if _is_constant_matrix(b) and beta == 1 and alpha == 1 and vector_bias and bias.shape[-1] == out_features:
        return _fully_connected(ctx, a, emit.transpose(ctx, b, (1, 0)), emit.reshape(ctx, bias, (out_features,)))
    return _plus_bias(ctx, _batch_matmul(ctx, a, b, final=False), bias, beta, alpha)


@lowers(aten.matmul.default)
def matmul(ctx, a, b):
    """torch.matmul's rank rules: 1-D operands gain (and lose) a unit axis; a constant 2-D
    right operand is a FULLY_CONNECTED; everything else a broadcasting BATCH_MATMUL."""
    if a.rank == 1 or b.rank == 1:
        a2 = emit.reshape(ctx, a, (1, a.shape[0])) if a.rank == 1 else a
        b2 = emit.reshape(ctx, b, (b.shape[0], 1)) if b.rank == 1 else b
        if _is_constant_matrix(b2):
            y = _fully_connected(
                ctx, a2, emit.transpose(ctx, b2, (1, 0)), None, out_shape=(*a2.shape[:-1], b2.shape[1])
            )
        else:
            y = _batch_matmul(ctx, a2, b2, final=False)
        return emit.reshape(ctx, y, ctx.out_shape())
    if _is_constant_matrix(b):
        return _fully_connected(ctx, a, emit.transpose(ctx, b, (1, 0)), None)
    return _batch_matmul(ctx, a, b)


@lowers(aten.dot.default)
def dot(ctx, a, b):
    return ctx.emit("SUM", [emit.binary(ctx, "MUL", a, b), emit.int32(ctx, [0])], {"keepDims": False})


# ---- einsum: one BATCH_MATMUL (or FULLY_CONNECTED) between transposes and reshapes ---------


@lowers(aten.einsum.default)
def einsum(ctx, equation: str, operands, path=None):
    """One or two operands with static shapes, no ellipsis and no label repeated within an
    operand (those decompose). Labels that one operand alone has and the output lacks are
    summed first; then, in labels: a = (batch, left, contracted), b = (batch, contracted,
    right) -> BATCH_MATMUL (a FULLY_CONNECTED when b is constant and there is no batch),
    reshaped and transposed to the output's order."""
    inputs, out = _einsum_labels(equation, len(operands))
    if any(t.is_dynamic for t in operands):
        raise NotImplementedError("einsum of dynamic shapes")
    tensors = []
    for t, labels in zip(operands, inputs):
        others = "".join(other for other in inputs if other is not labels) + out
        summed = [k for k, label in enumerate(labels) if label not in others]
        if summed:
            t = emit.reduce(ctx, "SUM", t, summed, keep_dims=False)
            labels = "".join(label for label in labels if label in others)
        tensors.append((t, labels))
    if len(tensors) == 1:
        t, labels = tensors[0]
        return emit.reshape(ctx, emit.transpose(ctx, t, [labels.index(label) for label in out]), ctx.out_shape())
    (a, la), (b, lb) = tensors
    size = {**dict(zip(la, a.shape)), **dict(zip(lb, b.shape))}
    if any(dict(zip(la, a.shape))[label] != dict(zip(lb, b.shape))[label] for label in set(la) & set(lb)):
        raise NotImplementedError("einsum broadcasting a label of size 1")
    batch = [label for label in la if label in lb and label in out]
    contracted = [label for label in la if label in lb and label not in out]
    left, right = [label for label in la if label not in lb], [label for label in lb if label not in la]

    def arranged(t, labels, order, shape):
        return emit.reshape(ctx, emit.transpose(ctx, t, [labels.index(label) for label in order]), shape)

    def count(group):
        return int(np.prod([size[label] for label in group], dtype=np.int64))

    a2 = arranged(a, la, batch + left + contracted, (count(batch), count(left), count(contracted)))
    if not batch and b.is_const:
        weight = arranged(b, lb, right + contracted, (count(right), count(contracted)))
        product = _fully_connected(ctx, emit.reshape(ctx, a2, a2.shape[1:]), weight, None, (count(left), count(right)))
    else:
        b2 = arranged(b, lb, batch + contracted + right, (count(batch), count(contracted), count(right)))
        product = _batch_matmul(ctx, a2, b2, final=False)
    result = "".join(batch + left + right)
    product = emit.reshape(ctx, product, [size[label] for label in result])
    return emit.reshape(ctx, emit.transpose(ctx, product, [result.index(label) for label in out]), ctx.out_shape())


def _einsum_labels(equation: str, operands: int) -> tuple[list[str], str]:
    """(each operand's labels, the output's labels); the implicit output is the labels
    used once, sorted."""
    equation = equation.replace(" ", "")
    if "..." in equation:
        raise NotImplementedError("einsum with an ellipsis")
    lhs, _, out = equation.partition("->")
    inputs = lhs.split(",")
    if "->" not in equation:
        out = "".join(sorted(label for label in set(lhs) - {","} if lhs.count(label) == 1))
    if len(inputs) != operands or operands > 2 or any(len(set(s)) != len(s) for s in inputs):
        raise NotImplementedError("einsum of more than two operands or with a repeated label")
    return inputs, out
