"""N-d convolution (grouped, dilated, padded, transposed) and its backward.

One function, `_conv`, handles every case through `lax.conv_general_dilated` in
PyTorch's channel-first layout; a transposed convolution is the gradient of a normal
one: dilate the input by the stride, pad by `dilation * (k - 1) - padding` (plus
`output_padding` on the high side) and convolve with the flipped, in/out-swapped
kernel. `convolution_backward` is `jax.vjp` of `_conv`, so the two can never disagree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_backend.ops._common import expand_param
from tpu_backend.ops.registry import lowers

aten = torch.ops.aten


def _dimension_numbers(spatial: int):
    letters = "DHW"[-spatial:] if spatial <= 3 else None
    if letters is None:
        raise NotImplementedError(f"aten.convolution: {spatial}-d convolution is not supported (1-d to 3-d are)")
    return lax.conv_dimension_numbers(
        (1, 1) + (1,) * spatial, (1, 1) + (1,) * spatial, ("NC" + letters, "OI" + letters, "NC" + letters)
    )


def _transposed_kernel(weight, groups):
    """(C_in, C_out/g, *k) transposed-conv weight -> (C_out, C_in/g, *k), spatially flipped."""
    c_in, c_out_per_group = weight.shape[:2]
    kernel = weight.shape[2:]
    w = weight.reshape((groups, c_in // groups, c_out_per_group) + kernel)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * c_out_per_group, c_in // groups) + kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def _conv(x, weight, stride, padding, dilation, transposed, output_padding, groups):
    spatial = weight.ndim - 2
    stride, padding, dilation = (expand_param(v, spatial) for v in (stride, padding, dilation))
    numbers = _dimension_numbers(spatial)
    if transposed:
        output_padding = expand_param(output_padding, spatial)
        kernel = weight.shape[2:]
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op) for k, p, d, op in zip(kernel, padding, dilation, output_padding)
        ]
        out = lax.conv_general_dilated(
            x,
            _transposed_kernel(weight, groups),
            window_strides=(1,) * spatial,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=groups,
        )
    else:
        out = lax.conv_general_dilated(
            x,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=groups,
        )
    return out


def _add_bias(out, bias):
    return out if bias is None else out + bias.reshape((-1,) + (1,) * (out.ndim - 2))


@lowers(aten.convolution.default, aten.convolution_overrideable.default, aten._convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_cudnn_flags):
    """`_convolution`'s trailing flags (benchmark, deterministic, cudnn, tf32) are ignored."""
    out = _conv(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    return _add_bias(out, bias)


@lowers(aten.convolution_backward.default)
def convolution_backward(
    grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    """(grad_input, grad_weight, grad_bias); an output whose mask entry is False is None
    (ATen's undefined tensor)."""
    conv = lambda inp, w: _conv(inp, w, stride, padding, dilation, transposed, output_padding, groups)
    _, vjp = jax.vjp(conv, x, weight)
    grad_input, grad_weight = vjp(grad_output)
    grad_bias = jnp.sum(grad_output, axis=tuple(d for d in range(grad_output.ndim) if d != 1))
    return tuple(g if wanted else None for g, wanted in zip((grad_input, grad_weight, grad_bias), output_mask))


@lowers(aten.convolution_backward_overrideable.default)
def convolution_backward_overrideable(
    grad_output, x, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    return convolution_backward(
        grad_output, x, weight, None, stride, padding, dilation, transposed, output_padding, groups, output_mask
    )
