"""Matrix products: linear/addmm/mm with a constant weight -> FULLY_CONNECTED, the rest
-> BATCH_MATMUL.

FULLY_CONNECTED takes PyTorch's (out, in) weight as is (y = x W^T + b), so `linear` needs
no weight rearranging; `mm`/`matmul` by a constant (in, out) matrix transpose it once in
numpy. Inputs of rank > 2 keep their leading dimensions with `keepNumDims`.
"""

from __future__ import annotations

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
        return _fully_connected(ctx, a, ctx.const(b.data.T), None)
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
        return _fully_connected(ctx, a, ctx.const(b.data.T), emit.reshape(ctx, bias, (out_features,)))
    return _plus_bias(ctx, _batch_matmul(ctx, a, b, final=False), bias, beta, alpha)


@lowers(aten.matmul.default)
def matmul(ctx, a, b):
    """torch.matmul's rank rules: 1-D operands gain (and lose) a unit axis; a constant 2-D
    right operand is a FULLY_CONNECTED; everything else a broadcasting BATCH_MATMUL."""
    if a.rank == 1 or b.rank == 1:
        a2 = emit.reshape(ctx, a, (1, a.shape[0])) if a.rank == 1 else a
        b2 = emit.reshape(ctx, b, (b.shape[0], 1)) if b.rank == 1 else b
        if _is_constant_matrix(b2):
            y = _fully_connected(ctx, a2, ctx.const(b2.data.T), None, out_shape=(*a2.shape[:-1], b2.shape[1]))
        else:
            y = _batch_matmul(ctx, a2, b2, final=False)
        return emit.reshape(ctx, y, ctx.out_shape())
    if _is_constant_matrix(b):
        return _fully_connected(ctx, a, ctx.const(b.data.T), None)
    return _batch_matmul(ctx, a, b)


@lowers(aten.dot.default)
def dot(ctx, a, b):
    return ctx.emit("SUM", [emit.binary(ctx, "MUL", a, b), emit.int32(ctx, [0])], {"keepDims": False})
