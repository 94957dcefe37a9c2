"""Convolutions: `aten.convolution` -> CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV, and
CONV_3D / CONV_3D_TRANSPOSE for 3-D (NDHWC, filters DHWIO / DHWOI; no groups).

All three are NHWC-only in TFLite, so each is wrapped in the layout module's
NCHW -> NHWC / NHWC -> NCHW transposes. Constant weights are rearranged here in numpy
(OIHW -> OHWI for CONV_2D, -> 1HWO for DEPTHWISE_CONV_2D, IOHW -> OHWI for TRANSPOSE_CONV);
non-constant weights get a TRANSPOSE op that constant folding may remove.

Padding: PyTorch's symmetric padding becomes SAME when it reads exactly TFLite's SAME
windows, VALID when zero, and an explicit PAD + VALID otherwise. 1-D convolutions run
as 2-D ones over a height of 1. Grouped (non-depthwise) convolutions are one CONV_2D whose
filters have input_channels / groups channels (TFLite's grouped form); TRANSPOSE_CONV has
no groups, so grouped transposed convolutions are split into one op per group.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.ir import Tensor
from converter.lowering import emit, layout
from converter.lowering.registry import lowers

aten = torch.ops.aten

OIHW_TO_OHWI = (0, 2, 3, 1)
OIHW_TO_1HWO = (1, 2, 3, 0)  # depthwise: torch (C*m, 1, kh, kw) -> TFLite (1, kh, kw, C*m)
IOHW_TO_OHWI = (1, 2, 3, 0)  # transposed: torch (Cin, Cout, kh, kw) -> TFLite (Cout, kh, kw, Cin)


@lowers(aten.convolution.default)
def convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if x.rank not in (3, 4, 5):
        raise emit.unsupported(
            ctx,
            f"{x.rank - 2}-D convolution has no lowering",
            "Only conv1d/conv2d/conv3d (and their transposed forms) are supported.",
        )
    spatial = x.rank - 2
    # ATen allows one value for every spatial axis ("valid" padding arrives as [0]).
    stride, padding, dilation, output_padding = (
        _per_axis(v, spatial) for v in (stride, padding, dilation, output_padding)
    )
    if x.rank == 5:
        return _convolution3d(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if x.rank == 3:  # a 2-D convolution over a height of 1
        x_nhwc = layout.ncl_to_n1lc(ctx, x)
        weight = emit.reshape(ctx, weight, (*weight.shape[:2], 1, weight.shape[2]))
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        output_padding = [0, *output_padding]
    else:
        x_nhwc = layout.to_nhwc(ctx, x)
    if transposed:
        y = _conv_transpose2d(ctx, x_nhwc, weight, bias, stride, padding, dilation, output_padding, groups)
    else:
        y = _conv2d(ctx, x_nhwc, weight, bias, stride, padding, dilation, groups)
    return layout.n1lc_to_ncl(ctx, y) if x.rank == 3 else layout.to_nchw(ctx, y)


def _per_axis(values, spatial: int) -> list[int]:
    values = [int(v) for v in values]
    return values * spatial if len(values) == 1 else values


def _bias_or_zeros(ctx, bias, channels: int, dtype) -> Tensor:
    # A zero bias rather than an omitted input: XNNPACK and the GPU delegates want a
    # static bias, and the batch-norm folding pass can then add into it.
    return bias if bias is not None else ctx.const(np.zeros(channels, dtype=dtype))


def _padded_input(ctx, x_nhwc: Tensor, in_hw, kernel, stride, padding, dilation) -> tuple[Tensor, str]:
    """The input to convolve and the TFLite padding mode that reproduces `padding`."""
    if all(p == 0 for p in padding):
        return x_nhwc, "VALID"
    if layout.is_same_padding(in_hw, kernel, stride, padding, dilation):
        return x_nhwc, "SAME"
    ph, pw = padding
    n, h, w, c = x_nhwc.shape
    paddings = emit.int32(ctx, [[0, 0], [ph, ph], [pw, pw], [0, 0]])
    padded = emit.op(ctx, "PAD", [x_nhwc, paddings], shape=(n, h + 2 * ph, w + 2 * pw, c), dtype=x_nhwc.dtype)
    return padded, "VALID"


def _conv2d(ctx, x_nhwc, weight, bias, stride, padding, dilation, groups) -> Tensor:
    """CONV_2D / DEPTHWISE_CONV_2D on an NHWC input; returns NHWC."""
    n, h, w, cin = x_nhwc.shape
    dtype = x_nhwc.dtype
    cout, cin_per_group, kh, kw = weight.shape
    out_hw = [
        layout.torch_output_size(size, k, s, p, d)
        for size, k, s, p, d in zip((h, w), (kh, kw), stride, padding, dilation)
    ]
    x_nhwc, mode = _padded_input(ctx, x_nhwc, (h, w), (kh, kw), stride, padding, dilation)
    bias = _bias_or_zeros(ctx, bias, cout, dtype)
    options = {
        "padding": mode,
        "strideH": stride[0],
        "strideW": stride[1],
        "dilationHFactor": dilation[0],
        "dilationWFactor": dilation[1],
        "fusedActivationFunction": "NONE",
    }
    out_shape = (n, *out_hw, cout)
    if groups > 1 and groups == cin and cin_per_group == 1:
        filters = emit.transpose(ctx, weight, OIHW_TO_1HWO)
        options["depthMultiplier"] = cout // cin
        return emit.op(ctx, "DEPTHWISE_CONV_2D", [x_nhwc, filters, bias], options, shape=out_shape, dtype=dtype)
    # Grouped convolutions stay one CONV_2D (v6: filter channels = input channels / groups).
    # Measured on ai-edge-litert 2.3 for a 32-group 128-channel layer: XNNPACK runs it
    # 1.9x faster than 32 split convolutions; the builtin kernels (no delegate) 2x slower.
    filters = emit.transpose(ctx, weight, OIHW_TO_OHWI)
    return emit.op(ctx, "CONV_2D", [x_nhwc, filters, bias], options, shape=out_shape, dtype=dtype)


def _grouped_transpose_conv(ctx, x_nhwc, weight, bias, groups, options, out_shape, output_shape_input) -> Tensor:
    """One TRANSPOSE_CONV per group on a SPLIT of the input channels, then CONCATENATION."""
    n, h, w, cin = x_nhwc.shape
    group_in = cin // groups
    parts = ctx.emit(
        "SPLIT",
        [emit.int32(ctx, 3), x_nhwc],
        {"numSplits": groups},
        shape=(n, h, w, group_in),
        dtype=x_nhwc.dtype,
        num_outputs=groups,
    )
    group_out = out_shape[3] // groups
    outputs = []
    for g, part in enumerate(parts):
        # torch's transposed weight is (Cin, Cout / groups, kh, kw): group g owns Cin rows g*group_in...
        filters = emit.transpose(ctx, emit.slice_axis(ctx, weight, 0, g * group_in, (g + 1) * group_in), IOHW_TO_OHWI)
        group_bias = emit.slice_axis(ctx, bias, 0, g * group_out, (g + 1) * group_out)
        outputs.append(
            emit.op(
                ctx,
                "TRANSPOSE_CONV",
                [output_shape_input, filters, part, group_bias],
                options,
                shape=(*out_shape[:3], group_out),
                dtype=x_nhwc.dtype,
            )
        )
    return emit.concat(ctx, outputs, axis=3)


def _dilate_kernel(ctx, weight: Tensor, dilation) -> Tensor:
    """TRANSPOSE_CONV has no dilation: spread a constant kernel with zeros instead."""
    if tuple(dilation) == (1, 1):
        return weight
    if not weight.is_const:
        raise emit.unsupported(
            ctx,
            "dilated transposed convolution with a non-constant weight",
            "Make the weight a parameter or buffer, or use dilation=1.",
        )
    i, o, kh, kw = weight.shape
    dh, dw = dilation
    spread = np.zeros((i, o, (kh - 1) * dh + 1, (kw - 1) * dw + 1), dtype=weight.dtype)
    spread[:, :, ::dh, ::dw] = weight.data
    return ctx.const(spread)


def _conv_transpose2d(ctx, x_nhwc, weight, bias, stride, padding, dilation, output_padding, groups) -> Tensor:
    """TRANSPOSE_CONV (NHWC in and out). With VALID padding it computes the full,
    uncropped output ((in - 1) * stride + kernel, plus output_padding rows of bias at the
    end); PyTorch's `padding` then crops that many rows/columns from each side."""
    weight = _dilate_kernel(ctx, weight, dilation)
    n, h, w, cin = x_nhwc.shape
    dtype = x_nhwc.dtype
    _, cout_per_group, kh, kw = weight.shape
    cout = cout_per_group * groups
    full_hw = [(size - 1) * s + k + op for size, s, k, op in zip((h, w), stride, (kh, kw), output_padding)]
    full_shape = (n, *full_hw, cout)
    output_shape = emit.int32(ctx, full_shape)
    bias = _bias_or_zeros(ctx, bias, cout, dtype)
    options = {"padding": "VALID", "strideH": stride[0], "strideW": stride[1], "fusedActivationFunction": "NONE"}
    if groups == 1:
        filters = emit.transpose(ctx, weight, IOHW_TO_OHWI)
        y = emit.op(
            ctx, "TRANSPOSE_CONV", [output_shape, filters, x_nhwc, bias], options, shape=full_shape, dtype=dtype
        )
    else:
        group_shape = emit.int32(ctx, (*full_shape[:3], cout_per_group))
        y = _grouped_transpose_conv(ctx, x_nhwc, weight, bias, groups, options, full_shape, group_shape)
    ph, pw = padding
    if ph or pw:
        y = emit.strided_slice(ctx, y, [0, ph, pw, 0], [n, full_hw[0] - ph, full_hw[1] - pw, cout], [1, 1, 1, 1])
    return y


# ---- 3-D: CONV_3D / CONV_3D_TRANSPOSE (NDHWC) ------------------------------------------------

OIDHW_TO_DHWIO = (2, 3, 4, 1, 0)  # CONV_3D filter: (kd, kh, kw, Cin, Cout)
IODHW_TO_DHWOI = (2, 3, 4, 1, 0)  # CONV_3D_TRANSPOSE filter: (kd, kh, kw, Cout, Cin)


def _convolution3d(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """conv3d / conv_transpose3d on NDHWC (wrapped in the layout transposes). Padding is an
    explicit PAD + VALID (conv) or a crop of the full output (transposed)."""
    if groups != 1:
        raise emit.unsupported(
            ctx,
            "grouped 3-D convolution (CONV_3D has no groups)",
            "Use groups=1, or split the channels into separate Conv3d layers.",
        )
    x_ndhwc = layout.to_ndhwc(ctx, x)
    n, d, h, w, cin = x_ndhwc.shape
    dtype = x.dtype
    options = {
        "padding": "VALID",
        "strideD": stride[0],
        "strideH": stride[1],
        "strideW": stride[2],
        "dilationDFactor": dilation[0],
        "dilationHFactor": dilation[1],
        "dilationWFactor": dilation[2],
        "fusedActivationFunction": "NONE",
    }
    if transposed:
        if tuple(dilation) != (1, 1, 1):
            raise emit.unsupported(ctx, "dilated 3-D transposed convolution", "Use dilation=1.")
        cout = weight.shape[1]
        full = [(size - 1) * s + k + op for size, s, k, op in zip((d, h, w), stride, weight.shape[2:], output_padding)]
        full_shape = (n, *full, cout)
        y = emit.op(
            ctx,
            "CONV_3D_TRANSPOSE",
            [
                emit.int32(ctx, full_shape),
                emit.transpose(ctx, weight, IODHW_TO_DHWOI),
                x_ndhwc,
                _bias_or_zeros(ctx, bias, cout, dtype),
            ],
            options,
            shape=full_shape,
            dtype=dtype,
        )
        if any(padding):
            y = emit.strided_slice(
                ctx, y, [0, *padding, 0], [n, *(f - p for f, p in zip(full, padding)), cout], [1] * 5
            )
        return layout.to_ncdhw(ctx, y)
    cout = weight.shape[0]
    if any(padding):
        pairs = [[0, 0], *([p, p] for p in padding), [0, 0]]
        x_ndhwc = emit.op(
            ctx,
            "PAD",
            [x_ndhwc, emit.int32(ctx, pairs)],
            shape=(n, *(s + 2 * p for s, p in zip((d, h, w), padding)), cin),
            dtype=dtype,
        )
    out = [
        layout.torch_output_size(size, k, s, p, dl)
        for size, k, s, p, dl in zip((d, h, w), weight.shape[2:], stride, padding, dilation)
    ]
    y = emit.op(
        ctx,
        "CONV_3D",
        [x_ndhwc, emit.transpose(ctx, weight, OIDHW_TO_DHWIO), _bias_or_zeros(ctx, bias, cout, dtype)],
        options,
        shape=(n, *out, cout),
        dtype=dtype,
    )
    return layout.to_ncdhw(ctx, y)


# ---- the convolution ops torch.export gives (lowered directly, not decomposed first) -------


@lowers(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
def conv_nd(ctx, x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    _require_batched(x, weight)
    return convolution(ctx, x, weight, bias, _ints(stride), _ints(padding), _ints(dilation), False, [0], groups)


@lowers(aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input)
def conv_transpose_nd(
    ctx, x, weight, bias=None, stride=(1,), padding=(0,), output_padding=(0,), groups=1, dilation=(1,)
):
    _require_batched(x, weight)
    return convolution(
        ctx, x, weight, bias, _ints(stride), _ints(padding), _ints(dilation), True, _ints(output_padding), groups
    )


def _require_batched(x, weight) -> None:
    """An unbatched input (one rank less than the weight) takes the decomposition, which
    adds the batch axis."""
    if x.rank != weight.rank:
        raise NotImplementedError("unbatched convolution input")


def _ints(value) -> list[int]:
    """ATen's `SymInt[2] stride=1` may arrive as one int."""
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]
