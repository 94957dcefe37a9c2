"""What a TPU's compiler refuses never reaches it (tpu_backend/chip_limits.py).

The rule is decided on CPU with the platform forced to "tpu" (`chip_limits.platform`):
eager ops then take the host path exactly as on a chip, compiled programs raise the
error a user would read, and the device paths that remain compile for a TPU v5e through
libtpu's compiler (`tools/tpu_op_sweep.py`, each compile in a worker process, so an abort
shows as a failure here, not as a dead pytest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import tpu_backend
from tests import chip
from tests.chip import child_env
from tpu_backend import chip_limits
from tpu_backend.chip_limits import TpuChipLimitError
from tpu_backend.dispatch import clear_jit_cache

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_rule_is_a_function_of_op_dtypes_and_platform():
    svd = aten._linalg_svd.default
    assert chip_limits.limit_for(svd, [torch.float64]).action == "host"
    assert chip_limits.limit_for(svd, ["float64"], platform="cpu") is None
    assert chip_limits.limit_for(svd, [torch.float32]) is None  # compiles (see linalg._svd)
    assert chip_limits.limit_for(aten.mm.default, [torch.int64, torch.int64]).action == "host"
    assert chip_limits.limit_for(aten.mm.default, [torch.int32, torch.int32]) is None
    assert chip_limits.limit_for(aten.convolution.default, ["int64", "int64"]).action == "host"
    assert chip_limits.limit_for(aten.signbit.default, ["float64"]).action == "host"
    assert chip_limits.limit_for(aten._fft_r2c.default, ["float64"]).action == "raise"
    assert chip_limits.limit_for(aten.add.Tensor, [torch.float64]) is None  # float64 arithmetic compiles


@pytest.fixture
def as_on_a_tpu():
    clear_jit_cache()  # programs traced for CPU would otherwise be reused
    with chip_limits.platform("tpu"):
        yield
    clear_jit_cache()


def test_float64_linear_algebra_runs_on_the_host_with_one_warning(as_on_a_tpu):
    a = torch.randn(5, 3, dtype=torch.float64)
    before = tpu_backend.cpu_fallback_counts().get("aten._linalg_svd.default", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.linalg.svdvals(a.to("tpu"))
        second = torch.linalg.svdvals((2 * a).to("tpu"))
    messages = [str(w.message) for w in caught if "ran on the host" in str(w.message)]
    assert len(messages) == 1, messages
    assert "aten._linalg_svd.default on float64" in messages[0] and "float32" in messages[0]
    assert first.device.type == "tpu" and first.dtype == torch.float64
    torch.testing.assert_close(first.cpu(), torch.linalg.svdvals(a), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(second.cpu(), torch.linalg.svdvals(2 * a), rtol=1e-12, atol=1e-12)
    assert tpu_backend.cpu_fallback_counts()["aten._linalg_svd.default"] == before + 2


def test_fused_mode_runs_it_on_the_host_at_once(as_on_a_tpu, fused_mode):
    a = torch.randn(4, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # the second time the fused graph's state has been seen before
            inverse = torch.linalg.inv(a.to("tpu") * 2) + 1  # a pending input, a pending consumer
            torch.testing.assert_close(inverse.cpu(), torch.linalg.inv(a * 2) + 1, rtol=1e-12, atol=1e-12)


def test_float64_fft_says_to_compute_in_float32(as_on_a_tpu):
    with pytest.raises(TpuChipLimitError, match=r"aten._fft_r2c.default on float64 .*x\.float\(\)"):
        torch.fft.rfft(torch.randn(8, dtype=torch.float64).to("tpu"))


def test_int64_matrix_product_runs_on_the_host(as_on_a_tpu):
    m = torch.arange(12).reshape(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        product = m.to("tpu") @ m.T.to("tpu")
    assert product.dtype == torch.int64
    assert torch.equal(product.cpu(), m @ m.T)


def test_float64_beyond_what_the_chip_holds_is_refused_on_the_way_there(as_on_a_tpu):
    with pytest.raises(
        ValueError, match=r"float64 value 1e\+300 at index \(1, 0\) cannot be moved to a TPU.*would become inf"
    ):
        torch.tensor([[1.0], [1e300]], dtype=torch.float64).to("tpu")
    held = torch.tensor([3e38, -1e-30, float("inf"), float("nan")], dtype=torch.float64)
    torch.testing.assert_close(held.to("tpu").cpu(), held, equal_nan=True)  # in range, or not finite: kept
    assert torch.tensor([1e300], dtype=torch.float64).to("tpu", dtype=torch.float32).isinf().all()  # float32 as on CPU


@pytest.mark.chip_difference("float64")  # the chip stores -0.0 as 0.0: what the host then sees
def test_float64_bit_manipulation_runs_on_the_host(as_on_a_tpu):
    x = torch.tensor([-2.5, -0.0, 0.0, 1e-310, 3.0], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(torch.signbit(x.to("tpu")).cpu(), torch.signbit(x))
        assert torch.equal(torch.copysign(x.to("tpu"), -1.0).cpu(), torch.copysign(x, -1.0))


def test_float32_svd_stays_on_the_device_and_is_right(as_on_a_tpu):
    a = torch.randn(2, 6, 4)
    before = dict(tpu_backend.cpu_fallback_counts())
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=False)
    assert tpu_backend.cpu_fallback_counts() == before
    u, s, vh = u.cpu().double(), s.cpu().double(), vh.cpu().double()
    torch.testing.assert_close(s, torch.linalg.svdvals(a.double()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(u @ torch.diag_embed(s) @ vh, a.double(), rtol=1e-5, atol=1e-5)
    solution = torch.linalg.lstsq(a.to("tpu"), a[..., :1].to("tpu")).solution.cpu()
    torch.testing.assert_close(solution, torch.linalg.lstsq(a, a[..., :1]).solution, rtol=1e-4, atol=1e-4)


def test_a_compiled_program_raises_before_xla_and_says_what_to_do(as_on_a_tpu):
    step = torch.compile(lambda a: torch.linalg.qr(a).R + 1, backend="tpu")
    with pytest.raises(TpuChipLimitError) as error:
        step(torch.randn(4, 4, dtype=torch.float64).to("tpu"))
    message = str(error.value)
    for words in ("aten.linalg_qr.default", "float64", "LuDecomposition", "x.float()", "x.cpu()"):
        assert words in message, message


def test_complex128_results_name_the_dtype_and_the_way_out():
    """Off the chip the complex128 result is refused; on a TPU the chip's own limit (float64 FFT)
    refuses it first, as `TpuChipLimitError`, whose message names the op, the dtype and the way out."""
    expected = (
        (TpuChipLimitError, r"float64.*x\.cpu\(\)")
        if chip.ON_TPU
        else (TypeError, r"complex128 .*complex64.*x\.cpu\(\)")
    )
    with pytest.raises(expected[0], match=expected[1]):
        torch.fft.rfft(torch.randn(8, dtype=torch.float64).to("tpu"))


def _libtpu() -> bool:
    from kernels import tpu

    return tpu.libtpu_version() is not None


@pytest.mark.slow  # the default suite's time budget: run with -m slow
@pytest.mark.skipif(not _libtpu(), reason="compiling for a TPU on this machine needs libtpu (tools/setup.sh)")
@pytest.mark.chip_difference("one_process")  # on the chip the tests above are the proof
def test_linear_algebra_compiles_for_a_v5e_and_nothing_aborts(tmp_path):
    """The device's SVD and least-squares lowerings on OpInfo's samples, compiled for
    a v5e: float32 compiles (float32 SVD aborted XLA before `linalg._svd`), float64
    is turned away by the policy before XLA."""
    out = tmp_path / "sweep.json"
    command = [sys.executable, os.path.join(ROOT, "tools", "tpu_op_sweep.py"), "--json", str(out)]
    command += ["--ops", "linalg.svd,linalg.lstsq", "--dtypes", "float32,float64"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [
        r for r in json.loads(out.read_text()) if r["op"] in ("aten._linalg_svd.default", "aten.linalg_lstsq.default")
    ]
    assert {r["op"] for r in rows} == {"aten._linalg_svd.default", "aten.linalg_lstsq.default"}
    for row in rows:
        expected = "host" if "float64" in row["dtypes"] else "ok"
        assert row["outcome"].split(":")[0] == expected, row
