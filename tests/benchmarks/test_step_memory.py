"""`step_memory`: our compiled step's programs compiled for a TPU, and the step's peak."""

from __future__ import annotations

import re

import pytest

from benchmarks.device import step_memory
from benchmarks.device.step_memory import ProgramMemory, step_peak
from kernels.tpu import libtpu_version

MIB = 2**20


def test_the_peak_holds_the_moments_beside_the_model_programs_and_not_beside_the_optimizer():
    forward = ProgramMemory("torch_compile_0_forward", arguments=10 * MIB, temporaries=2 * MIB, outputs=30 * MIB)
    backward = ProgramMemory("torch_compile_0_backward", arguments=35 * MIB, temporaries=5 * MIB, outputs=10 * MIB)
    # the optimizer's arguments already hold the moments, and it writes them in place
    optimizer = ProgramMemory("torch_compile_1_inference", arguments=40 * MIB, temporaries=1 * MIB, outputs=40 * MIB)
    assert step_peak([forward, optimizer], parameter_bytes=10 * MIB) == 62 * MIB  # 10 + 2 + 30 + 2 x 10
    assert step_peak([forward, backward, optimizer], parameter_bytes=10 * MIB) == 70 * MIB  # 35 + 5 + 10 + 20
    assert step_peak([optimizer], parameter_bytes=100 * MIB) == 41 * MIB


@pytest.mark.slow  # one training step here, then three programs compiled by libtpu
@pytest.mark.skipif(libtpu_version() is None, reason="compiling for a TPU needs libtpu (tools/setup.sh installs it)")
def test_keeping_the_matmuls_hands_the_backward_more_than_a_full_recompute(capsys):
    outputs = {}
    for remat in ("full", "matmuls"):
        assert step_memory.main(["--step", "torch-compile", "--model", "llama", "--layers", "3", "--remat", remat]) == 0
        table = capsys.readouterr().out
        rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line.startswith("torch_compile")}
        assert {name.rsplit("_", 1)[-1] for name in rows} == {"forward", "backward", "inference"}, table
        forward = next(cells for name, cells in rows.items() if name.endswith("_forward"))
        outputs[remat] = float(forward[4])  # "0.9 MiB": the forward's outputs, what the backward is handed
        assert re.search(r"step peak on one v5e: [\d.]+ MiB", table), table
    assert outputs["matmuls"] > outputs["full"], outputs


def test_an_unknown_chip_is_refused_before_the_step_runs(capsys):
    with pytest.raises(SystemExit):
        step_memory.main(["--model", "llama", "--chip", "v9x"])
    assert "argument --chip: invalid choice: 'v9x'" in capsys.readouterr().err


def test_the_one_program_comparison_takes_the_reference_shapes_and_policies(capsys):
    with pytest.raises(SystemExit):
        step_memory.main(["--model", "llama"])
    assert "argument --model: invalid choice: 'llama'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_memory.main(["--model", "374m", "--layers", "3"])
    assert "unrecognized arguments: --layers 3" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--policies from full, matmuls, none \\(got dots\\)"):
        step_memory.main(["--policies", "full,dots"])
    assert step_memory.JAX_POLICIES == {"full": "full", "matmuls": "dots", "none": "none"}
