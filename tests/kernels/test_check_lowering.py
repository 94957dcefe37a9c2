"""Every kernel compiles for TPU on this CPU machine (libtpu's compile-only devices run the
chip's whole compiler, Mosaic's passes included; lowering alone missed what a v5e refused,
#32), with 64-bit mode on as the "tpu" device runs, and its blocks fit the chip's scoped
VMEM: a handful of representative points per chip in the default suite (a line per chip
in the "kernel report" section of pytest's output), the whole production grid under
`-m slow`."""

from __future__ import annotations

import json
import time

import pytest

from kernels import check_lowering, tpu, tuning
from tests.chip import child_env

needs_libtpu = pytest.mark.skipif(
    tpu.libtpu_version() is None, reason="compiling for a TPU needs libtpu (tools/setup.sh installs it)"
)


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5e", pytest.param("v6e", marks=pytest.mark.slow)])
def test_representative_points_compile_and_fit(chip, report_line):
    start = time.perf_counter()
    results = check_lowering.check(check_lowering.grid(fast=True), chip)
    report_line(check_lowering.summary(results, tpu.chip(chip), time.perf_counter() - start) + " (--fast)")
    failures = [(r.point.label, r.error, r.vmem_bytes) for r in results if not r.ok]
    assert not failures, failures
    assert all(r.compiled for r in results)
    assert {r.point.kernel for r in results} == set(check_lowering.KERNELS)
    for r in results:  # each kernel pallas_call is in the program as a Mosaic custom call
        assert r.custom_calls >= (3 if r.point.kernel == "flash_attention" and r.point.backward else 1), r.point


@needs_libtpu
def test_what_the_chip_refuses_fails_the_point(monkeypatch):
    """A kernel that lowers but that Mosaic's compiler refuses (#32: a boolean vector
    reshaped to 2-D) is a failed point that names the operation, not a pass."""
    import jax.numpy as jnp
    from jax import lax

    from kernels import norms

    def positions_via_a_bool_vector(shape, axis, offset=0):
        rows = lax.broadcasted_iota(jnp.int32, (shape[0],), 0) + offset
        keep = (rows >= 0)[:, None]  # vector<Nxi1> -> vector<Nx1xi1>: Mosaic cannot lay it out
        return jnp.where(keep, rows[:, None], 0) + jnp.zeros(shape, jnp.int32)

    monkeypatch.setattr(norms, "positions", positions_via_a_bool_vector)
    # a shape no other test traces (the jitted kernels are cached by shape)
    point = check_lowering._point("norm", True, "float32", rows=7, hidden=640, residual=False, layer=False)
    compiled = check_lowering.check_point(point, "v5e")
    lowered_only = check_lowering.check_point(point, "v5e", compile=False)
    assert lowered_only.ok and lowered_only.compiled is None
    assert compiled.lowered and compiled.compiled is False and not compiled.ok
    assert compiled.error.startswith("compile: ") and "shape cast" in compiled.error, compiled.error


def test_failure_is_reported_not_raised(monkeypatch):
    """A lowering error becomes the point's result, with the exception's message."""
    point = check_lowering.grid(fast=True)[-1]

    def broken(*args, **kwargs):
        raise ValueError("boom: no lowering")

    monkeypatch.setattr("kernels.decode_attention.decode_attention", broken)
    result = check_lowering.check_point(point, "v5e")
    assert not result.ok and not result.lowered
    assert result.error == "lowering: ValueError: boom: no lowering"


def test_cli_json_and_exit_status(tmp_path, capsys):
    path = tmp_path / "v6e.json"
    status = check_lowering.main(
        ["--platform", "tpu", "--chip", "v6e", "--fast", "--kernel", "norm", "--json", str(path)]
    )
    assert status == 0
    report = json.loads(path.read_text())
    assert report["chip"]["name"] == "v6e" and report["chip"]["scoped_vmem_bytes"] == 32 * tpu.MiB
    assert len(report["results"]) == 2 and all(r["lowered"] for r in report["results"])
    out = capsys.readouterr().out
    if report["fallback"] is None:
        assert all(r["compiled"] for r in report["results"])
        assert "TPU v6e: 2 of 2 points compiled and fit VMEM" in out
    else:  # no libtpu here: lowered only, and the output says so first
        assert out.startswith("NOT COMPILING for TPU v6e") and "lowered (NOT compiled)" in out


def test_without_libtpu_the_report_says_it_only_lowered(monkeypatch, capsys):
    monkeypatch.setattr(tpu, "libtpu_version", lambda: None)
    assert check_lowering.main(["--chip", "v5e", "--fast", "--kernel", "decode_attention"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NOT COMPILING for TPU v5e: libtpu is not installed")
    assert "TPU v5e: 1 of 1 points lowered (NOT compiled)" in out


def test_over_budget_point_fails_the_run(monkeypatch):
    """A footprint over the chip's scoped VMEM is a failure even when it lowers."""
    tiny = tpu.Chip("v5e", "TPU v5 lite", 8, 128, 128 * tpu.MiB, 1 * tpu.MiB, 4, 128)
    monkeypatch.setitem(tpu.CHIPS, "v5e", tiny)
    point = [p for p in check_lowering.grid(fast=True) if p.kernel == "norm"][0]
    assert check_lowering.main(["--chip", "v5e", "--fast", "--kernel", "norm", "--failures-only"]) == 1
    assert check_lowering.norm_rejection(
        point.params["rows"], point.params["hidden"], "bfloat16", residual=True, chip="v5e"
    ).startswith("VMEM")


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_whole_grid_compiles_and_fits(chip, report_line):
    start = time.perf_counter()
    results = check_lowering.check(None, chip)
    report_line(check_lowering.summary(results, tpu.chip(chip), time.perf_counter() - start))
    failures = [(r.point.kernel, r.point.dtype, r.point.label, r.error, r.vmem_bytes) for r in results if not r.ok]
    assert not failures, failures[:5]


def test_kernels_package_is_pure_jax():
    """kernels/ imports neither torch nor tpu_backend (#18): usable by a JAX user without torch."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['tpu_backend'] = None\n"
        "import kernels.check_lowering, kernels.flash_attention, kernels.norms, kernels.cross_entropy, "
        "kernels.decode_attention, kernels.tuning, kernels.tpu\n"
        "print(kernels.check_lowering.check_point(kernels.check_lowering.grid(fast=True)[3], 'v6e', compile=False).ok)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-2000:]


def test_the_rules_answer_from_memory_until_the_block_sizes_change(monkeypatch):
    # The routers ask these on every eager call of a kernel op: remembered per arguments,
    # and per `tuning.override` in force, whose blocks change the answer.
    rows, dim = 4096, 384
    assert check_lowering.norm_rejection(rows, dim, "float32", chip="v5e") is None
    with tuning.override("norm", block_rows=3):  # not a multiple of 8 sublanes
        assert check_lowering.norm_rejection(rows, dim, "float32", chip="v5e").startswith("layout")
    assert check_lowering.norm_rejection(rows, dim, "float32", chip="v5e") is None

    asked = []
    check_lowering.cross_entropy_rejection.forget()
    monkeypatch.setattr(check_lowering, "_first_rejection", lambda calls, chip: asked.append(chip))
    for _ in range(3):
        check_lowering.cross_entropy_rejection(4096, 512, "float32", chip="v5e")
    assert asked == ["v5e"]  # worked out once
