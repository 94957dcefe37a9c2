"""Views and in-place writes through views behave as on CPU (storage sharing)."""

import pytest
import torch

import tpu_backend  # noqa: F401


def _slice_assign(x):
    x[1:3, 2:5] = 7.0


def _column_add(x):
    x[:, 0] += 1


def _transpose_then_add(x):
    x.transpose_(0, 1).add_(1)


def _view_then_inplace(x):
    x.view(6, 4).mul_(2)


def _as_strided_fill(x):
    torch.as_strided(x, (2, 2), (1, 6), 1).fill_(3)


def _unsqueeze_then_add(x):
    row = x[1]
    row.unsqueeze_(0)
    row.add_(5)


def _diagonal_zero(x):
    x.diagonal().zero_()


def _chunk_sub(x):
    left, right = x.chunk(2, dim=1)
    right.sub_(left)


def _narrow_copy(x):
    x.narrow(1, 1, 2).copy_(torch.ones(4, 2))


def _select_assign(x):
    x[2] = torch.arange(6.0)


def _transposed_view_write(x):
    x.t()[1:3].mul_(-1)


def _reshape_flat_write(x):
    x.reshape(-1)[::5] = 0.5


def _resize_smaller(x):
    x.resize_(2, 3)


def _detach_shares_storage(x):
    x.detach().add_(1)


MUTATIONS = [
    _slice_assign,
    _column_add,
    _transpose_then_add,
    _view_then_inplace,
    _as_strided_fill,
    _unsqueeze_then_add,
    _diagonal_zero,
    _chunk_sub,
    _narrow_copy,
    _select_assign,
    _transposed_view_write,
    _reshape_flat_write,
    _resize_smaller,
    _detach_shares_storage,
]


@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda f: f.__name__.strip("_"))
def test_inplace_through_view_matches_cpu(mutate):
    base = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    on_cpu, on_tpu = base.clone(), base.clone().to("tpu")
    mutate(on_cpu)
    mutate(on_tpu)
    assert on_tpu.shape == on_cpu.shape and on_tpu.stride() == on_cpu.stride()
    torch.testing.assert_close(on_tpu.cpu(), on_cpu, rtol=0, atol=0)


def test_views_share_storage_with_their_base():
    x = torch.zeros(3, 4).to("tpu")
    column = x[:, 1]
    assert column.untyped_storage()._cdata == x.untyped_storage()._cdata
    x.add_(2)  # a write to the base is seen by the view
    torch.testing.assert_close(column.cpu(), torch.full((3,), 2.0))


def test_reads_of_strided_views_match_cpu():
    base = torch.arange(24.0).reshape(4, 6)
    x = base.to("tpu")
    for view in (lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.unfold(1, 2, 2), lambda t: t[:, :1].expand(4, 6)):
        torch.testing.assert_close(view(x).cpu(), view(base), rtol=0, atol=0)


def test_resize_larger_keeps_prefix():
    x = torch.arange(4.0).to("tpu")
    x.resize_(2, 3)
    assert x.shape == (2, 3)
    torch.testing.assert_close(x.reshape(-1)[:4].cpu(), torch.arange(4.0))


def test_out_variant_resizes_and_writes():
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    out = torch.empty(0).to("tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), a + b)


def test_view_as_other_dtype_reinterprets_bytes():
    x = torch.tensor([1.0, -2.0, 0.5])
    on_tpu = x.to("tpu")
    bits = on_tpu.view(torch.int32)
    assert torch.equal(bits.cpu(), x.view(torch.int32))
    bits.add_(1)  # a write through the int view changes the float bits
    expected = x.clone()
    expected.view(torch.int32).add_(1)
    assert torch.equal(on_tpu.cpu(), expected)


def test_channels_last_layout_is_kept():
    x = torch.randn(2, 3, 4, 5)
    on_tpu = x.to("tpu").to(memory_format=torch.channels_last)
    assert on_tpu.stride() == x.to(memory_format=torch.channels_last).stride()
    torch.testing.assert_close((on_tpu * 2).cpu(), x * 2, rtol=0, atol=0)
    empty = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    assert empty.is_contiguous(memory_format=torch.channels_last)


def test_conjugate_view_reads_and_writes_conjugated():
    """`x.conj()` only sets a bit on a view; the device must honour it wherever it reads or writes."""
    x = torch.randn(4, dtype=torch.complex64)
    view = x.to("tpu").conj()
    assert view.is_conj()
    torch.testing.assert_close(view.cpu(), x.conj())
    torch.testing.assert_close((view * 2).cpu(), x.conj() * 2)  # resolved through clone
    base = x.to("tpu")
    base.conj().mul_(2)  # writes through the conjugate view
    torch.testing.assert_close(base.cpu(), x * 2)
    torch.testing.assert_close(torch.fft.ihfft(x.real.to("tpu")).cpu(), torch.fft.ihfft(x.real), atol=1e-5, rtol=1e-5)


def test_view_as_real_and_complex_alias_the_complex_storage():
    """`view_as_real` (also behind `.real` / `.imag`) is a float view of complex storage:
    reads give (re, im) pairs and writes through either view reach the base."""
    x = torch.randn(3, 4, dtype=torch.complex64)
    base = x.to("tpu")
    pairs = torch.view_as_real(base)
    assert pairs.untyped_storage()._cdata == base.untyped_storage()._cdata
    assert torch.equal(pairs.cpu(), torch.view_as_real(x))
    assert torch.equal(torch.view_as_real(base.t()).cpu(), torch.view_as_real(x.t()))  # strided
    assert torch.equal(base.imag[1:, ::2].cpu(), x.imag[1:, ::2])

    expected = x.clone()
    pairs[0, 1, 1] = 5.0  # the imaginary part of element (0, 1)
    base.real.mul_(2)
    expected.imag[0, 1] = 5.0
    expected.real.mul_(2)
    assert torch.equal(base.cpu(), expected)

    back = torch.view_as_complex(pairs)
    assert torch.equal(back.cpu(), expected)
    back.add_(1j)  # a complex write through the complex view of the float view
    expected.add_(1j)
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(pairs.cpu(), torch.view_as_real(expected))

    floats = torch.randn(5, 2)
    assert torch.equal(torch.view_as_complex(floats.to("tpu")).cpu(), torch.view_as_complex(floats))
