"""Handing tpu tensors to JAX and back without copies: `torch.tpu.to_jax`/`from_jax`, DLPack."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import tpu_backend
from tests import chip


def test_a_jax_array_becomes_a_tensor_and_back_without_a_copy():
    array = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    t = torch.tpu.from_jax(array)
    assert t.device.type == "tpu" and t.shape == (3, 4) and t.dtype == torch.float32
    back = torch.tpu.to_jax(t)
    assert back.unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
    torch.testing.assert_close(t.cpu(), torch.arange(12.0).reshape(3, 4), rtol=0, atol=0)


def test_a_computed_tensor_reaches_jax_with_no_host_transfer():
    x = torch.randn(8, 16).to("tpu")
    y = torch.nn.functional.gelu(x @ x.T)
    with jax.transfer_guard("disallow"):  # any host <-> device copy would raise
        array = torch.tpu.to_jax(y)
        doubled = torch.tpu.from_jax(array + array)
        assert torch.tpu.to_jax(y).unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
    np.testing.assert_allclose(np.asarray(array), y.cpu().numpy(), rtol=0, atol=0)
    torch.testing.assert_close(doubled.cpu(), y.cpu() * 2)


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[1:, ::2],  # offset and strided
        lambda t: t.t(),  # transposed
        lambda t: t[2],  # a row at an offset
        lambda t: t.reshape(-1)[5:17],  # a flat window
        lambda t: t[:, 1:2].expand(4, 3),  # broadcast
    ],
    ids=["offset_strided", "transposed", "row", "window", "expanded"],
)
def test_views_hand_over_their_own_values(view):
    base = torch.arange(24.0).reshape(4, 6)
    expected = view(base)
    got = torch.tpu.to_jax(view(base.to("tpu")))
    assert got.shape == tuple(expected.shape)
    np.testing.assert_array_equal(np.asarray(got), expected.numpy())


def test_later_writes_do_not_change_the_other_side():
    array = jnp.ones((4,), jnp.float32)
    t = torch.tpu.from_jax(array)
    t.add_(1)  # the tensor's storage gets a new array; the JAX value is immutable
    np.testing.assert_array_equal(np.asarray(array), np.ones(4))
    torch.testing.assert_close(t.cpu(), torch.full((4,), 2.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.bool, torch.float16])
def test_dtypes_round_trip(dtype):
    x = (torch.arange(6) % 3).to(dtype).to("tpu")
    array = torch.tpu.to_jax(x)
    assert array.dtype == jnp.dtype(tpu_backend.ops.registry.jax_dtype(dtype))
    torch.testing.assert_close(torch.tpu.from_jax(array).cpu(), x.cpu(), rtol=0, atol=0)


def test_jax_code_inside_a_training_step():
    layer = torch.nn.Linear(4, 4).to("tpu")
    out = layer(torch.randn(2, 4).to("tpu"))
    softplus = torch.tpu.from_jax(jax.nn.softplus(torch.tpu.to_jax(out)))
    rtol = chip.tolerance("transcendentals", cpu=1.3e-6, tpu=2e-4)  # 7.7e-5 seen on a v5e
    torch.testing.assert_close(softplus.cpu(), torch.nn.functional.softplus(out.detach().cpu()), rtol=rtol, atol=rtol)


def test_the_package_names_are_the_same_functions():
    assert tpu_backend.to_jax is torch.tpu.to_jax and tpu_backend.from_jax is torch.tpu.from_jax


def test_wrong_inputs_say_what_to_do():
    with pytest.raises(ValueError, match=r"on 'tpu'.*t.to\('tpu'\)"):
        torch.tpu.to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="expects a jax.Array"):
        torch.tpu.from_jax(np.ones(2))
    with pytest.raises(TypeError, match="traced value"):
        jax.jit(lambda a: torch.tpu.from_jax(a))(jnp.ones(2))


def test_fused_mode_hands_over_the_computed_value():
    tpu_backend.set_eager_mode("fused")
    try:
        x = torch.ones(3).to("tpu") * 3  # pending until a sync point
        array = torch.tpu.to_jax(x)
    finally:
        tpu_backend.set_eager_mode("strict")
    np.testing.assert_array_equal(np.asarray(array), np.full(3, 3.0))


# --------------------------------------------------------------------------- DLPack


@pytest.mark.chip_difference("host_memory")  # JAX's TPU arrays export no DLPack: BufferError naming the platform
def test_dlpack_consumers_read_the_tensors_buffer():
    x = torch.randn(5, 3).to("tpu") + 1
    pointer = torch.tpu.to_jax(x).unsafe_buffer_pointer()
    via_jax = jax.dlpack.from_dlpack(x)  # calls x.__dlpack__()
    assert via_jax.unsafe_buffer_pointer() == pointer
    via_numpy = np.from_dlpack(x)
    assert via_numpy.ctypes.data == pointer
    via_capsule = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(x))
    assert via_capsule.data_ptr() == pointer
    np.testing.assert_array_equal(via_numpy, x.cpu().numpy())


def test_from_dlpack_onto_the_device_shares_the_jax_array():
    array = jnp.arange(6, dtype=jnp.int32)
    t = torch.from_dlpack(array, device="tpu")
    assert t.device.type == "tpu"
    assert torch.tpu.to_jax(t).unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
    copied = torch.utils.dlpack.from_dlpack(array, device="tpu", copy=True)
    assert torch.tpu.to_jax(copied).unsafe_buffer_pointer() != array.unsafe_buffer_pointer()
    torch.testing.assert_close(copied.cpu(), torch.arange(6, dtype=torch.int32))


def test_cpu_tensors_keep_torchs_own_dlpack():
    x = torch.arange(4.0)
    assert torch.from_dlpack(x).data_ptr() == x.data_ptr()
    assert np.from_dlpack(x).ctypes.data == x.data_ptr()
