"""Every supported dtype survives the trip and computes like CPU; float32 stays float32."""

import pytest
import torch

import tpu_backend  # noqa: F401

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_and_arithmetic_match_cpu(dtype):
    x = torch.tensor([[1, 0, 3], [2, 5, 1]]).to(dtype)
    on_tpu = x.to("tpu")
    assert on_tpu.dtype == dtype
    torch.testing.assert_close(on_tpu.cpu(), x, rtol=0, atol=0)
    if dtype == torch.bool:
        expected, got = x | x.t().t(), (on_tpu | on_tpu).cpu()
    else:
        expected, got = x * 2 + x, (on_tpu * 2 + on_tpu).cpu()
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_float_dtypes_do_not_promote_with_python_scalars(dtype):
    x = torch.ones(3, dtype=dtype).to("tpu")
    assert (x * 0.5).dtype == dtype
    assert (x + 1).dtype == dtype
    assert x.sum().dtype == dtype


def test_integer_tensor_times_float_scalar_is_default_float():
    x = torch.tensor([1, 2, 3]).to("tpu")
    assert (x * 0.5).dtype == torch.float32


def test_dtype_conversion_on_device():
    x = torch.tensor([1.7, -2.2, 3.5]).to("tpu")
    assert x.to(torch.int32).cpu().tolist() == [1, -2, 3]
    assert x.to(torch.bfloat16).to(torch.float32).cpu().dtype == torch.float32
    assert x.half().cpu().dtype == torch.float16
