"""Device faults: the on-disk compilation cache under concurrency and damage, NaN/Inf
in debug mode, and memory over long training loops in each eager mode.

Corrupt and truncated cache entries (bit flips, halves, empty files) are covered by
tests/tpu_backend/compile/test_cache.py::test_corrupt_entry_is_detected_replaced_and_recompiled;
this file adds concurrent writers and readers, leftovers of killed writers, processes
sharing a folder, and the long-run memory checks.

    RELIABILITY_TRAIN_STEPS=10000 .venv/bin/python -m pytest -q -s -m slow tests/reliability/test_device_faults.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import tpu_backend
import tpu_backend.compile as tpu_compile
from tests.reliability.hostile import ROOT
from tpu_backend.compile.cache import VerifiedDiskCache

CACHE_CHILD = os.path.join(ROOT, "tests", "tpu_backend", "compile", "cache_child.py")


def _run(args: list[str], env: dict | None = None, timeout: float = 600) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})),
    )


def _result(proc: subprocess.Popen, timeout: float = 600):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


# ---- the compilation cache ------------------------------------------------------------------


def test_concurrent_writers_and_a_reader_never_see_a_torn_entry(tmp_path):
    """Two processes rewrite one entry (different sizes) while a third reads it: every
    read is absent or one writer's complete payload; nothing is reported corrupt."""
    folder = str(tmp_path / "xla")
    procs = [
        _run(["-m", "tests.reliability.cache_worker", folder, "write", str(size), "2"]) for size in (1 << 20, 3 << 18)
    ]
    procs.append(_run(["-m", "tests.reliability.cache_worker", folder, "read", "0", "2"]))
    results = [_result(p) for p in procs]
    reader = results[-1]
    assert all(r["operations"] > 0 for r in results), results
    assert reader["torn"] == 0 and reader["corrupt"] == 0, results
    assert reader["operations"] > reader["misses"]  # it did read the entry, not only misses
    assert VerifiedDiskCache(folder).verify_all() == []
    assert [p.name for p in VerifiedDiskCache(folder).entries()] == ["shared.xla"]


def test_a_killed_writers_leftover_is_ignored(tmp_path):
    cache = VerifiedDiskCache(tmp_path)
    cache.put("k", b"payload")
    (tmp_path / ".tmp-abc123.xla").write_bytes(b"TPUXLA1\n half-written")  # what a kill leaves
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no corrupt-entry warning either
        assert cache.get("k") == b"payload"
        assert cache.verify_all() == []
    assert [p.name for p in cache.entries()] == ["k.xla"]


def test_an_entry_torn_in_place_is_replaced_on_the_next_compile(tmp_path):
    """A non-atomic writer (a copy tool, a full disk) left half an entry under the real name."""
    import jax.numpy as jnp

    from tpu_backend.compile import Program, compile_stats

    with tpu_compile.using_cache_dir(tmp_path / "xla") as folder:
        x = np.arange(7.0, dtype=np.float32)
        Program("torn", lambda v: jnp.tanh(v) * 3)(x)
        (entry,) = [p for p in folder.glob("*.xla") if not p.name.startswith(".tmp-")]
        whole = entry.read_bytes()
        entry.write_bytes(whole[: len(whole) // 2])
        compile_stats().reset()
        with pytest.warns(RuntimeWarning, match="corrupt or truncated"):
            y = Program("torn", lambda v: jnp.tanh(v) * 3)(x)
        np.testing.assert_allclose(np.asarray(y), np.tanh(x) * 3, rtol=1e-6)
        assert compile_stats().total().misses == 1  # recompiled
        assert VerifiedDiskCache(folder).verify_all() == []  # and the entry is whole again
        assert entry.stat().st_size > len(whole) // 2


@pytest.mark.slow
def test_two_training_processes_share_one_cache_folder(tmp_path):
    """Two processes compile the same training step into one folder at the same time:
    both succeed with the same loss, the folder verifies, and a third process then
    compiles nothing."""
    env = {"TPU_CACHE_DIR": str(tmp_path / "shared")}
    first, second = [_result(p) for p in [_run([CACHE_CHILD], env), _run([CACHE_CHILD], env)]]
    assert first["loss"] == second["loss"]
    assert VerifiedDiskCache(tmp_path / "shared").verify_all() == []
    third = _result(_run([CACHE_CHILD, "--cache-only"], env))
    assert third["misses"] == 0 and third["loss"] == first["loss"]


# ---- NaN / Inf in debug mode ------------------------------------------------------------------


@pytest.fixture
def debug_mode():
    tpu_backend.set_eager_mode("debug")
    yield
    tpu_backend.set_eager_mode("strict")


class LogHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.fc(x))  # negative activations: NaN


def test_debug_mode_names_the_op_and_line_that_made_nan_in_a_module(debug_mode):
    torch.manual_seed(0)
    model = LogHead().to("tpu")
    with pytest.raises(tpu_backend.TpuDebugError, match=r"aten\.log\.default produced NaN/Inf") as info:
        model(torch.randn(8, 4).to("tpu"))
    log_line = LogHead.forward.__code__.co_firstlineno + 1
    assert f"test_device_faults.py:{log_line}" in str(info.value)  # the user's line, in forward()


def test_debug_mode_names_an_overflow_to_inf(debug_mode):
    with pytest.raises(tpu_backend.TpuDebugError, match=r"aten\.exp\.default produced NaN/Inf"):
        torch.exp(torch.tensor([1.0, 100.0]).to("tpu"))


def test_debug_mode_catches_inf_in_the_backward_pass(debug_mode):
    x = torch.tensor([0.0, 4.0]).to("tpu").requires_grad_()
    y = torch.sqrt(x).sum()  # finite forward; d/dx sqrt at 0 is inf
    with pytest.raises(tpu_backend.TpuDebugError, match=r"aten\.\w+\.\w+ produced NaN/Inf"):
        y.backward()


def test_debug_mode_blames_the_source_not_the_ops_that_carry_nan(debug_mode):
    x = torch.tensor([float("nan"), 1.0]).to("tpu")  # NaN from the data, not from an op
    y = (x * 2 + 1).relu()
    assert np.isnan(y.cpu().numpy()[0])


def test_strict_mode_does_not_check():
    assert tpu_backend.get_eager_mode() == "strict"
    y = torch.log(torch.tensor([-1.0]).to("tpu"))
    assert np.isnan(y.cpu().numpy()[0])


# ---- memory over long training loops ----------------------------------------------------------


def _slope(samples) -> float:
    """Least-squares RSS growth in bytes per step, over the samples after the first 10%."""
    steps = np.array([s for s, _ in samples], dtype=np.float64)
    rss = np.array([r for _, r in samples], dtype=np.float64)
    keep = steps >= steps[-1] * 0.1
    return float(np.polyfit(steps[keep], rss[keep], 1)[0])


def _memory_run(steps: dict[str, int], every: int) -> list[dict]:
    results = []
    for mode, n in steps.items():
        proc = _run(
            ["-m", "tests.reliability.device_memory_worker", "--steps", str(n), "--every", str(every), "--modes", mode]
        )
        results += _result(proc, timeout=3600)
    for r in results:
        r["rss_slope_bytes_per_step"] = _slope(r["rss"])
        r["rss_growth_bytes"] = r["rss"][-1][1] - r["rss"][0][1]
        print(
            f"\n{r['mode']}: {r['steps']} steps in {r['seconds']} s, payloads {r['payloads_after_warmup']} -> "
            f"{r['payloads_end']}, device bytes {r['allocated_after_warmup']} -> {r['allocated_end']}, "
            f"RSS {r['rss'][0][1] / 2**20:.1f} -> {r['rss'][-1][1] / 2**20:.1f} MiB "
            f"({r['rss_slope_bytes_per_step']:.0f} B/step)"
        )
    return results


def _assert_flat(results: list[dict], max_slope: float) -> None:
    for r in results:
        assert r["payloads_end"] == r["payloads_after_warmup"], r["mode"]
        assert r["allocated_end"] == r["allocated_after_warmup"], r["mode"]
        assert r["rss_slope_bytes_per_step"] < max_slope, (r["mode"], r["rss_slope_bytes_per_step"])
        assert r["last_loss"] < r["first_loss"], r["mode"]  # it trained


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_memory_stays_flat_over_a_short_training_loop():
    """150 steps per mode (debug: 30, it checks every op against PyTorch's meta kernels),
    one worker process."""
    proc = _run(
        [
            "-m",
            "tests.reliability.device_memory_worker",
            "--steps",
            "150",
            "--debug-steps",
            "30",
            "--every",
            "10",
            "--modes",
            "strict,fused,debug",
        ]
    )
    results = _result(proc)
    for r in results:
        r["rss_slope_bytes_per_step"] = _slope(r["rss"])
    # A leaked device tensor shows in payloads/bytes exactly; host-side, one leaked
    # Python object graph per step would be kilobytes per step.
    _assert_flat(results, max_slope=4096)


@pytest.mark.slow
def test_memory_stays_flat_over_10000_steps_in_each_mode():
    steps = int(os.environ.get("RELIABILITY_TRAIN_STEPS", "10000"))
    _assert_flat(
        _memory_run({"strict": steps, "fused": steps, "debug": steps}, every=max(steps // 100, 1)), max_slope=512
    )
