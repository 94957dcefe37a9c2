"""The sampling arithmetic of PyTorch's pooling and interpolation kernels, as numpy arrays.

Both tables build ops from these: the converter bakes them into constants (GATHER
indices, BATCH_MATMUL weights), the tpu device into `jnp.take` / `tensordot` operands.
Sizes are static Python ints, so everything here is plain numpy computed at trace time.
Coordinates are computed in float32, as ATen's CPU kernels do, so the indices and weights
match PyTorch's bit for bit where it matters (which row `floor` picks).
"""

from __future__ import annotations

import numpy as np


def adaptive_bounds(size: int, out: int) -> tuple[list[int], list[int]]:
    """ATen's adaptive pooling windows along one axis: [floor(i*size/out), ceil((i+1)*size/out))."""
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    return starts, ends


def adaptive_average_matrix(size: int, out: int) -> np.ndarray:
    """(out, size) float64 matrix whose rows average the adaptive windows."""
    matrix = np.zeros((out, size))
    for i, (start, end) in enumerate(zip(*adaptive_bounds(size, out))):
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def adaptive_window_index(size: int, out: int) -> np.ndarray:
    """(out, width) input positions of each adaptive window, its last cell repeated to pad."""
    starts, ends = adaptive_bounds(size, out)
    width = max(e - s for s, e in zip(starts, ends))
    return np.array([[min(s + j, e - 1) for j in range(width)] for s, e in zip(starts, ends)])


def source_scale(in_size: int, out_size: int, scale_factor: float | None) -> np.float32:
    """Input positions per output position: 1/scale_factor when the user gave one, else
    in/out (float32, as PyTorch computes it)."""
    if scale_factor:
        return np.float32(1.0 / scale_factor)
    return np.float32(in_size) / np.float32(out_size)


def nearest_indices(in_size: int, out_size: int, scale_factor: float | None, exact: bool = False) -> np.ndarray:
    """Source row of each output row for nearest interpolation (`exact`: the half-pixel
    variant, `nearest-exact`)."""
    scale = source_scale(in_size, out_size, scale_factor)
    offset = np.float32(0.5) if exact else np.float32(0)
    dst = np.arange(out_size, dtype=np.float32)
    return np.minimum(np.floor((dst + offset) * scale).astype(np.int64), in_size - 1)


def linear_weights(in_size: int, out_size: int, align_corners: bool, scale_factor: float | None) -> np.ndarray:
    """(out, in) float32 matrix of linear interpolation weights along one axis: two
    non-zeros per row, like ATen's linear kernels."""
    dst = np.arange(out_size, dtype=np.float32)
    if align_corners:
        ratio = np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0)
        src = dst * ratio
    else:
        src = np.maximum(
            (dst + np.float32(0.5)) * source_scale(in_size, out_size, scale_factor) - np.float32(0.5), np.float32(0)
        )
    low = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    frac = src - low.astype(np.float32)
    matrix = np.zeros((out_size, in_size), np.float32)
    np.add.at(matrix, (np.arange(out_size), low), np.float32(1) - frac)
    np.add.at(matrix, (np.arange(out_size), high), frac)
    return matrix


def cubic_weights(in_size: int, out_size: int, align_corners: bool, scale_factor: float | None) -> np.ndarray:
    """(out, in) float32 matrix of ATen's bicubic interpolation weights along one axis:
    Keys' cubic convolution (A = -0.75) over the 4 taps around the source position
    (not clamped at 0, unlike linear), tap indices clamped into the input (their weights
    add up at the border)."""
    dst = np.arange(out_size, dtype=np.float32)
    if align_corners:
        src = dst * (np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0))
    else:
        src = (dst + np.float32(0.5)) * source_scale(in_size, out_size, scale_factor) - np.float32(0.5)
    low = np.floor(src)
    t = src - low
    a = np.float32(-0.75)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    taps = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    matrix = np.zeros((out_size, in_size), np.float32)
    for k, weight in enumerate(taps):
        index = np.clip(low.astype(np.int64) - 1 + k, 0, in_size - 1)
        np.add.at(matrix, (np.arange(out_size), index), weight.astype(np.float32))
    return matrix
