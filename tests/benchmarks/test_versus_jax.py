"""`versus_jax`: the rows' commands stay valid for the scripts they run, JAX runs once per
size just before ours, and the table's ratios and verdicts come from the commands' JSON."""

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
    PARSERS[module]([*args, "--json", "out.json"])  # argparse exits on an unknown or renamed flag
    jax_args = jax_llama_late_reads.parse_args(["--model", row.jax_model, "--lag", str(versus_jax.LAG)])
    assert jax_args.model == row.jax_model


def _fake_run(outputs: dict, calls: list):
    def run(command: tuple, log: str):
        calls.append(command[0] if command[0] != versus_jax.JAX else f"jax {command[2]}")
        return outputs[calls[-1]]

    return run


def _step_json(median_s: float) -> dict:
    step = backend_bench.StepResult(mode="tpu-compile", median_s=median_s, first_step_s=90.5)
    return {"steps": [vars(step)]}


def test_jax_runs_once_per_size_before_ours_and_ratios_are_jaxs_time_over_ours(tmp_path, capsys):
    jax_374m = {"compile_s": 10.0, "waited_ms": 204.5, "late_ms": 203.0}
    first_step = {"modes": [{"first": {"first_step_s": 27.2}, "second": {"first_step_s": 0.84}}]}
    outputs = {
        "jax 374m": jax_374m,
        "jax 950m": "ran past 400 s (log: jax-950m.log)",
        "benchmarks.device.backend_bench": _step_json(0.2101),
        "benchmarks.device.compile_time_bench": first_step,
    }
    calls: list = []
    rows = {r["row"]: r for r in versus_jax.measure(list(versus_jax.ROWS), _fake_run(outputs, calls), str(tmp_path))}
    assert calls[:3] == ["jax 374m", "benchmarks.device.backend_bench", "benchmarks.device.backend_bench"]
    assert calls.count("jax 374m") == 1 and calls[3] == "jax 950m"

    assert rows["374m"]["ratio"] == pytest.approx(204.5 / 210.1) and rows["374m"]["meets"]
    assert rows["374m-late"]["ratio"] == pytest.approx(203.0 / 210.1)  # the late row reads JAX's late figure
    assert rows["950m"]["failed"] == "JAX: ran past 400 s (log: jax-950m.log)" and "ratio" not in rows["950m"]
    assert rows["first-step"]["ratio"] == pytest.approx(2.72) and rows["first-step"]["meets"]
    versus_jax.print_table(list(rows.values()))
    printed = capsys.readouterr().out
    assert "0.973 (>= 0.97: met)" in printed and "2.720 (<= 3.0: met)" in printed
    assert "failed: JAX: ran past 400 s" in printed

    outputs["benchmarks.device.compile_time_bench"] = {
        "modes": [{"first": {"first_step_s": 27.2}, "second": {"first_step_s": 3.0}}]  # second process 0.11
    }
    (slow_second,) = versus_jax.measure([versus_jax.ROWS[-1]], _fake_run(outputs, []), str(tmp_path))
    assert not slow_second["meets"]


def test_a_failed_step_in_our_json_fails_the_row_with_its_error(tmp_path):
    failed = backend_bench.StepResult(mode="tpu-compile", error="BackendCompilerFailed: backend='tpu' raised:")
    outputs = {"jax 374m": {"compile_s": 10.0, "waited_ms": 204.5, "late_ms": 203.0}}
    outputs["benchmarks.device.backend_bench"] = {"steps": [vars(failed)]}
    (row,) = versus_jax.measure([versus_jax.ROWS[0]], _fake_run(outputs, []), str(tmp_path))
    assert row["failed"] == "ours: BackendCompilerFailed: backend='tpu' raised:"
