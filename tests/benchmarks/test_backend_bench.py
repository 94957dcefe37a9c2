"""`benchmarks/device/backend_bench.py` and its JAX ceiling (`benchmarks/device/jax_mingpt.py`), at the
small transformer: the hand-written JAX step computes PyTorch's step, lowers for a TPU,
and the benchmark reports CPU time beside wall time."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks.device import backend_bench, jax_mingpt


def test_jax_step_matches_pytorch_and_lowers_for_tpu():
    # Three steps: the losses of steps 2 and 3 check the custom_vjp gradients and AdamW.
    for jax_loss, torch_loss in jax_mingpt.check_against_torch("transformer", 3):
        assert jax_loss == pytest.approx(torch_loss, rel=1e-5)
    trainer = jax_mingpt.JaxTrainer("transformer")
    exported = jax.export.export(trainer._step, platforms=["tpu"])(
        trainer.params, trainer.state, trainer.tokens, trainer.targets
    )
    assert "stablehlo.dot_general" in exported.mlir_module()


def test_bench_reports_cpu_time_beside_wall_time(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", "transformer", "--modes", "cpu-eager,jax", "--steps", "2", "--warmup", "1", "--skip-ops"]
    assert backend_bench.main([*argv, "--json", str(out)]) == 0
    steps = {s["mode"]: s for s in json.loads(out.read_text())["steps"]}
    for step in steps.values():
        assert step["cpu_median_s"] > 0 and step["host_cpu_median_s"] > 0 and len(step["cpu_steps"]) == 2
    assert steps["jax"]["final_loss"] == pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-5)
    results = [backend_bench.StepResult(**s) for s in steps.values()]
    assert backend_bench._ratio(results, "cpu-eager", "jax", "cpu") == pytest.approx(
        steps["cpu-eager"]["cpu_median_s"] / steps["jax"]["cpu_median_s"]
    )


@pytest.mark.slow  # the default suite's time budget: tests/tpu_backend/compile/test_scan_layers.py checks the scan
def test_scan_layers_flag_trains_the_llama_case_like_cpu(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", "llama", "--remat", "--scan-layers", "--modes", "cpu-eager,tpu-compile"]
    assert backend_bench.main([*argv, "--steps", "1", "--warmup", "1", "--skip-ops", "--json", str(out)]) == 0
    steps = {s["mode"]: s for s in json.loads(out.read_text())["steps"]}
    assert steps["tpu-compile"]["final_loss"] == pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-5)


class _SimulatedStep:
    """A training step on a simulated clock: `host` seconds to enqueue, then `device`
    seconds on a device that runs steps in order; reading a loss waits for its step."""

    def __init__(self, clock: list, host: float, device: float):
        self.clock, self.host, self.device, self.device_free = clock, host, device, 0.0

    def enqueue(self) -> float:
        self.clock[0] += self.host
        self.device_free = max(self.device_free, self.clock[0]) + self.device
        return self.device_free  # the "loss" is the time its step finishes

    def read(self, done: float) -> float:
        self.clock[0] = max(self.clock[0], done)
        return done

    wait = read

    def __call__(self):  # one step waited for: (loss, host seconds, host CPU seconds)
        return self.read(self.enqueue()), self.host, self.host


@pytest.mark.parametrize(("host", "device"), [(0.010, 0.006), (0.002, 0.015)])
def test_pipelined_step_time_is_the_slower_of_host_and_device(monkeypatch, host, device):
    # Steady state of a loop that reads each loss 4 steps late: max(host, device) per step.
    # A drain at the end of each sample would add device / 4 in the host-bound case.
    clock = [0.0]
    monkeypatch.setattr(backend_bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(backend_bench.time, "process_time", lambda: clock[0])
    monkeypatch.setattr(backend_bench.time, "thread_time", lambda: clock[0])
    sample = backend_bench._timed_pipelined(_SimulatedStep(clock, host, device), lag=4)
    assert sample.wall == pytest.approx(max(host, device))
    assert sample.host == pytest.approx(host)


def test_the_first_step_of_a_pipelined_loop_is_one_step_waited_for(monkeypatch):
    # The first step carries the compiles: a pipelined sample would start its interval after
    # the first read and report the steady step instead (0.1 s for a 90 s compile, 12-07).
    clock = [0.0]
    monkeypatch.setattr(backend_bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(backend_bench.time, "process_time", lambda: clock[0])
    monkeypatch.setattr(backend_bench, "_pipeline", 4)
    step = _SimulatedStep(clock, host=0.010, device=0.006)
    first = backend_bench._timed(step, first=True)
    assert first.wall == pytest.approx(0.016)  # enqueued, then waited for: host + device
    assert backend_bench._timed(step).wall == pytest.approx(0.010)  # then the steady pipelined figure


def test_floor_mode_runs_the_shrunk_model_beside_the_real_one(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--model", "transformer", "--modes", "cpu-eager,cpu-floor,jax", "--steps", "1", "--warmup", "1"]
    assert backend_bench.main([*argv, "--pipeline", "2", "--skip-ops", "--json", str(out)]) == 0
    steps = {s["mode"]: s for s in json.loads(out.read_text())["steps"]}
    # the pipelined loop trains every mode the same number of steps: equal losses
    assert steps["jax"]["final_loss"] == pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-5)
    # the floor trains another (shrunk) model: its own loss, a host time of its own
    assert steps["cpu-floor"]["final_loss"] != pytest.approx(steps["cpu-eager"]["final_loss"], rel=1e-3)
    assert steps["cpu-floor"]["host_median_s"] > 0
    case = backend_bench.floor_case("mingpt")
    model = case.build()
    assert len(model.blocks) == 6 and model.config.width == 12 and case.batch.batch_size == 1
    with pytest.raises(ValueError, match="cpu-floor.*GPT models"):
        backend_bench.floor_case("llama")


@pytest.mark.slow  # the default suite's time budget (a compiled step and optimizer, 7 s)
def test_timeline_orders_a_compiled_steps_parts_and_restores_what_it_wrapped(capsys):
    from tpu_backend.compile import compiled_graph

    graph_call = compiled_graph.CompiledGraph.__call__
    argv = ["--model", "transformer", "--compile-optimizer", "--timeline", "tpu-compile", "--steps", "2"]
    assert backend_bench.main([*argv, "--warmup", "1"]) == 0
    rows = [line.split("│")[1:3] for line in capsys.readouterr().out.splitlines() if line.count("│") == 3]
    order = [label.strip() for _, label in rows]
    times = [float(ms) for ms, _ in rows]
    assert times == sorted(times)
    # forward graph and its launch, the backward's, the optimizer's; then the wait and the read
    for before, after in [("zero_grad #1", "graph #1"), ("launch #1", "launch end #1"), ("backward #1", "graph #2")]:
        assert order.index(before) < order.index(after), order
    assert order[-4:] == ["synchronize #1", "synchronize end #1", "item #1", "item end #1"], order
    assert "graph #3" in order  # the compiled optimizer step
    assert compiled_graph.CompiledGraph.__call__ is graph_call
