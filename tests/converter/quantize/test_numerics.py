"""The arithmetic under every scheme: scales, zero points, int4 blocks and nibble packing."""

from __future__ import annotations

import numpy as np
import pytest

from converter.quantize import numerics


def test_per_channel_symmetric_uses_full_range_per_channel():
    w = np.array([[0.5, -1.0, 0.25], [0.01, 0.02, -0.03]], np.float32)
    q, scale = numerics.per_channel_symmetric(w, axis=0)
    np.testing.assert_allclose(scale, [1.0 / 127, 0.03 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0, 1] == -127 and q[1, 2] == -127
    np.testing.assert_allclose(q * scale[:, None], w, atol=scale.max() / 2 + 1e-7)


def test_blockwise_int4_scales_are_float16_and_error_is_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    q, scale = numerics.blockwise_int4(w, 32)
    assert scale.shape == (4, 2) and scale.dtype == np.float16
    assert q.min() >= -7 and q.max() <= 7
    restored = q.reshape(4, 2, 32) * scale.astype(np.float32)[..., None]
    step = scale.astype(np.float32)[..., None]
    assert np.all(np.abs(restored - w.reshape(4, 2, 32)) <= step / 2 + 1e-6)


def test_pack_int4_low_nibble_first():
    packed = numerics.pack_int4(np.array([1, -2, 7, -8, 3], np.int8))
    assert packed.tolist() == [0xE1, 0x87, 0x03]  # (1, -2) (7, -8) (3, pad 0)


@pytest.mark.parametrize(
    "lo, hi, dtype", [(-1.0, 3.0, np.int8), (0.5, 2.0, np.int8), (-4.0, -1.0, np.uint8), (-2.0, 1.0, np.int16)]
)
def test_activation_params_cover_the_range_and_zero(lo, hi, dtype):
    scale, zero = numerics.activation_params(lo, hi, dtype)
    info = np.iinfo(dtype)
    if dtype == np.int16:
        assert zero == 0
    assert info.min <= zero <= info.max  # 0.0 is exactly representable
    for value in (lo, hi, 0.0):
        q = numerics.quantize_values(np.float32(value), scale, zero, dtype)
        assert abs(numerics.dequantize_values(q, scale, zero) - value) <= scale / 2 + 1e-7
