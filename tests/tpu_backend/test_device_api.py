"""The `torch.tpu` module and the tensor surface a CUDA user expects."""

import os

import pytest
import torch

import tpu_backend  # noqa: F401  (registers the device)


def test_device_module_reports_one_available_device():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    assert torch.device("tpu").type == "tpu"
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.tpu.is_bf16_supported()


def test_moving_tensors_to_and_from_the_device_keeps_values():
    x = torch.randn(3, 5)
    for moved in (x.to("tpu"), x.tpu(), x.to(torch.device("tpu", 0))):
        assert moved.device == torch.device("tpu", 0)
        assert moved.is_tpu
        torch.testing.assert_close(moved.cpu(), x, rtol=0, atol=0)


def test_only_index_zero_exists():
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        torch.ones(2, device="tpu:1")


def test_print_shows_values_and_device():
    text = repr(torch.tensor([1.5, -2.0]).to("tpu"))
    assert "1.5000" in text and "-2.0000" in text and "device='tpu:0'" in text


def test_item_and_synchronize():
    x = torch.tensor([2.5, 1.0]).to("tpu")
    torch.tpu.synchronize()
    assert (x * 2).sum().item() == 7.0


def test_empty_does_not_allocate_until_written():
    before = torch.tpu.memory_allocated()
    huge = torch.empty(10**11, dtype=torch.uint8, device="tpu")  # 100 GB: must stay virtual
    assert torch.tpu.memory_allocated() == before
    del huge
    x = torch.empty(1000, 1000, device="tpu")
    x.fill_(1.0)
    assert torch.tpu.memory_allocated() == before + 4_000_000
    assert torch.tpu.max_memory_allocated() >= before + 4_000_000
    assert torch.tpu.memory_stats()["allocated_bytes.all.current"] == before + 4_000_000
    del x
    assert torch.tpu.memory_allocated() == before


def test_jit_cache_statistics_count_hits_and_misses():
    torch.tpu.reset_cache_stats()
    x = torch.randn(7, 3).to("tpu")
    for _ in range(3):
        x = x * 1.5  # a changing float must not recompile
    stats = torch.tpu.cache_stats()
    assert stats["requests"] == 3
    assert stats["misses"] <= 1 and stats["hits"] >= 2
    assert stats["compile_seconds"] >= 0.0
    torch.testing.assert_close(x.cpu(), torch.zeros(7, 3) + x.cpu())


def test_changing_scalar_does_not_recompile():
    x = torch.randn(5, 2).to("tpu")
    x * 0.25  # compile once
    torch.tpu.reset_cache_stats()
    results = [(x * (0.1 * i)).cpu() for i in range(1, 5)]
    assert torch.tpu.cache_stats()["misses"] == 0
    for i, r in enumerate(results, start=1):
        torch.testing.assert_close(r, x.cpu() * (0.1 * i))


def test_rng_state_round_trip():
    torch.tpu.manual_seed(5)
    state = torch.tpu.get_rng_state()
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.randn(4, device="tpu").cpu()
    assert torch.equal(a, b)
    assert torch.tpu.initial_seed() == 5


def test_unsupported_torch_version_fails_with_clear_message(monkeypatch):
    from tpu_backend import _registration

    monkeypatch.setattr(torch, "__version__", "2.9.1")
    with pytest.raises(ImportError, match=r"tpu_backend needs torch 2\.10.*found torch 2\.9\.1"):
        _registration.check_torch_version()


def test_get_device_name_and_device_context():
    assert "JAX" in torch.tpu.get_device_name()
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match="one device"):
        torch.tpu.set_device(1)


def test_dataloader_with_pin_memory_feeds_the_device():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2), torch.arange(4))
    totals = [
        x.to("tpu", non_blocking=True).sum().item()
        for x, _ in torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)
    ]
    assert totals == [6.0, 22.0]


def _memory_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
def test_compiled_programs_are_bounded(monkeypatch):
    """Each compiled program holds memory mappings; past the bound the caches are dropped, so
    a process compiling without end (a full OpInfo sweep) cannot exhaust vm.max_map_count."""
    from tpu_backend.eager import runner

    monkeypatch.setattr(runner, "MAX_LIVE_PROGRAMS", 6)
    monkeypatch.setattr(runner, "_warned_eviction", False)
    torch.tpu.empty_cache()
    torch.tpu.reset_cache_stats()
    before = _memory_mappings()
    with pytest.warns(RuntimeWarning, match="programs compiled") as warned:
        for n in range(1, 21):  # 20 shapes x 3 ops: 60 programs, about 2.7 mappings each
            x = torch.arange(n, dtype=torch.float32)
            torch.testing.assert_close(((x.to("tpu") * 2 + 1).sin()).cpu(), (x * 2 + 1).sin())
    stats = torch.tpu.cache_stats()
    assert len(warned) == 1  # warned once, however many evictions
    assert stats["misses"] >= 60 and stats["evictions"] >= 60 // 7
    assert runner.live_programs() <= 6
    assert _memory_mappings() - before < 80  # unbounded, these 60 programs keep ~160
