"""A second process with the same cache folder skips AOTAutograd, our lowering and XLA
(issue 32): the lowered-program store (`program_cache.py`) and AOTAutograd's cache
(`graph_cache.py`), their corrupt entries, and keys that must miss.

The cross-process tests run `benchmarks/compile_time_bench.py --child` (one training
step of a `backend_bench.py` model case, reported as JSON) in fresh processes. No timing
is asserted here: the ratios are the benchmark's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tpu_backend.compile as tpu_compile
from tests.chip import child_env
from tpu_backend.compile import Program, compile_stats, program_cache

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "compile_time_bench.py"


def first_step(cache: Path, mode: str = "tpu-compile", model: str = "llama", *options: str) -> dict:
    """One fresh process's first training step with cache folder `cache`."""
    command = [sys.executable, str(BENCH), "--child", mode, "--model", model, "--steps", "0", *options]
    done = subprocess.run(command, env=child_env(TPU_CACHE_DIR=str(cache)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


LLAMA = ("--layers", "1")


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, dict]:
    """A cache folder filled by one process (the Llama case, one layer), and its report."""
    cache = tmp_path_factory.mktemp("filled") / "cache"
    report = first_step(cache, "tpu-compile", "llama", *LLAMA)
    assert report["aot_cache"]["saved"] == 1 and report["programs_compiled"] >= 2
    return cache, report


def copy_of(filled, tmp_path) -> Path:
    return Path(shutil.copytree(filled[0], tmp_path / "cache"))


def test_second_process_loads_everything_and_computes_the_same_loss(filled, tmp_path):
    second = first_step(copy_of(filled, tmp_path), "tpu-compile", "llama", *LLAMA)
    assert second["aot_cache"]["hit"] == 1 and second["aot_cache"]["miss"] == 0
    assert second["programs_compiled"] == 0  # no XLA compile of the model's programs
    assert second["programs_loaded"] == second["programs_built"] >= 2  # nor any lowering
    assert second["xla_store"]["misses"] == 0  # strict mode's optimizer programs: from disk too
    assert second["corrupt_entries"] == 0
    assert second["loss"] == filled[1]["loss"]


def test_corrupt_entries_are_deleted_rebuilt_and_rewritten(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    # every store: an executable JAX loaded from its own store is not put in ours (program_cache.save)
    stored = [*cache.glob("*.xla"), *cache.glob("programs/*.prog"), *cache.glob("aotautograd/*/*.aot")]
    assert any(p.suffix == ".prog" for p in stored) and any(p.suffix == ".aot" for p in stored)
    for path in stored:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1 :])

    repaired = first_step(cache, "tpu-compile", "llama", *LLAMA)
    assert repaired["corrupt_entries"] >= len(stored) - 1  # tiny programs the step no longer needs may stay
    assert repaired["aot_cache"]["miss"] == 1 and repaired["programs_loaded"] == 0
    assert repaired["loss"] == filled[1]["loss"]

    again = first_step(cache, "tpu-compile", "llama", *LLAMA)  # the rewritten entries load
    assert again["corrupt_entries"] == 0 and again["aot_cache"]["hit"] == 1
    assert again["programs_compiled"] == 0 and again["programs_loaded"] >= 2
    assert again["loss"] == filled[1]["loss"]


def test_a_changed_shape_misses(filled, tmp_path):
    other = first_step(copy_of(filled, tmp_path), "tpu-compile", "llama", *LLAMA, "--batch", "2")
    assert other["aot_cache"]["hit"] == 0 and other["aot_cache"]["miss"] == 1
    assert other["programs_loaded"] == 0 and other["programs_compiled"] >= 2


def test_fused_mode_second_process_loads_its_program(tmp_path):
    first = first_step(tmp_path / "cache", "tpu-fused", "mlp")
    second = first_step(tmp_path / "cache", "tpu-fused", "mlp")
    assert first["programs_compiled"] >= 1
    assert second["programs_compiled"] == 0 and second["programs_loaded"] == second["programs_built"] >= 1
    assert second["loss"] == first["loss"]


# --------------------------------------------------------------------- the program store, in one process


@pytest.fixture
def fresh_cache(tmp_path):
    with tpu_compile.using_cache_dir(tmp_path / "xla") as folder:
        compile_stats().reset()
        yield folder


def counted_double():
    traced = []

    def double(x):
        traced.append(x.shape)
        return x * 2

    return double, traced


def test_a_program_with_an_identity_loads_without_tracing(fresh_cache):
    double, traced = counted_double()
    x = np.arange(4.0, dtype=np.float32)
    Program("double", double, identity="x * 2")(x)
    got = Program("double", double, identity="x * 2")(x)  # a new program object: as in a new process
    np.testing.assert_array_equal(np.asarray(got), x * 2)
    assert len(traced) == 1 and compile_stats().programs["double"].loaded == 1

    Program("double", double, identity="x * 2")(np.arange(6.0, dtype=np.float32))  # another shape: traced
    Program("double", double, identity="x * 3")(x)  # another identity: traced
    assert len(traced) == 3


def forget_xla_entries(folder: Path) -> None:
    for path in folder.glob("*.xla"):
        path.unlink()


def test_a_corrupt_or_stale_program_entry_is_rebuilt(fresh_cache):
    double, traced = counted_double()
    x = np.arange(4.0, dtype=np.float32)
    Program("double", double, identity="x * 2")(x)
    (entry,) = program_cache.store().entries()
    entry.write_bytes(entry.read_bytes()[:-1])
    forget_xla_entries(fresh_cache)  # XLA compiles again: only a fresh executable is stored
    with pytest.warns(RuntimeWarning, match="corrupt or truncated"):
        Program("double", double, identity="x * 2")(x)
    assert len(traced) == 2 and entry.exists()  # rebuilt and rewritten

    key = entry.name[: -len(program_cache.SUFFIX)]
    stale = program_cache.pickle.loads(program_cache.store().get(key))
    stale["text"] += "\nsomething else"
    program_cache.store().put(key, program_cache.pickle.dumps(stale))
    forget_xla_entries(fresh_cache)
    with pytest.warns(RuntimeWarning, match="another program"):
        Program("double", double, identity="x * 2")(x)
    assert len(traced) == 3

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Program("double", double, identity="x * 2")(x)
    assert len(traced) == 3
