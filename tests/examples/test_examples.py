"""The train-on-tpu-then-ship examples, each in its tiny form, with its numbers asserted.

Each example trains on the "tpu" device, converts straight from it (no `.cpu()` by the
user), runs the .tflite in LiteRT and returns its figures. The assertions are what a
user of the example would check: the loss fell, the LiteRT model agrees with the
trained PyTorch model, generation matches token for token.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from kernels import tpu

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)

import char_lm  # noqa: E402
import digits_cnn  # noqa: E402
import dlrm_clicks  # noqa: E402
import lora_finetune_export  # noqa: E402
import pallas_op  # noqa: E402
import seq2seq_generate  # noqa: E402
import stable_diffusion  # noqa: E402
import unet_segmentation  # noqa: E402

ROOT = os.path.dirname(EXAMPLES)


# The docs show one machine's run. Only what every machine computes alike is compared with
# them: step counts, row names, file sizes. Trained figures (losses, accuracies, IoU, AUC)
# move with the core count and the CPU (XLA:CPU splits and vectorises sums by both: the UNet's
# IoU after 40 steps was 0.766 on 1 core and 0.752 on 2 of the same machine), so they are
# checked against their own bounds and against PyTorch, never against the docs (nor on a TPU,
# whose sums differ again: tests/chip.py, "summation_order").


def _shown_table(doc: str, header: str) -> list[list[str]]:
    """The rows of the plain-text table under `header` in a markdown file (columns split at 2+ spaces)."""
    with open(os.path.join(ROOT, doc)) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == header.split())
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            return rows
        rows.append(re.split(r"\s{2,}", line.strip()))
    raise AssertionError(f"{doc}: the table under {header!r} has no end")


def _tutorial_says(*phrases: str) -> None:
    """docs/tutorial.md's machine-independent figures for the quick forms are what the run gives."""
    with open(os.path.join(ROOT, "docs/tutorial.md")) as f:
        text = " ".join(f.read().split())
    missing = [p for p in phrases if p not in text]
    assert not missing, f"docs/tutorial.md does not say {missing}: update its figures"


def test_digits_cnn_float_and_int8():
    r = digits_cnn.run(epochs=2)  # what examples/quickstart.py runs
    # the quickstart's table in the README and the tutorial: all but latency (machine-dependent);
    # sizes within 0.1%: tensor names come from a process-wide counter, so a file converted after
    # other tests in the same process carries a few longer names (450,720 B against 450,656 B)
    printed = digits_cnn.table_rows(r)
    for doc in ("README.md", "docs/tutorial.md"):
        shown = _shown_table(doc, "  ".join(digits_cnn.COLUMNS))
        assert [row[0] for row in shown] == [row[0] for row in printed], f"{doc} shows {shown}; quickstart {printed}"
        for doc_row, row in zip(shown, printed):
            if row[4] != "-":
                doc_bytes, run_bytes = (int(x.removesuffix(" B").replace(",", "")) for x in (doc_row[4], row[4]))
                assert abs(doc_bytes - run_bytes) <= 1e-3 * run_bytes, f"{doc} shows {doc_row}; quickstart {row}"
    _tutorial_says(f"Digits ResNet trained on tpu ({r['steps']} steps, loss")
    start, end = r["loss_start_end"]
    assert end < 0.5 * start, r["loss_start_end"]
    assert r["pytorch"]["accuracy"] >= 0.80
    float32, int8 = r["float32"], r["int8"]
    assert float32["agreement"] == 1.0 and float32["max_abs_error"] < 1e-4
    assert float32["accuracy"] == r["pytorch"]["accuracy"]
    assert int8["agreement"] >= 0.95
    assert abs(int8["accuracy"] - r["pytorch"]["accuracy"]) <= 0.03
    assert int8["bytes"] <= 0.3 * float32["bytes"]


def test_unet_segmentation():
    r = unet_segmentation.run(steps=40)
    start, end = r["loss_start_end"]
    assert end < 0.5 * start, r["loss_start_end"]
    assert r["max_relative_error"] <= 1e-4
    assert r["litert"]["pixel_accuracy"] == pytest.approx(r["pytorch"]["pixel_accuracy"], abs=1e-3)
    assert r["pytorch"]["pixel_accuracy"] >= 0.85
    _tutorial_says(f"UNet, {r['steps']} steps: loss", f"{r['bytes'] / 1000:.0f} KB.")


def test_dlrm_clicks():
    r = dlrm_clicks.run(steps=80)
    start, end = r["loss_start_end"]
    assert end < 0.9 * start, r["loss_start_end"]
    assert r["max_relative_error"] <= 1e-4
    assert r["litert"]["auc"] == pytest.approx(r["pytorch"]["auc"], abs=1e-4)
    assert r["pytorch"]["auc"] >= 0.75  # the hidden rule's ceiling is about 0.95
    # the hidden rule's AUC is the generated data's (CPU torch, untrained): the same everywhere
    _tutorial_says(f"DLRM, {r['steps']} steps: loss", f"scores {r['rule_auc']:.3f}", f"{r['bytes'] / 1000:.0f} KB.")


def _check_char_lm(r, loss_drop: float):
    start, end = r["loss_start_end"]
    assert end < loss_drop * start, r["loss_start_end"]
    assert r["litert_text"] == r["pytorch_text"]
    assert r["tokens_equal"] == r["new_tokens"]


@pytest.mark.parametrize(
    "model, steps, loss_drop",
    [("tinyllama", 30, 0.75), ("llama", 12, 0.9), pytest.param("qwen3", 12, 0.9, marks=pytest.mark.slow)],
)
def test_char_lm_generates_like_pytorch(model, steps, loss_drop):
    if model != "tinyllama":
        pytest.importorskip("transformers", reason=f"char_lm's {model} is a transformers model")
    r = char_lm.run(model, steps=steps, new_tokens=16)
    _check_char_lm(r, loss_drop)
    if model == "tinyllama":
        _tutorial_says(f"Character LM (TinyLlama), {steps} steps: loss")


@pytest.mark.parametrize("model", ["llama", pytest.param("gemma", marks=pytest.mark.slow)])
def test_lora_fine_tune_merges_and_generates_like_pytorch(model):
    pytest.importorskip("peft", reason="the example fine-tunes with PEFT's LoRA")
    r = lora_finetune_export.run(model, steps=8, new_tokens=16)
    start, end = r["loss_start_end"]
    assert end < start, r["loss_start_end"]
    assert r["trainable_parameters"] < 0.25 * r["parameters"]  # only the adapters train
    assert r["merge_max_relative_error"] <= 1e-5  # merge_and_unload keeps the adapted model's function
    assert r["tokens_equal"] == r["new_tokens"] and r["max_logit_error"] <= 1e-4, r


def test_pallas_op_trains_like_pytorch_and_lowers_for_tpu():
    r = pallas_op.run(steps=20, lr=1e-2)
    start, end = r["loss_start_end"]
    assert end < 0.85 * start, r["loss_start_end"]
    assert r["max_relative_loss_gap_vs_cpu"] < 1e-4  # the kernel op trains like F.gelu(h + b) on CPU
    # compiled by libtpu (Mosaic included) wherever libtpu loads, as in CI
    assert r["tpu_check"].startswith("compiled") or tpu.compile_unavailable() is not None, r["tpu_check"]


@pytest.mark.slow
def test_stable_diffusion_matches_diffusers():
    r = stable_diffusion.run(steps=4, size=64, int4=False)  # about 60 s on 2 loaded cores
    float32, int8 = r["float32"], r["dynamic int8"]
    assert float32["image_max_abs_error"] <= 1e-3  # the stated tolerance for float32 images in [0, 1]
    assert max(float32["errors"].values()) <= 1e-4
    assert int8["bytes"] <= 0.3 * float32["bytes"]
    assert int8["image_max_abs_error"] <= 0.1
    assert len(stable_diffusion.table_rows(r)) == 9  # PyTorch, float32, int8: one row per signature


def _check_seq2seq(rows, n_models: int):
    assert len(rows) == 3 * n_models
    float_bytes = {r["model"]: r["bytes"] for r in rows if r["variant"] == "float32"}
    for r in rows:
        if r["variant"] == "float32":  # exact: every greedy token, every step's logits
            assert r["tokens_equal"] == r["new_tokens"] and r["max_logit_error"] <= 1e-4, r
        else:  # quantized: smaller, and close along transformers' tokens
            assert r["bytes"] < 0.45 * float_bytes[r["model"]], r
            assert r["max_logit_error"] < (0.1 if r["variant"] == "dynamic int8" else 0.5), r


def test_seq2seq_generate_tiny():
    """Whisper and T5 in their tiny form: float32 exact in LiteRT, int8 and int4 export and run."""
    pytest.importorskip("transformers", reason="seq2seq_generate's models are transformers models")
    _check_seq2seq(seq2seq_generate.run(shape="tiny", new_tokens=8)["rows"], 2)


@pytest.mark.slow
def test_seq2seq_generate_real_shapes():
    """Whisper-tiny and T5-small shaped (3000 mel frames; 60 M parameters) end to end."""
    pytest.importorskip("transformers", reason="seq2seq_generate's models are transformers models")
    _check_seq2seq(seq2seq_generate.run(shape="real", new_tokens=8)["rows"], 2)
