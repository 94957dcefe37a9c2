"""The three FFT primitives torch.fft reaches agree with PyTorch on CPU (every normalization)."""

import pytest
import torch
from ops_parity import check

import tpu_backend  # noqa: F401  (registers the device)

aten = torch.ops.aten
torch.manual_seed(0)
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("normalization", [0, 1, 2])
def test_fft_primitives(normalization):
    real, cplx = torch.randn(3, 6, 5), torch.randn(3, 6, 5, dtype=torch.complex64)
    check(aten._fft_r2c.default, real, [2, 0], normalization, True, **TOL)  # halves dim 0, the last listed
    check(aten._fft_r2c.default, real, [1], normalization, False, **TOL)
    check(aten._fft_c2c.default, cplx, [0, 2], normalization, True, **TOL)
    check(aten._fft_c2c.default, cplx, [1], normalization, False, **TOL)
    check(aten._fft_c2r.default, cplx[..., :4], [1, 2], normalization, 6, **TOL)
    check(aten._fft_c2r.default, cplx[..., :3], [2], normalization, 5, **TOL)


def test_torch_fft_on_device():
    x = torch.randn(4, 8)
    for fn in (torch.fft.rfft, torch.fft.ihfft, lambda t: torch.fft.irfft(torch.fft.rfft(t), n=8)):
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), **TOL)  # ihfft writes conj_physical.out


def test_complex_from_parts_broadcasts():
    check(aten.complex.default, torch.randn(3, 1), torch.randn(4), **TOL)
    check(aten.polar.default, torch.rand(3, 4), torch.randn(4) * 3, **TOL)


def test_complex_views_in_functional_graphs():
    """What compiled and fused graphs run for view_as_real / view_as_complex (value semantics)."""
    import jax.numpy as jnp

    from tpu_backend.ops.registry import VIEW_LOWERINGS

    cplx = torch.randn(3, 4, dtype=torch.complex64)
    as_real = VIEW_LOWERINGS[aten.view_as_real.default].fn(jnp.asarray(cplx.numpy()))
    assert torch.equal(torch.from_numpy(as_real.__array__()), torch.view_as_real(cplx))
    back = VIEW_LOWERINGS[aten.view_as_complex.default].fn(as_real)
    assert torch.equal(torch.from_numpy(back.__array__()), cplx)
    with pytest.raises(ValueError, match="view_as_complex: the last dimension must have size 2"):
        VIEW_LOWERINGS[aten.view_as_complex.default].fn(jnp.zeros((3, 3)))
