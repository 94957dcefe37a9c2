"""Hugging Face `Trainer` on the "tpu" device against the project's own compiled loop.

    python -m benchmarks.device.trainer_bench                  # a ~30M-parameter Llama, batch 8 x 256 tokens
    python -m benchmarks.device.trainer_bench --small          # a toy size that finishes on a CPU host
    python -m benchmarks.device.trainer_bench --json /tmp/trainer.json

The same LlamaForCausalLM (random weights from a config, no dropout) trains on the same
batches in three ways:

| row | what runs |
| --- | --- |
| `trainer` | `Trainer(model, TrainingArguments(...)).train()` as a CUDA user writes it (AdamW, grad clipping at 1.0, linear schedule), strict eager |
| `trainer-compile` | the same with `torch_compile=True, torch_compile_backend="tpu"` |
| `compiled-step` | the project's one-program step: `torch.compile(step, backend="tpu")` of `torch.func` gradients and PyTorch's functional AdamW (`benchmarks.models.functional_train_step`, the `tpu-compile-step` mode of `backend_bench.py`) |

Per row: the first step's seconds (compilation), steady tokens per second over the steps
after `--warmup` (synchronised at both ends), programs compiled after the warm-up
(`compiles`, from `tpu_backend.compile.cache.compile_stats`; should be 0), and the
throughput as a fraction of
`compiled-step`'s: the figure issue 44 asks for ("Trainer's throughput against the
project's own compiled loop on the same model"). The compiled step does less per step
than Trainer (no clipping, no schedule, no loss bookkeeping): the ratio is what a user
gives up by using Trainer instead of the hand-written loop.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import transformers

import tpu_backend  # noqa: F401
import tpu_backend.compile  # noqa: F401  (registers the "tpu" Dynamo backend)
from benchmarks.harness import write_json
from benchmarks.models import ModelCase, functional_train_step
from tpu_backend.compile.cache import compile_stats

SIZES = {
    "default": dict(hidden=512, layers=4, heads=8, vocab=8192, seq=256, batch=8),
    "small": dict(hidden=64, layers=2, heads=4, vocab=256, seq=32, batch=4),
}


def llama_config(size: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=4 * size["hidden"],
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


def mark() -> tuple[float, int]:
    """Synchronised time and the count of programs compiled so far."""
    torch.tpu.synchronize()
    return time.perf_counter(), compile_stats().total().misses


class StepClock(transformers.TrainerCallback):
    """Marks at the end of step 1, of step `warmup` and of the last step."""

    def __init__(self, warmup: int, steps: int):
        self.marks, self.points, self.start = {}, {1, warmup, steps}, mark()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.points:
            self.marks[state.global_step] = mark()


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
    clock = StepClock(warmup, steps)
    trainer.add_callback(clock)
    trainer.train()
    assert trainer.accelerator.device.type == "tpu"
    return timing(clock.start, clock.marks[1], clock.marks[warmup], clock.marks[steps], steps - warmup, size)


def run_compiled_step(size: dict, steps: int, warmup: int) -> dict:
    model = fresh_model(size).to("tpu")

    def loss(output, target):
        return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), target[:, 1:].flatten())

    case = ModelCase("llama", lambda: model, None, loss)
    step = torch.compile(functional_train_step(model, case, "adamw"), backend="tpu")
    batches = [batch.to("tpu") for batch in token_rows(size, steps * size["batch"]).split(size["batch"])]
    start, marks = mark(), {}
    for index, batch in enumerate(batches, start=1):
        step(batch, batch)
        if index in (1, warmup, steps):
            marks[index] = mark()
    return timing(start, marks[1], marks[warmup], marks[steps], steps - warmup, size)


def timing(start, first, warm, end, timed_steps: int, size: dict) -> dict:
    """Figures from (seconds, programs compiled) marks; compiles after the warm-up should be 0."""
    seconds_per_step = (end[0] - warm[0]) / timed_steps
    return {
        "first_step_s": round(first[0] - start[0], 3),
        "step_ms": round(1e3 * seconds_per_step, 2),
        "tokens_per_s": round(size["batch"] * size["seq"] / seconds_per_step, 1),
        "compiles_after_warmup": end[1] - warm[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a toy size for a CPU host")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed (compilation)")
    parser.add_argument("--rows", default="compiled-step,trainer,trainer-compile")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--out", default="/tmp/trainer_bench", help="Trainer's output_dir (nothing is saved)")
    args = parser.parse_args()
    if not 1 < args.warmup < args.steps:
        parser.error("need 1 < --warmup < --steps")
    size = SIZES["small" if args.small else "default"]
    parameters = sum(p.numel() for p in fresh_model(size).parameters())
    print(
        f"Llama {parameters / 1e6:.1f}M parameters, batch {size['batch']} x {size['seq']} tokens, "
        f"{args.steps} steps ({args.warmup} untimed), device: {torch.tpu.get_device_name()}"
    )
    results = {}
    for row in args.rows.split(","):
        if row == "compiled-step":
            results[row] = run_compiled_step(size, args.steps, args.warmup)
        elif row in ("trainer", "trainer-compile"):
            results[row] = run_trainer(size, args.steps, args.warmup, row == "trainer-compile", args.out)
        else:
            parser.error(f"unknown row {row!r}: use compiled-step, trainer, trainer-compile")
    reference = results.get("compiled-step")
    print(f"{'row':<16} {'first step s':>12} {'step ms':>9} {'tokens/s':>10} {'vs compiled-step':>17} {'compiles':>9}")
    for row, figures in results.items():
        if reference:
            figures["vs_compiled_step"] = round(figures["tokens_per_s"] / reference["tokens_per_s"], 3)
        ratio = f"{figures['vs_compiled_step']:.3f}" if reference else "-"
        print(
            f"{row:<16} {figures['first_step_s']:>12.2f} {figures['step_ms']:>9.2f} "
            f"{figures['tokens_per_s']:>10.1f} {ratio:>17} {figures['compiles_after_warmup']:>9}"
        )
    if args.json:
        write_json(
            args.json,
            {"size": size, "parameters": parameters, "steps": args.steps, "warmup": args.warmup, "rows": results},
        )


if __name__ == "__main__":
    main()
