"""Views and in-place writes through views behave as on CPU (storage sharing)."""

import jax
import numpy as np
import pytest
import torch

import tpu_backend


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_views_read_to_the_host_on_either_path_match_cpu(dtype, monkeypatch):
    """`.cpu()` of a view takes it on the host from the whole storage when that is small,
    else gathers it on the device first: both give CPU's values (generate()'s last-position
    logits, `logits[:, -1]`, are such a view)."""
    from tpu_backend import tensor as device_tensor

    base = torch.arange(2 * 3 * 40).reshape(2, 3, 40).to(dtype)
    views = (
        lambda t: t[:, -1],
        lambda t: t[1:, ::2, 3:],
        lambda t: t.transpose(0, 2),
        lambda t: t[:, :1].expand(2, 5, 40),
    )
    x = base.to("tpu")
    for limit in (device_tensor.HOST_VIEW_BYTES, 0):  # the host path, then (storage > 2x the view) the device's
        monkeypatch.setattr(device_tensor, "HOST_VIEW_BYTES", limit)
        for view in views:
            got = view(x).cpu()
            assert got.dtype == dtype and got.is_contiguous()
            torch.testing.assert_close(got, view(base), rtol=0, atol=0)


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


# ----------------------------------------------------------------- donation of self's arrays
# Strict mode donates an in-place op's self arrays to its program when nothing else can
# read them (tpu_backend/eager/runner.py). `_spy` sees each program's arguments after it
# ran, so a test can ask which arrays were donated (deleted) without holding them itself.


@pytest.fixture
def strict_spy(monkeypatch):
    from tpu_backend.eager import runner

    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("strict")
    calls = []
    original = runner._run_jitted

    def spy(fn, dynamic):
        out = original(fn, dynamic)
        calls.append([isinstance(v, jax.Array) and v.is_deleted() for v in dynamic])
        return out

    monkeypatch.setattr(runner, "_run_jitted", spy)  # the compiled path calls it too once wrapped
    yield calls
    tpu_backend.set_eager_mode(previous)


def _payload_array(t):
    from tpu_backend import tensor as device_tensor

    return device_tensor.payload_of(t).array


def test_inplace_ops_donate_self_and_match_cpu(strict_spy):
    x, y = torch.randn(4, 5), torch.rand(4, 5) + 0.5
    xs, ys = [torch.randn(3), torch.randn(2, 2)], [torch.rand(3) + 0.5, torch.rand(2, 2) + 0.5]
    tx, ty = x.to("tpu"), y.to("tpu")
    txs, tys = [t.to("tpu") for t in xs], [t.to("tpu") for t in ys]
    for _ in range(3):  # the first calls learn them, the later ones run in C++ when it is built
        strict_spy.clear()
        tx.add_(ty, alpha=0.5)
        tx.mul_(0.9)
        torch._foreach_mul_(txs, 0.9)
        torch._foreach_addcdiv_(txs, tys, tys, 0.1)
        x.add_(y, alpha=0.5).mul_(0.9)
        torch._foreach_mul_(xs, 0.9)
        torch._foreach_addcdiv_(xs, ys, ys, 0.1)
        # self's arrays deleted (donated), the other inputs kept
        assert strict_spy == [[True, False, False], [True, False], [True, True, False], [True, True] + [False] * 5]
        torch.testing.assert_close(tx.cpu(), x)
        for t, c in zip(txs, xs):
            torch.testing.assert_close(t.cpu(), c)
        torch.testing.assert_close(ty.cpu(), y)


def test_arrays_others_can_read_are_not_donated(strict_spy):
    x = torch.arange(6.0).to("tpu")
    for _ in range(3):
        held = torch.tpu.to_jax(x)  # the user's JAX value of the tensor
        x.mul_(2.0)
        assert not held.is_deleted()
        torch.testing.assert_close(torch.tensor(np.asarray(held)) * 2, x.cpu())
    shared = torch.tpu.to_jax(torch.ones(3).to("tpu"))
    a, b = torch.tpu.from_jax(shared), torch.tpu.from_jax(shared)  # two storages, one array
    del shared
    for _ in range(3):
        a.add_(1.0)
    assert torch.equal(b.cpu(), torch.ones(3)) and torch.equal(a.cpu(), torch.full((3,), 4.0))
    base = torch.zeros(2, 3).to("tpu")
    row = base[1]
    strict_spy.clear()
    for _ in range(3):
        row.add_(1.0)  # a view as self: the write back reads the base's old array
    assert strict_spy == [[False, False]] * 3
    assert torch.equal(base.cpu(), torch.tensor([[0.0, 0.0, 0.0], [3.0, 3.0, 3.0]]))


def test_self_passed_twice_or_held_in_a_list_is_not_donated(strict_spy):
    y = torch.ones(4).to("tpu")
    for _ in range(3):
        y.add_(y)  # self is another argument too: donating it would be JAX's error
    assert torch.equal(y.cpu(), torch.full((4,), 8.0))
    xs = [torch.ones(2).to("tpu") for _ in range(3)]
    strict_spy.clear()
    for _ in range(3):
        held = torch.tpu.to_jax(xs[1])  # one held element: the list is not donated
        torch._foreach_mul_(xs, 2.0)
    assert strict_spy == [[False, False, False, False]] * 3
    assert not held.is_deleted() and torch.equal(torch.tensor(np.asarray(held)), torch.full((2,), 4.0))
    assert all(torch.equal(t.cpu(), torch.full((2,), 8.0)) for t in xs)


def test_results_of_another_dtype_are_written_and_refused_as_before(strict_spy):
    half, thalf = torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.float16).to("tpu")
    for _ in range(3):  # a float32 result cast into a float16 self: nothing donated
        thalf.add_(torch.full((3,), 0.25, device="tpu"))
        half.add_(torch.full((3,), 0.25))
    assert thalf.dtype == torch.float16 and torch.equal(thalf.cpu(), half)
    counts = torch.arange(3).to("tpu")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="can't be cast"):
            counts.mul_(torch.full((3,), 0.5, device="tpu"))
        assert not _payload_array(counts).is_deleted()
    assert torch.equal(counts.cpu(), torch.arange(3))
    floats, halves = torch.ones(3).to("tpu"), torch.full((3,), 0.5, device="tpu")
    strict_spy.clear()
    for _ in range(3):  # the same call on a float self still donates
        floats.mul_(halves)
    assert strict_spy == [[True, False]] * 3
    assert torch.equal(floats.cpu(), torch.full((3,), 0.125))


def test_adamw_foreach_matches_cpu_and_donates_without_recompiling(strict_spy):
    from tpu_backend.eager import runner

    shapes = [(8, 4), (4,), (3, 3)]
    cpu = [torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, shape in enumerate(shapes)]
    tpu = [p.detach().clone().to("tpu").requires_grad_() for p in cpu]
    cpu = [p.detach().clone().requires_grad_() for p in cpu]
    optimizers = [torch.optim.AdamW(params, lr=0.01, foreach=True) for params in (cpu, tpu)]
    for step in range(4):
        for params in (cpu, tpu):
            for i, p in enumerate(params):
                p.grad = torch.full(p.shape, 0.1 * (i + 1) * (step + 1), device=p.device)
        if step == 2:
            misses = runner.CACHE_STATS.misses
        strict_spy.clear()
        for optimizer in optimizers:
            optimizer.step()
        for c, t in zip(cpu, tpu):
            torch.testing.assert_close(t.detach().cpu(), c.detach())
    assert runner.CACHE_STATS.misses == misses  # the donating programs were compiled once
    assert sum(any(call) for call in strict_spy) >= 5  # the moments' and parameters' updates donated
