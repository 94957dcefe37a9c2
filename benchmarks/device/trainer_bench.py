"""Hugging Face `Trainer` on the "tpu" device against the hand-written compiled loop.

    python -m benchmarks.device.trainer_bench                  # the issue's Llama: 8 layers, d 512, batch 8 x 256
    python -m benchmarks.device.trainer_bench --small          # a toy size that finishes on a CPU host
    python -m benchmarks.device.trainer_bench --rows compiled-loop,trainer --json /tmp/trainer.json

The same LlamaForCausalLM (random weights from a config, no dropout, float32) trains on the
same batches in each row, each row in a process of its own with an empty compilation cache
(so every first step compiles what a user's first run compiles):

| row | what runs |
| --- | --- |
| `compiled-loop` | the loop a CUDA user writes: `torch.compile(model, backend="tpu")`, `loss.backward()`, `AdamW.step()`, `zero_grad()` (the reference of the ratios) |
| `compiled-step` | the project's one-program step: `torch.compile` of `torch.func` gradients and PyTorch's functional AdamW (`benchmarks.models.functional_train_step`) |
| `trainer` | `Trainer(model, TrainingArguments(...)).train()` with Trainer's defaults (AdamW, clipping at 1.0, linear schedule, the NaN/Inf loss filter): what a user gets |
| `trainer-compile` | the same with `torch_compile=True, torch_compile_backend="tpu"` |
| `trainer-eager` | the same with the device's compiled step switched off (`TPU_TRAINER_COMPILE=0`): strict eager, per-op programs |
| `trainer-fused` | the same switched off, in fused eager mode (`TPU_EAGER_MODE=fused`) |

Each row runs `--rounds` times, the rows' order reversed every other round (ABBA); figures
are medians, and the ratio to `compiled-loop` the median of each round's ratio. Per row: the
first step's seconds (compilation), the steady step time over the steps after
`--warmup` (synchronised at both ends), the slowest later step against the median of the
steps' own times (a stall: a compile after the first step), per-op programs and compiled
programs launched per step, programs compiled after the second step (should be 0), and
throughput against `compiled-loop`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F
import transformers

import tpu_backend  # noqa: F401
import tpu_backend.compile  # noqa: F401  (registers the "tpu" Dynamo backend)
from benchmarks.harness import console, module_command, repo_env, table, write_json
from benchmarks.models import ModelCase, functional_train_step
from tpu_backend.compile.cache import compile_stats
from tpu_backend.eager.runner import CACHE_STATS

SIZES = {
    # the Llama of issue 66 (measured on a v5e on 2026-12-07): 33.4M parameters
    "default": dict(hidden=512, layers=8, heads=8, ffn=1408, vocab=8192, seq=256, batch=8),
    "small": dict(hidden=64, layers=2, heads=4, ffn=128, vocab=256, seq=32, batch=4),
}
ROWS = ("compiled-loop", "compiled-step", "trainer", "trainer-compile", "trainer-eager", "trainer-fused")
REFERENCE = "compiled-loop"
# each row's environment beside the parent's
ROW_ENV = {
    "trainer-eager": {"TPU_TRAINER_COMPILE": "0"},
    "trainer-fused": {"TPU_TRAINER_COMPILE": "0", "TPU_EAGER_MODE": "fused"},
}


def llama_config(size: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["ffn"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=size["seq"],
    )


def fresh_model(size: dict) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(llama_config(size))


def token_rows(size: dict, count: int) -> torch.Tensor:
    return torch.randint(0, size["vocab"], (count, size["seq"]), generator=torch.Generator().manual_seed(1))


class Marks:
    """Per step: the host's clock and counters when the step's work was issued (not waited
    for: a stall shows as a long interval, while a steady step shows the chip's pace once the
    queue is full), and synchronised marks at the end of step 1, of step `warmup` and of the
    last (a synchronisation inside the loop would change what the steps after it compile)."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.issued: list[tuple[float, int, int, int]] = []
        self.synced: dict[int, tuple[float, int, int, int]] = {}
        self.start = self._sync()

    @staticmethod
    def _counters() -> tuple[float, int, int, int]:
        """(seconds, programs compiled, per-op programs run, compiled programs run) so far."""
        programs = compile_stats().total()
        return time.perf_counter(), CACHE_STATS.misses + programs.misses, CACHE_STATS.requests, programs.requests

    def _sync(self) -> tuple[float, int, int, int]:
        torch.tpu.synchronize()
        return self._counters()

    def step_done(self, step: int) -> None:
        self.issued.append(self._counters())
        if step in (1, self.warmup, self.steps):
            self.synced[step] = self._sync()

    def figures(self, size: dict) -> dict:
        first, warm, end = (self.synced[k] for k in (1, self.warmup, self.steps))
        timed = self.steps - self.warmup
        seconds_per_step = (end[0] - warm[0]) / timed
        intervals = [b[0] - a[0] for a, b in zip(self.issued, self.issued[1:])][1:]  # steps 3..N
        median = statistics.median(intervals)
        return {
            "first_step_s": round(first[0] - self.start[0], 3),
            "step_ms": round(1e3 * seconds_per_step, 2),
            "tokens_per_s": round(size["batch"] * size["seq"] / seconds_per_step, 1),
            "slowest_later_step_x": round(max(intervals) / median, 2),
            "slowest_later_step_s": round(max(intervals), 3),
            "per_op_programs_per_step": round((end[2] - warm[2]) / timed, 1),
            "compiled_programs_per_step": round((end[3] - warm[3]) / timed, 1),
            "compiles_after_step_2": end[1] - self.issued[1][1],
        }


class StepMarks(transformers.TrainerCallback):
    def __init__(self, marks: Marks):
        self.marks = marks

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.step_done(state.global_step)


def run_trainer(size: dict, steps: int, warmup: int, compile_model: bool, out: str) -> dict:
    rows = token_rows(size, steps * size["batch"])
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    args = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=size["batch"],
        max_steps=steps,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        logging_steps=steps,
        torch_compile=compile_model,
        torch_compile_backend="tpu" if compile_model else None,
    )
    trainer = transformers.Trainer(fresh_model(size), args, train_dataset=dataset)
    marks = Marks(warmup, steps)
    trainer.add_callback(StepMarks(marks))
    trainer.train()
    assert trainer.accelerator.device.type == "tpu"
    return marks.figures(size)


def causal_lm_loss(output, target):
    return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), target[:, 1:].flatten())


def run_compiled_loop(size: dict, steps: int, warmup: int) -> dict:
    """The hand-written loop: the model compiled, the optimizer PyTorch's AdamW as it is."""
    model = torch.compile(fresh_model(size).to("tpu"), backend="tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = token_rows(size, steps * size["batch"]).split(size["batch"])
    marks = Marks(warmup, steps)
    for index, batch in enumerate(batches, start=1):
        batch = batch.to("tpu")
        causal_lm_loss(model(input_ids=batch), batch).backward()
        optimizer.step()
        optimizer.zero_grad()
        marks.step_done(index)
    return marks.figures(size)


def run_compiled_step(size: dict, steps: int, warmup: int) -> dict:
    model = fresh_model(size).to("tpu")
    case = ModelCase("llama", lambda: model, None, causal_lm_loss)
    step = torch.compile(functional_train_step(model, case, "adamw"), backend="tpu")
    batches = token_rows(size, steps * size["batch"]).split(size["batch"])
    marks = Marks(warmup, steps)
    for index, batch in enumerate(batches, start=1):
        batch = batch.to("tpu")
        step(batch, batch)
        marks.step_done(index)
    return marks.figures(size)


def run_row(row: str, size: dict, steps: int, warmup: int, out: str) -> dict:
    if row == "compiled-loop":
        return run_compiled_loop(size, steps, warmup)
    if row == "compiled-step":
        return run_compiled_step(size, steps, warmup)
    return run_trainer(size, steps, warmup, row == "trainer-compile", out)


def run_in_child(row: str, argv: list[str]) -> dict:
    """One row in a fresh process with an empty compilation cache; its figures back as JSON."""
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "row.json")
        env = repo_env(TPU_CACHE_DIR=os.path.join(folder, "cache"), **ROW_ENV.get(row, {}))
        command = module_command("benchmarks.device.trainer_bench", *argv, "--child", row, "--child-json", result)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"row {row} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        with open(result) as f:
            return json.load(f)


def median_figures(runs: list[dict]) -> dict:
    """A row's figures over rounds: the median of each (the worst for the slowest later step
    and the compiles after step 2)."""
    worst = ("slowest_later_step_x", "slowest_later_step_s", "compiles_after_step_2")
    return {key: (max if key in worst else statistics.median)(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a toy size for a CPU host")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed (compilation)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every row, in ABBA order (medians)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--out", default="/tmp/trainer_bench", help="Trainer's output_dir (nothing is saved)")
    parser.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 2 < args.warmup < args.steps:
        parser.error("need 2 < --warmup < --steps")
    rows = args.rows.split(",")
    for row in rows:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}: use {', '.join(ROWS)}")
    size = SIZES["small" if args.small else "default"]
    if args.child:
        figures = run_row(args.child, size, args.steps, args.warmup, args.out)
        write_json(args.child_json, figures)
        return
    parameters = sum(p.numel() for p in fresh_model(size).parameters())
    print(
        f"Llama {parameters / 1e6:.1f}M parameters, batch {size['batch']} x {size['seq']} tokens, "
        f"{args.steps} steps ({args.warmup} untimed), device: {torch.tpu.get_device_name()}"
    )
    passed = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--out", args.out] + (
        ["--small"] if args.small else []
    )
    rounds = [{} for _ in range(args.rounds)]
    for i, figures in enumerate(rounds):  # ABBA: the order reversed every other round
        for row in rows if i % 2 == 0 else reversed(rows):
            figures[row] = run_in_child(row, passed)
    results = {row: median_figures([figures[row] for figures in rounds]) for row in rows}
    reference = results.get(REFERENCE)
    if reference:  # each row against the reference of its own round, the median over rounds
        for row, figures in results.items():
            figures[f"vs_{REFERENCE}"] = round(
                statistics.median(r[row]["tokens_per_s"] / r[REFERENCE]["tokens_per_s"] for r in rounds), 3
            )
    columns = ["row", "first step s", "step ms", "tokens/s", f"x {REFERENCE}", "slowest later step", "per-op / step"]
    columns += ["compiled / step", "compiles after step 2"]
    out = table("Trainer against the hand-written compiled loop", columns)
    for row, figures in results.items():
        if reference:
            figures["first_step_vs_reference"] = round(figures["first_step_s"] / reference["first_step_s"], 2)
        out.add_row(
            row,
            f"{figures['first_step_s']:.2f}",
            f"{figures['step_ms']:.2f}",
            f"{figures['tokens_per_s']:.0f}",
            f"{figures[f'vs_{REFERENCE}']:.3f}" if reference else "-",
            f"{figures['slowest_later_step_x']:.1f}x ({figures['slowest_later_step_s']:.2f} s)",
            f"{figures['per_op_programs_per_step']:g}",
            f"{figures['compiled_programs_per_step']:g}",
            str(figures["compiles_after_step_2"]),
        )
    console().print(out)
    if args.json:
        write_json(
            args.json,
            {
                "size": size,
                "parameters": parameters,
                "steps": args.steps,
                "warmup": args.warmup,
                "rounds": rounds,
                "rows": results,
            },
        )


if __name__ == "__main__":
    main()
