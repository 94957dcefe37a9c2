"""The compilation cache: statistics, the on-disk cache across processes, corrupt entries,
cache-only mode and debug dumps."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import tpu_backend.compile as tpu_compile
from tests import chip
from tests.chip import child_env
from tpu_backend.compile import CacheMissError, Program, cache_only, compile_stats

CHILD = Path(__file__).with_name("cache_child.py")


def scaled_softplus(x, scale):
    return jnp.log1p(jnp.exp(x)) * scale


# Inputs are numpy arrays: building them with jnp would compile (and cache) little JAX
# programs of its own, which would blur the counts and cache-only checks below.


@pytest.fixture
def fresh_cache(tmp_path):
    """An empty cache folder for one test (the module's folder comes back afterwards)."""
    with tpu_compile.using_cache_dir(tmp_path / "xla") as folder:
        compile_stats().reset()
        yield folder


def entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.xla") if not p.name.startswith(".tmp-"))


# --------------------------------------------------------------------- statistics in one process


def test_stats_count_requests_hits_and_compiles(fresh_cache):
    program = Program("softplus", scaled_softplus)
    x = np.arange(4.0, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_allclose(
            program(x, 2.0), np.log1p(np.exp(x)) * 2, rtol=chip.tolerance("transcendentals", cpu=1e-6, tpu=2e-4)
        )
    program(np.arange(6.0, dtype=np.float32), 2.0)  # new shape
    program(x, 3.0)  # new static value

    stats = compile_stats().programs["softplus"]
    assert (stats.requests, stats.hits, stats.misses, stats.disk_hits) == (5, 2, 3, 0)
    assert stats.compile_seconds > 0
    assert "softplus" in compile_stats().summary()


def test_a_new_program_with_the_same_computation_loads_from_disk(fresh_cache):
    x = np.arange(4.0, dtype=np.float32)
    Program("first", scaled_softplus)(x, 2.0)
    assert entries(fresh_cache)
    Program("second", scaled_softplus)(x, 2.0)
    assert compile_stats().programs["second"].disk_hits == 1
    assert compile_stats().programs["second"].misses == 0


def test_record_compile_reports_other_compile_paths(fresh_cache):
    tpu_compile.record_compile("eager/aten.add.Tensor", 0.25)
    tpu_compile.record_compile("eager/aten.add.Tensor", 0.01, from_disk=True)
    tpu_compile.record_hit("eager/aten.add.Tensor")
    stats = compile_stats().programs["eager/aten.add.Tensor"]
    assert (stats.requests, stats.hits, stats.disk_hits, stats.misses) == (3, 1, 1, 1)
    assert stats.compile_seconds == pytest.approx(0.26)


# --------------------------------------------------------------------- across processes


def run_child(cache: Path, *flags: str) -> dict:
    env = child_env(TPU_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, str(CHILD), *flags], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
    cache = tmp_path / "shared"
    cold = run_child(cache)
    warm = run_child(cache, "--cache-only")  # cache_only(): any compile would raise

    assert cold["cache_dir"] == str(cache)
    assert cold["misses"] == 2 and cold["disk_hits"] == 0  # forward + backward compiled
    assert warm["misses"] == 0 and warm["disk_hits"] == 2  # both loaded from disk
    # JAX's own count agrees: XLA compiled both programs in the first process, nothing in the
    # second (not even a small helper program, e.g. a copy of an input)
    assert cold["xla_compiles"] == 2 and warm["xla_compiles"] == 0
    assert warm["loss"] == cold["loss"]
    print(
        f"\nfirst step: cold {cold['first_step_seconds']:.2f} s (programs {cold['compile_seconds']:.2f} s), "
        f"warm {warm['first_step_seconds']:.2f} s (programs {warm['compile_seconds']:.2f} s)"
    )


# --------------------------------------------------------------------- corrupt entries


def flip_byte(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


CORRUPTIONS = {
    "header-bit-flip": lambda d: flip_byte(d, 3),
    "payload-bit-flip": lambda d: flip_byte(d, len(d) // 2),
    "last-byte-flip": lambda d: flip_byte(d, len(d) - 1),
    "truncated-to-half": lambda d: d[: len(d) // 2],
    "truncated-to-10-bytes": lambda d: d[:10],
    "empty": lambda d: b"",
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_entry_is_detected_replaced_and_recompiled(fresh_cache, corrupt):
    x = np.arange(5.0, dtype=np.float32)
    want = np.asarray(Program("before", scaled_softplus)(x, 2.0))
    stored = {path: path.read_bytes() for path in entries(fresh_cache)}
    for path, data in stored.items():
        path.write_bytes(corrupt(data))

    with pytest.warns(RuntimeWarning, match="corrupt or truncated"):
        got = Program("after", scaled_softplus)(x, 2.0)

    np.testing.assert_array_equal(np.asarray(got), want)
    assert compile_stats().programs["after"].misses == 1  # recompiled, not loaded
    assert compile_stats().corrupt_entries >= 1
    assert tpu_compile.verify_cache() == []  # the rewritten entries verify
    assert {p.name for p in entries(fresh_cache)} == {p.name for p in stored}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a healthy entry loads silently
        Program("again", scaled_softplus)(x, 2.0)
    assert compile_stats().programs["again"].disk_hits == 1


def test_verify_cache_removes_corrupt_entries(fresh_cache):
    Program("sample", scaled_softplus)(np.ones(3, np.float32), 1.0)
    victim = entries(fresh_cache)[0]
    victim.write_bytes(flip_byte(victim.read_bytes(), 100))
    with pytest.warns(RuntimeWarning, match=victim.name):
        removed = tpu_compile.verify_cache()
    assert removed == [victim] and not victim.exists()


# --------------------------------------------------------------------- cache-only mode


def test_cache_only_raises_on_a_miss_naming_the_program(fresh_cache):
    with cache_only(), pytest.raises(CacheMissError, match=r"'never_compiled'.*float32\[7\]"):
        Program("never_compiled", scaled_softplus)(np.ones(7, np.float32), 1.0)
    assert compile_stats().programs.get("never_compiled") is None
    assert entries(fresh_cache) == []  # nothing was compiled or written


def test_cache_only_passes_when_everything_is_cached(fresh_cache):
    x = np.ones(7, np.float32)
    Program("warm_up", scaled_softplus)(x, 1.0)
    with cache_only():
        Program("served_from_disk", scaled_softplus)(x, 1.0)  # memory miss, disk hit
    assert compile_stats().programs["served_from_disk"].disk_hits == 1


def test_cache_only_without_a_disk_cache_refuses_to_compile(fresh_cache):
    tpu_compile.set_cache_dir(None)
    assert tpu_compile.ensure_persistent_cache() is None
    with cache_only(), pytest.raises(CacheMissError, match="disabled"):
        Program("no_disk", scaled_softplus)(np.ones(2, np.float32), 1.0)


# --------------------------------------------------------------------- dumps


def test_dump_writes_stablehlo_and_source(fresh_cache, tmp_path):
    folder = tmp_path / "dump"
    with tpu_compile.dump(folder):
        Program("dumped", scaled_softplus, source="def softplus(x): ...\n")(np.ones(3, np.float32), 2.0)
    Program("not_dumped", scaled_softplus)(np.ones(3, np.float32), 2.0)

    hlo = (folder / "dumped.0.stablehlo.mlir").read_text()
    assert "float32[3]" in hlo.splitlines()[0] and "stablehlo" in hlo
    assert (folder / "dumped.fx.py").read_text() == "def softplus(x): ...\n"
    assert not list(folder.glob("not_dumped*"))


def test_dump_folder_from_the_environment(fresh_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_DUMP_DIR", str(tmp_path / "from_env"))
    Program("env_dumped", scaled_softplus)(np.ones(2, np.float32), 1.0)
    assert (tmp_path / "from_env" / "env_dumped.0.stablehlo.mlir").exists()


def test_using_cache_dir_restores_the_previous_setting(tmp_path):
    before = (tpu_compile.cache_dir(), tpu_compile.disk_cache())
    with tpu_compile.using_cache_dir(tmp_path / "elsewhere") as folder:
        assert tpu_compile.disk_cache().path == folder == tmp_path / "elsewhere"
    assert tpu_compile.cache_dir() == before[0]
    assert (tpu_compile.disk_cache() is None) == (before[1] is None)
