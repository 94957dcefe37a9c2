"""`torch.set_float32_matmul_precision` decides the precision of float32 matmuls and
convolutions on "tpu": read in the StableHLO each execution path lowers
(`precision = [HIGHEST, HIGHEST]` on dot_general, `precision_config` on convolution)."""

import contextlib
import pathlib
import re

import jax
import pytest
import torch
import torch.nn.functional as F

import tpu_backend
import tpu_backend.compile as tpu_compile
from tests import chip

EXPECTED = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


@pytest.fixture(autouse=True)
def restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def precisions(text: str) -> set[str]:
    """The precision of every dot_general and convolution in a StableHLO text (a printer
    may leave out the attribute when it is DEFAULT)."""
    found = set()
    for line in text.splitlines():
        if "stablehlo.dot_general" in line:
            found.update(re.findall(r"precision = \[(\w+), \w+\]", line) or ["DEFAULT"])
        if "stablehlo.convolution" in line:
            found.update(re.findall(r"#stablehlo<precision (\w+)>", line) or ["DEFAULT"])
    return found


def dumped_text(folder: pathlib.Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.rglob("*.mlir")))


@contextlib.contextmanager
def jax_ir_dumped_to(folder):
    """Every computation JAX compiles meanwhile is written to `folder` (strict eager's per-op jits)."""
    jax.config.update("jax_dump_ir_to", str(folder))
    try:
        yield
    finally:
        jax.config.update("jax_dump_ir_to", "")


def matmul_and_conv(size):
    """A float32 matmul and a convolution of a shape no other test uses (so they compile here)."""
    a = torch.randn(size, size + 1).to("tpu")
    image = torch.randn(1, 2, size, size).to("tpu")
    kernel = torch.randn(3, 2, 3, 3).to("tpu")
    return (a @ a.T).sum() + F.conv2d(image, kernel).sum()


def test_the_default_is_pytorchs_highest():
    assert torch.get_float32_matmul_precision() == "highest"
    assert jax.config.jax_default_matmul_precision == "highest"


@pytest.mark.parametrize("mode", ["highest", "high", "medium"])
def test_strict_eager_lowers_at_the_chosen_precision(mode, tmp_path):
    torch.set_float32_matmul_precision(mode)
    with jax_ir_dumped_to(tmp_path):
        total = matmul_and_conv(size={"highest": 9, "high": 10, "medium": 11}[mode])
    assert precisions(dumped_text(tmp_path)) == {EXPECTED[mode]}
    assert torch.isfinite(total.cpu())


def test_fused_eager_programs_follow_the_knob(tmp_path):
    tpu_backend.set_eager_mode("fused")
    try:
        for mode in ("medium", "highest"):
            torch.set_float32_matmul_precision(mode)
            with tpu_compile.dump(tmp_path / mode):
                matmul_and_conv(size=12).cpu()  # the sync point runs the recorded graph
    finally:
        tpu_backend.set_eager_mode("strict")
    assert precisions(dumped_text(tmp_path / "medium")) == {"DEFAULT"}
    assert precisions(dumped_text(tmp_path / "highest")) == {"HIGHEST"}


def test_torch_compile_recompiles_when_the_precision_changes(tmp_path):
    model = torch.nn.Linear(6, 3).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 6).to("tpu")
    stats = tpu_compile.compile_stats()

    def misses():
        return sum(p.misses + p.disk_hits for p in stats.programs.values())

    with tpu_compile.dump(tmp_path / "highest"):
        reference = compiled(x).cpu()
    torch.set_float32_matmul_precision("high")
    before = misses()
    with tpu_compile.dump(tmp_path / "high"):
        out = compiled(x).cpu()
    assert misses() == before + 1  # a new executable, not the one lowered at HIGHEST
    torch.set_float32_matmul_precision("highest")
    with tpu_compile.dump(tmp_path / "back"):
        compiled(x).cpu()
    assert misses() == before + 1 and not list((tmp_path / "back").glob("*.mlir"))  # served from memory

    assert precisions(dumped_text(tmp_path / "highest")) == {"HIGHEST"}
    assert precisions(dumped_text(tmp_path / "high")) == {"HIGH"}
    # JAX's CPU runtime computes float32 at every precision; a TPU's "high" is 3 bfloat16 passes
    rtol, atol = chip.tolerance("matmul_passes", cpu=(1.3e-6, 1e-5), tpu=(1e-4, 1e-4))
    torch.testing.assert_close(out, reference, rtol=rtol, atol=atol)
    torch.testing.assert_close(reference, model.cpu()(x.cpu()), rtol=1e-5, atol=1e-5)


def test_a_program_exported_for_tpu_carries_the_precision():
    model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    torch.set_float32_matmul_precision("medium")
    exported = tpu_backend.export(model, (x,), platforms=("tpu",))
    assert precisions(exported.mlir_module()) == {"DEFAULT"}
    torch.set_float32_matmul_precision("highest")
    assert precisions(tpu_backend.export(model, (x,), platforms=("tpu",)).mlir_module()) == {"HIGHEST"}


def test_the_precision_context_manager_restores_the_knob():
    with torch.tpu.precision("medium"):
        assert torch.get_float32_matmul_precision() == "medium"
        assert jax.config.jax_default_matmul_precision == "default"
        with torch.tpu.precision(torch.tpu.Precision.HIGH):
            assert torch.get_float32_matmul_precision() == "high"
        assert torch.get_float32_matmul_precision() == "medium"
    assert torch.get_float32_matmul_precision() == "highest"
    with pytest.raises(ValueError, match="must be one of"):
        with torch.tpu.precision("low"):
            pass
