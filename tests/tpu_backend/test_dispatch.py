"""The dispatcher: derived variants, missing-op errors, CPU fallback, decompositions, debug mode."""

import warnings

import jax.numpy as jnp
import pytest
import torch

import tpu_backend
from tests.chip import child_env
from tpu_backend.ops.registry import JAX_LOWERINGS, Lowering

# Ops defined here have a CPU kernel only, so on tpu they reach the catch-all fallback.
_LIB = torch.library.Library("tpu_dispatch_test", "DEF")
_LIB.define("cpu_only(Tensor x) -> Tensor")
_LIB.impl("cpu_only", lambda x: x * 10 + 1, "CPU")
_LIB.define("cpu_only_inplace_(Tensor(a!) x) -> Tensor(a!)")
_LIB.impl("cpu_only_inplace_", lambda x: x.mul_(3), "CPU")
_LIB.define("scaled_add(Tensor x, Tensor y) -> Tensor")
_LIB.impl("scaled_add", lambda x, y: x + 2 * y, "CPU")
torch._decomp.register_decomposition(torch.ops.tpu_dispatch_test.scaled_add.default)(lambda x, y: x + 2 * y)
# An op whose tpu lowering returns the wrong shape, for debug mode to catch.
_LIB.define("wrong_shape(Tensor x) -> Tensor")
_LIB.impl("wrong_shape", lambda x: torch.empty_like(x), "Meta")
JAX_LOWERINGS[torch.ops.tpu_dispatch_test.wrong_shape.default] = Lowering(lambda x: jnp.zeros((1,), x.dtype))
tpu_backend.register_new_lowerings()


@pytest.fixture
def cpu_fallback():
    tpu_backend.set_cpu_fallback(True)
    yield
    tpu_backend.set_cpu_fallback(False)


@pytest.fixture
def debug_mode():
    tpu_backend.set_eager_mode("debug")
    yield
    tpu_backend.set_eager_mode("strict")


def test_missing_op_error_names_op_and_user_line():
    x = torch.ones(3).to("tpu")
    with pytest.raises(NotImplementedError) as error:
        torch.ops.tpu_dispatch_test.cpu_only(x)
    message = str(error.value)
    assert "no tpu lowering for tpu_dispatch_test.cpu_only.default" in message
    assert f"{__file__}:" in message  # the user's line, not a frame inside torch or the backend
    assert "set_cpu_fallback(True)" in message


def test_cpu_fallback_runs_op_warns_and_counts(cpu_fallback):
    x = torch.arange(3.0).to("tpu")
    before = tpu_backend.cpu_fallback_counts().get("tpu_dispatch_test.cpu_only.default", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.ops.tpu_dispatch_test.cpu_only(x)
        torch.ops.tpu_dispatch_test.cpu_only(x)
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), torch.tensor([1.0, 11.0, 21.0]))
    assert tpu_backend.cpu_fallback_counts()["tpu_dispatch_test.cpu_only.default"] == before + 2
    if before == 0:
        assert any("ran on CPU" in str(w.message) for w in caught)


def test_cpu_fallback_writes_inplace_results_back(cpu_fallback):
    x = torch.ones(4).to("tpu")
    view = x[1:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = torch.ops.tpu_dispatch_test.cpu_only_inplace_(view)
    assert result is view
    torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 3.0, 3.0, 1.0]))


def test_inplace_and_out_variants_are_derived_from_the_functional_lowering():
    a, b = torch.randn(4), torch.randn(4)
    x = a.to("tpu")
    x.mul_(b.to("tpu"))
    torch.testing.assert_close(x.cpu(), a * b)
    out = torch.empty(4).to("tpu")
    torch.sub(a.to("tpu"), b.to("tpu"), alpha=2, out=out)
    torch.testing.assert_close(out.cpu(), a - 2 * b)


def test_integer_inplace_keeps_dtype():
    x = torch.tensor([1, 2, 3]).to("tpu")
    x.add_(2)
    assert x.dtype == torch.int64
    assert x.cpu().tolist() == [3, 4, 5]


def test_op_without_table_entry_runs_through_torch_decomp():
    # A CPU-only op with a torch._decomp decomposition into table ops (add, mul).
    op = torch.ops.tpu_dispatch_test.scaled_add.default
    before = tpu_backend.dispatch.DECOMPOSED_COUNTS[str(op)]
    a, b = torch.randn(5), torch.randn(5)
    result = torch.ops.tpu_dispatch_test.scaled_add(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(result.cpu(), a + 2 * b)
    assert tpu_backend.dispatch.DECOMPOSED_COUNTS[str(op)] == before + 1


def test_debug_mode_names_op_that_produced_nan(debug_mode):
    x = torch.tensor([-1.0, 4.0]).to("tpu")
    with pytest.raises(FloatingPointError, match=r"aten\.sqrt\.default produced NaN/Inf") as error:
        torch.sqrt(x)
    assert f"{__file__}:" in str(error.value)


def test_debug_mode_checks_shapes_against_meta(debug_mode):
    with pytest.raises(tpu_backend.TpuDebugError, match="PyTorch's meta says"):
        torch.ops.tpu_dispatch_test.wrong_shape(torch.ones(3).to("tpu"))


def test_debug_mode_gives_same_values_as_strict(debug_mode):
    a = torch.randn(5, 3)
    torch.testing.assert_close((a.to("tpu") * 2 + 1).cpu(), a * 2 + 1)


def test_eager_mode_switch_validates():
    assert tpu_backend.get_eager_mode() == "strict"
    with pytest.raises(ValueError, match="eager mode 'fast'"):
        tpu_backend.set_eager_mode("fast")


def test_environment_variables_choose_mode_and_fallback():
    import os
    import subprocess
    import sys

    code = "import tpu_backend, tpu_backend.dispatch as d; print(tpu_backend.get_eager_mode(), d._cpu_fallback)"
    env = child_env(TPU_EAGER_MODE="debug", TPU_CPU_FALLBACK="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["debug", "True"]


def test_inplace_refuses_a_result_dtype_aten_would_refuse():
    x = torch.tensor([1, 2, 3]).to("tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.mul_(0.5)
    assert x.cpu().tolist() == [1, 2, 3]
    flags = torch.zeros(3).to("tpu")
    flags.eq_(torch.tensor([0.0, 1.0, 0.0]).to("tpu"))  # bool result into float: allowed
    assert flags.cpu().tolist() == [1.0, 0.0, 1.0]


def _programs_launched() -> int:
    from tpu_backend import tensor as tpu_tensor
    from tpu_backend.eager.runner import CACHE_STATS

    return CACHE_STATS.requests + sum(tpu_tensor.EAGER_STORAGE_CALLS.values())


def test_view_inputs_are_gathered_inside_the_ops_program():
    x_cpu = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    y_cpu = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    cases = {  # a transpose, a reshape, an offset slice and a strided slice, each feeding one op
        "mm of transposes": lambda a, b: torch.mm(a.t(), b.t()),
        "add of a reshape": lambda a, b: a.reshape(12, 4) + 1,
        "mul of an offset slice": lambda a, b: a[2:5, 1:7] * b[1:4, :],
        "sum of a strided slice": lambda a, b: a[::2, 1::3].sum(),
    }
    for name, fn in cases.items():
        expected = fn(x_cpu, y_cpu)
        fn(x, y)  # compile
        before = _programs_launched()
        got = fn(x, y)
        assert _programs_launched() - before == 1, name  # the op alone: no gather program per view
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5, msg=name)


def test_strict_counts_a_compile_once_per_new_signature():
    torch.tpu.reset_cache_stats()
    a = torch.randn(3, 5).to("tpu")
    for _ in range(3):
        a * 2.5  # the float is dynamic: one program for every value
    b = torch.randn(7, 2).to("tpu")
    b * 2.5  # new shapes: a second compile
    stats = torch.tpu.cache_stats()
    assert (stats["requests"], stats["misses"], stats["hits"]) == (4, 2, 2)
    assert stats["compile_seconds"] > 0
