"""`versus_jax`: the rows' commands stay valid for the scripts they run, JAX runs once per
distinct command just before ours, and the table's ratios and verdicts come from the
commands' JSON."""

from __future__ import annotations

import pytest

from benchmarks.device import backend_bench, compile_time_bench, jax_llama_late_reads, versus_jax

PARSERS = {
    "benchmarks.device.backend_bench": backend_bench.parse_args,
    "benchmarks.device.compile_time_bench": compile_time_bench.parse_args,
}


@pytest.mark.parametrize("row", versus_jax.ROWS, ids=lambda r: r.name)
def test_each_rows_commands_parse_with_their_scripts_own_arguments(row):
    module, *args = row.ours
    ours = PARSERS[module]([*args, "--json", "out.json"])  # argparse exits on an unknown or renamed flag
    if row.jax_args:
        jax_args = jax_llama_late_reads.parse_args(versus_jax.jax_command(row)[1:])
        assert f"llama-{jax_args.model}" == ours.model
        # the same checkpointing: JAX's `dots` policy keeps what our `matmuls` keeps
        assert {"full": "full", "dots": "matmuls", "none": None}[jax_args.remat] == ours.remat
    else:  # our command runs JAX's step itself
        assert "jax" in ours.modes.split(",")


def _fake_run(outputs: dict, calls: list):
    """A run that answers from `outputs`, keyed by what ran: "jax ARGS" for JAX's script,
    "ours ROW" for a row's own command."""

    def run(command: tuple, log: str):
        if command[0] == versus_jax.JAX:
            calls.append("jax " + " ".join(command[1:-2]))  # without --lag 2
        else:
            calls.append("ours " + next(r.name for r in versus_jax.ROWS if r.ours == command))
        return outputs[calls[-1]]

    return run


def rows_named(name: str) -> versus_jax.Row:
    return next(r for r in versus_jax.ROWS if r.name == name)


def _step_json(median_s: float, mode: str = "tpu-compile") -> dict:
    step = backend_bench.StepResult(mode=mode, median_s=median_s, first_step_s=90.5)
    return {"steps": [vars(step)]}


JAX_374M = {"compile_s": 10.0, "waited_ms": 204.5, "late_ms": 203.0, "program_gib": 2.93}


def test_jax_runs_once_per_command_before_ours_and_the_ratios_come_from_both(tmp_path, capsys):
    fused = backend_bench.StepResult(mode="tpu-fused", median_s=0.0185, host_median_s=0.0175)
    jax_mingpt = backend_bench.StepResult(mode="jax", median_s=0.0150)
    outputs = {
        "jax --model 374m": JAX_374M,
        "jax --model 950m": "ran past 400 s (log: jax-model-950m.log)",
        "jax --model 374m --remat dots": {**JAX_374M, "waited_ms": 196.2, "program_gib": 8.96},
        "ours 374m": _step_json(0.2101),
        "ours 374m-late": _step_json(0.2101),
        "ours first-step": {"modes": [{"first": {"first_step_s": 27.2}, "second": {"first_step_s": 0.84}}]},
        "ours 950m": _step_json(0.458),
        "ours 374m-matmuls": _step_json(0.2122),
        "ours mingpt-fused": {"steps": [vars(fused), vars(jax_mingpt)]},
        "jax --model 374m --remat full": {**JAX_374M, "program_gib": 4.31},
        "jax --model 374m --remat none": {**JAX_374M, "waited_ms": 179.0, "program_gib": 16.1},
        **{f"ours 374m-step-{p}": _step_json(0.2, "tpu-compile-step") for p in ("full", "matmuls", "none")},
    }
    calls: list = []
    rows = {r["row"]: r for r in versus_jax.measure(list(versus_jax.ROWS), _fake_run(outputs, calls), str(tmp_path))}
    assert calls == [
        "jax --model 374m",
        "ours 374m",
        "ours 374m-late",
        "ours first-step",
        "jax --model 950m",
        "ours 950m",
        "jax --model 374m --remat dots",
        "ours 374m-matmuls",
        "jax --model 374m --remat full",
        "ours 374m-step-full",
        "ours 374m-step-matmuls",  # JAX's `dots` run above serves it too
        "jax --model 374m --remat none",
        "ours 374m-step-none",
        "ours mingpt-fused",  # times JAX's step itself
    ]

    assert rows["374m"]["ratio"] == pytest.approx(204.5 / 210.1) and rows["374m"]["meets"]
    assert rows["374m-late"]["ratio"] == pytest.approx(203.0 / 210.1)  # the late row reads JAX's late figure
    assert rows["950m"]["failed"] == "JAX: ran past 400 s (log: jax-model-950m.log)" and "ratio" not in rows["950m"]
    assert rows["first-step"]["ratio"] == pytest.approx(2.72) and rows["first-step"]["meets"]
    matmuls = rows["374m-matmuls"]
    assert matmuls["ratio"] == pytest.approx(196.2 / 212.2) and not matmuls["meets"]
    assert "(its program 8.96 GiB)" in matmuls["jax"]  # what JAX's policy costs in memory
    assert rows["mingpt-fused"]["ratio"] == pytest.approx(18.5 / 15.0) and not rows["mingpt-fused"]["meets"]
    assert rows["374m-step-none"]["ratio"] == pytest.approx(179.0 / 200.0)  # the one-program step's own mode
    versus_jax.print_table(list(rows.values()))
    printed = capsys.readouterr().out
    assert "0.973 (>= 0.97: met)" in printed and "2.720 (<= 3.0: met)" in printed
    assert "1.233 (<= 1.2: not met)" in printed and "0.925 (>= 0.97: not met)" in printed
    assert "failed: JAX: ran past 400 s" in printed

    outputs["ours first-step"] = {
        "modes": [{"first": {"first_step_s": 27.2}, "second": {"first_step_s": 3.0}}]  # second process 0.11
    }
    (slow_second,) = versus_jax.measure([rows_named("first-step")], _fake_run(outputs, []), str(tmp_path))
    assert not slow_second["meets"]


def test_a_failed_step_in_our_json_fails_the_row_with_its_error(tmp_path):
    failed = backend_bench.StepResult(mode="tpu-compile", error="BackendCompilerFailed: backend='tpu' raised:")
    outputs = {"jax --model 374m": JAX_374M, "ours 374m": {"steps": [vars(failed)]}}
    (row,) = versus_jax.measure([rows_named("374m")], _fake_run(outputs, []), str(tmp_path))
    assert row["failed"] == "ours: BackendCompilerFailed: backend='tpu' raised:"

    jax_failed = backend_bench.StepResult(mode="jax", error="XlaRuntimeError: RESOURCE_EXHAUSTED")
    fused = backend_bench.StepResult(mode="tpu-fused", median_s=0.0185, host_median_s=0.0175)
    outputs["ours mingpt-fused"] = {"steps": [vars(fused), vars(jax_failed)]}
    (row,) = versus_jax.measure([rows_named("mingpt-fused")], _fake_run(outputs, []), str(tmp_path))
    assert row["failed"] == "JAX: XlaRuntimeError: RESOURCE_EXHAUSTED"
