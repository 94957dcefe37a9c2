"""Every kernel lowers for TPU on this CPU machine (Mosaic lowering and Pallas's block
rules run without a chip), and its blocks fit the chip's scoped VMEM: a handful of
representative points in the default suite, the whole production grid under `-m slow`."""

from __future__ import annotations

import json

import pytest

from kernels import check_lowering, tpu
from tests.chip import child_env


@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_representative_points_lower_and_fit(chip):
    results = check_lowering.check(check_lowering.grid(fast=True), chip)
    failures = [(r.point.label, r.error, r.vmem_bytes) for r in results if not r.ok]
    assert not failures, failures
    assert {r.point.kernel for r in results} == set(check_lowering.KERNELS)
    for r in results:  # each kernel pallas_call is in the StableHLO as a Mosaic custom call
        assert r.custom_calls >= (3 if r.point.kernel == "flash_attention" and r.point.backward else 1), r.point


def test_failure_is_reported_not_raised(monkeypatch):
    """A lowering error becomes the point's result, with the exception's message."""
    point = check_lowering.grid(fast=True)[-1]

    def broken(*args, **kwargs):
        raise ValueError("boom: no lowering")

    monkeypatch.setattr("kernels.decode_attention.decode_attention", broken)
    result = check_lowering.check_point(point, "v5e")
    assert not result.ok and not result.lowered
    assert result.error == "ValueError: boom: no lowering"


def test_cli_json_and_exit_status(tmp_path, capsys):
    path = tmp_path / "v6e.json"
    status = check_lowering.main(
        ["--platform", "tpu", "--chip", "v6e", "--fast", "--kernel", "norm", "--json", str(path)]
    )
    assert status == 0
    report = json.loads(path.read_text())
    assert report["chip"]["name"] == "v6e" and report["chip"]["scoped_vmem_bytes"] == 32 * tpu.MiB
    assert len(report["results"]) == 2 and all(r["lowered"] for r in report["results"])
    assert "all lower and fit" in capsys.readouterr().out


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
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_whole_grid_lowers_and_fits(chip):
    results = check_lowering.check(None, chip)
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
        "print(kernels.check_lowering.check_point(kernels.check_lowering.grid(fast=True)[3], 'v6e').ok)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-2000:]
