"""A second process with the same cache folder skips AOTAutograd, our lowering and XLA
(issue 32): the lowered-program store (`program_cache.py`) and AOTAutograd's cache
(`graph_cache.py`), their corrupt entries, and keys that must miss.

The cross-process tests run `python -m benchmarks.device.compile_time_bench --child` (one training
step of a `backend_bench.py` model case, reported as JSON) in fresh processes. No timing
is asserted here: the ratios are the benchmark's."""

from __future__ import annotations

import json
import operator
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import tpu_backend.compile as tpu_compile
from tests.chip import child_env
from tpu_backend.compile import Program, compile_stats, graph_cache, program_cache
from tpu_backend.compile.compiled_graph import graph_identity
from tpu_backend.compile.graph_cache import GraphRecord
from tpu_backend.compile.interpreter import GraphFunction
from tpu_backend.compile.scan import INVOKE_SUBGRAPH

ROOT = Path(__file__).resolve().parents[3]
BENCH = "benchmarks.device.compile_time_bench"


def first_step(cache: Path, mode: str = "tpu-compile", model: str = "llama", *options: str) -> dict:
    """One fresh process's first training step with cache folder `cache`."""
    command = [sys.executable, "-m", BENCH, "--child", mode, "--model", model, "--steps", "0", *options]
    env = child_env(TPU_CACHE_DIR=str(cache))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
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


@pytest.mark.slow  # the default suite's time budget: test_cache.py::test_a_second_process_compiles_nothing crosses processes by default
def test_second_process_loads_everything_and_computes_the_same_loss(filled, tmp_path):
    second = first_step(copy_of(filled, tmp_path), "tpu-compile", "llama", *LLAMA)
    assert second["aot_cache"]["hit"] == 1 and second["aot_cache"]["miss"] == 0
    assert second["programs_compiled"] == 0  # no XLA compile of the model's programs
    assert second["programs_loaded"] == second["programs_built"] >= 2  # nor any lowering
    assert second["xla_store"]["misses"] == 0  # strict mode's optimizer programs: from disk too
    assert second["corrupt_entries"] == 0
    assert second["loss"] == filled[1]["loss"]


@pytest.mark.slow  # a subprocess pair: the slow suite
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


@pytest.mark.slow  # a subprocess pair: the slow suite
def test_a_changed_shape_misses(filled, tmp_path):
    other = first_step(copy_of(filled, tmp_path), "tpu-compile", "llama", *LLAMA, "--batch", "2")
    assert other["aot_cache"]["hit"] == 0 and other["aot_cache"]["miss"] == 1
    assert other["programs_loaded"] == 0 and other["programs_compiled"] >= 2


# three layers: the backward's first repetition is called unrolled (scan.FIRST_REPETITION_TIED),
# the other two still make a loop
SCANNED = ("--layers", "3", "--remat", "--scan-layers")


@pytest.mark.slow  # a subprocess pair (scan and the second process are each in the default run)
def test_scanned_layers_second_process_loads_programs_that_still_loop(tmp_path):
    first = first_step(tmp_path / "cache", "tpu-compile", "llama", *SCANNED)
    assert first["aot_cache"]["saved"] == 1 and first["aot_cache"]["bypass"] == 0  # subgraphs stored too
    assert sorted(first["while_loops"].values()) == [1, 1]  # forward and backward: one loop each

    second = first_step(tmp_path / "cache", "tpu-compile", "llama", *SCANNED)
    assert second["aot_cache"] == {"hit": 1, "miss": 0, "saved": 0, "bypass": 0}
    assert second["programs_compiled"] == 0 and second["programs_loaded"] == second["programs_built"] >= 2
    assert second["while_loops"] == first["while_loops"]  # the rebuilt graphs planned the same runs
    assert second["corrupt_entries"] == 0
    assert second["loss"] == first["loss"]


@pytest.mark.slow  # a subprocess pair: the slow suite
def test_compiled_optimizer_step_second_process_loads_it(tmp_path):
    first = first_step(tmp_path / "cache", "tpu-compile", "llama", *LLAMA, "--compile-optimizer")
    assert first["aot_cache"]["saved"] == 2  # the model's graph and the optimizer step's
    assert any(name.endswith("_inference") for name in first["while_loops"])  # the step is a program

    second = first_step(tmp_path / "cache", "tpu-compile", "llama", *LLAMA, "--compile-optimizer")
    assert second["aot_cache"] == {"hit": 2, "miss": 0, "saved": 0, "bypass": 0}
    assert second["programs_compiled"] == 0 and second["programs_loaded"] == second["programs_built"] >= 3
    assert second["program_store"]["misses"] == 0
    assert second["loss"] == first["loss"]


@pytest.mark.slow  # a subprocess pair: the slow suite
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


def test_an_argument_returned_unchanged_is_handed_back_not_copied(fresh_cache):
    # a scanned forward hands its weights on to the backward: XLA would copy each one (an
    # output never shares an argument's buffer), so the program hands back the argument
    import jax

    def keep_and_scale(x, y):
        return x, x * y, {"again": y}

    x, y = jax.device_put(np.arange(4.0, dtype=np.float32)), jax.device_put(np.full(4, 3.0, dtype=np.float32))
    for program in (
        Program("keep", keep_and_scale, identity="keep"),
        Program("keep", keep_and_scale, identity="keep"),  # loaded from disk, as in a new process
    ):
        first, product, rest = program(x, y)
        assert first is x and rest["again"] is y
        np.testing.assert_array_equal(np.asarray(product), np.arange(4.0) * 3)
        [text] = program.compiled_texts()
        assert text.count("copy(") == 0, text
    assert compile_stats().programs["keep"].loaded == 1
    # a donated argument is not handed back: XLA writes its output there
    donating = Program("keep_donated", keep_and_scale, donate=(0,))
    x2 = jax.device_put(np.arange(4.0, dtype=np.float32))
    first, _, _ = donating(x2, y)
    assert first is not x2 and x2.is_deleted()
    np.testing.assert_array_equal(np.asarray(first), np.arange(4.0))


def test_a_value_returned_twice_is_one_output_repeated(fresh_cache):
    # a forward that saves `x` and `x.detach()` for the backward returns one value twice:
    # XLA would copy it into a second buffer, so the program returns it once
    import jax

    def log_softmax_and_alias(x):
        y = jax.nn.log_softmax(x)
        return y, x.sum(), y

    x = jax.device_put(np.arange(8.0, dtype=np.float32).reshape(2, 4))
    for program in (
        Program("twice", log_softmax_and_alias, identity="twice"),
        Program("twice", log_softmax_and_alias, identity="twice"),  # loaded from disk
    ):
        first, total, again = program(x)
        assert again is first
        np.testing.assert_allclose(np.asarray(first), np.asarray(jax.nn.log_softmax(x)), rtol=1e-6)
        assert float(total) == 28.0
        [text] = program.compiled_texts()
        assert text.count("copy(") == 0, text
    assert compile_stats().programs["twice"].loaded == 1


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


# --------------------------------------------------------------------- graph records with subgraphs


def graph_calling(block: torch.fx.GraphModule, times: int, alias: bool = False) -> torch.fx.GraphModule:
    """`x -> block(block(...block(x)))` through invoke_subgraph, as AOTAutograd writes it:
    one get_attr node per call; with `alias` the calls after the first read a second
    attribute holding the same module."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for i in range(times):
        name = "block_b" if alias and i else "block_a"
        sub = graph.get_attr(name)
        call = graph.call_function(INVOKE_SUBGRAPH, (sub, "block", x))
        x = graph.call_function(operator.getitem, (call, 0))
    graph.output((x,))
    root = torch.nn.Module()
    root.block_a = block
    if alias:
        root.block_b = block
    return torch.fx.GraphModule(root, graph)


def block_doing(op) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(op, (x, x)),))
    block = torch.fx.GraphModule(torch.nn.Module(), graph)
    type(block).__name__ = "<lambda>"  # as Dynamo names a traced branch (the rebuilt one is "GraphModule")
    return block


@pytest.mark.parametrize("alias", [False, True], ids=["one_attribute", "two_attributes"])
def test_a_record_rebuilds_subgraphs_as_shared_modules(alias):
    gm = graph_calling(block_doing(torch.ops.aten.mul.Tensor), 3, alias)
    record = GraphRecord.of(gm)
    rebuilt = pickle.loads(pickle.dumps(record)).graph_module()

    assert graph_identity(rebuilt) == graph_identity(gm)
    calls = [n for n in rebuilt.graph.nodes if n.target is INVOKE_SUBGRAPH]
    modules = {id(getattr(rebuilt, call.args[0].target)) for call in calls}
    assert len(calls) == 3 and len(modules) == 1  # the scan planner's test of "the same block"
    function = GraphFunction(rebuilt)
    assert len(set(function.runs.values())) == 1  # one run of three calls: one lax.scan
    x = np.arange(3.0, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(function(x)[0]), x**8)


def test_a_changed_subgraph_changes_the_identity():
    times_three = graph_identity(graph_calling(block_doing(torch.ops.aten.mul.Tensor), 3))
    changed = GraphRecord.of(graph_calling(block_doing(torch.ops.aten.add.Tensor), 3)).graph_module()
    assert graph_identity(changed) != times_three


def test_the_entrys_backward_graph_copy_is_rebuilt_only_when_read():
    # AOTAutograd keeps one for compiled autograd; rebuilding it re-traces its code
    serialized = graph_cache._serialize_backward_lazily(block_doing(torch.ops.aten.mul.Tensor))
    loaded = pickle.loads(pickle.dumps(serialized))
    assert loaded.fn.reduced is None  # still bytes
    x = torch.arange(3.0)
    torch.testing.assert_close(loaded.deserialize()(x)[0], x * x)


def test_graph_identity_digests_an_expanded_one_element_constant():
    """A constant with a stride of 0 (an expanded one-element tensor, as transformers'
    Llama hands `torch.func` steps) keys the program by its value like any other."""

    def identity_with(value: float) -> str:
        module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
        module.scale = torch.as_strided(torch.tensor([value]), (1,), (0,))
        x = module.graph.placeholder("x")
        module.graph.output(module.graph.call_function(operator.mul, (x, module.graph.get_attr("scale"))))
        module.recompile()
        return graph_identity(module)

    assert identity_with(2.0) == identity_with(2.0) != identity_with(3.0)
