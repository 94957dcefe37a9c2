"""Rows of docs/generative_families.md for sentence embedders and vision-language models.

Each family is built from the tiny random-weight configs shared with the tests
(benchmarks/families/embedder.py, vlm.py, qwen_vl.py), exported float and with
dynamic int8 weights and with int4 weights (blocks of 32), and measured in LiteRT (XNNPACK, 1 thread, median of --runs calls):

- embedders: max relative error of the embeddings against transformers (each sentence
  alone, pooled, normalised) over batches (1), (3, 9), (17, 4, 30); latency of one `embed`
  call at batch 1 x 32 tokens;
- vision-language models: max relative error of the logits of every decode step after a
  prompt with an image, against the model's own forward with `pixel_values` (quantized:
  against the float file); latency of one `decode` step (and of `encode_image`, in the task cell);
- Qwen2-VL / Qwen2.5-VL (`--qwen-vl`: only these): images of two sizes in one prompt, every
  decode step's logits against transformers' `generate` (quantized: against the float file).

    python -m benchmarks.generative.embedder_vlm_families            # prints the table rows
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.families import embedder as emb
from benchmarks.families import qwen_vl as tq
from benchmarks.families import vlm as tv
from benchmarks.harness import median_ms
from litert_torch import quantize
from litert_torch.generative import embed, export_embedder, export_vlm, qwen_vl, vlm
from runtimes.litert import max_relative_error

# None: float; then the quantized variants, each a row
QUANT = {None: None, "dynamic int8": quantize.dynamic_int8, "int4 weights": lambda: quantize.weight_only_int4(32)}


def _median_ms(runs: int, fn, *args) -> float:
    return median_ms([lambda: fn(*args)], runs, warmup=1)[0]


def embedder_rows(runs: int) -> list[tuple]:
    rows = []
    for name, (build, pooling, head) in emb.CASES.items():
        model, head = build(), head() if head else None
        for quant in QUANT:
            options = {"quant_config": QUANT[quant]()} if quant else {}
            try:
                edge = export_embedder(model, pooling=pooling, head=head, max_len=64, progress=False, **options)
            except ValueError as e:  # a block size that does not divide some layer
                rows.append((name, "embed", f"{quant}: not converted ({str(e).split(';')[0]})", "", "", ""))
                continue
            error = max(
                max_relative_error(embed(edge, seqs), emb.reference(model, seqs, pooling, head))
                for seqs in (emb.sentences(b) for b in emb.BATCHES)
            )
            ids = [emb.sentences([32])[0]]
            latency = _median_ms(runs, embed, edge, ids)
            status = "exact" if quant is None else quant
            rows.append((name, "embed", status, f"{error:.1e}", f"{len(edge) / 1024:.0f} KiB", f"{latency:.2f} ms"))
    return rows


def siglip2_rows(runs: int) -> list[tuple]:
    """SigLIP2's NaFlex image embedder through plain `convert` (its input checks dropped:
    converter/lowering/runtime_checks.py): a 3 x 4 patch image padded to 16 patches."""
    import warnings

    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    import litert_torch

    torch.manual_seed(0)
    config = Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=4, num_patches=16
    )
    model = Siglip2VisionModel(config).eval()
    args = (torch.randn(1, 16, 48), torch.tensor([[1] * 12 + [0] * 4]), torch.tensor([[3, 4]]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the RuntimeCheckWarning naming the dropped input checks
        edge = litert_torch.convert(model, args)
    with torch.no_grad():
        expected = [t.numpy() for t in torch.utils._pytree.tree_leaves(model(*args)) if isinstance(t, torch.Tensor)]
    error = max(max_relative_error(a, b) for a, b in zip(edge(*args), expected))
    latency = _median_ms(runs, edge, *args)
    return [
        (
            "siglip2 naflex (plain convert)",
            "image embedding",
            "exact",
            f"{error:.1e}",
            f"{len(edge) / 1024:.0f} KiB",
            f"{latency:.2f} ms",
        )
    ]


def vlm_rows(runs: int) -> list[tuple]:
    rows = []
    for name, (build, options, images) in tv.CASES.items():
        if name == "gemma3, two images":
            continue
        model = build()
        prompt = np.array(tv.prompt_with_images(images, text_before=3, text_after=2), np.int32)
        px = tv.pixels(images, size=model.config.vision_config.image_size)
        gen = torch.Generator().manual_seed(3)
        ids = np.concatenate([prompt, torch.randint(0, 89, (tv.TOTAL - len(prompt),), generator=gen).int().numpy()])
        with torch.no_grad():
            expected = vlm.reference_forward(model, torch.from_numpy(ids)[None], px, prompt_len=len(prompt))[0].numpy()
        options = {"prefill_len": tv.PREFILL, **options}
        body = prompt if vlm.family(model).prefix_lm else prompt[:-1]
        base = None
        for quant in QUANT:
            extra = {"quant_config": QUANT[quant](), "verify": False} if quant else {}
            edge = export_vlm(model, cache_len=tv.CACHE, progress=False, **options, **extra)
            cache = vlm.prefill_prompt(edge, px.numpy(), body, tv.IMAGE)
            errors, step_logits = [], []
            for pos in range(len(prompt) - 1, tv.TOTAL):
                logits, *cache = edge.runtime.run(
                    [ids[None, pos : pos + 1], np.array([pos], np.int32), *cache], "decode"
                )
                step_logits.append(logits[0, -1])
                errors.append(max_relative_error(logits[0, -1], expected[pos]))
            if quant is None:
                base, error = step_logits, max(errors)
            else:
                error = max(max_relative_error(q, f) for q, f in zip(step_logits, base))
            step = [ids[None, :1], np.array([len(prompt)], np.int32), *cache]
            decode_ms = _median_ms(runs, edge.runtime.run, step, "decode")
            encode_ms = _median_ms(runs, edge.runtime.run, [px.numpy()], "encode_image")
            status = "exact" if quant is None else f"{quant} (vs float)"
            prefill = vlm.PREFILL_WHOLE_PROMPT if vlm.family(model).prefix_lm else vlm.PREFILL
            task = f"encode_image ({encode_ms:.2f} ms) + {prefill} + decode"
            rows.append(
                (name, task, status, f"{error:.1e}", f"{len(edge) / 1024:.0f} KiB", f"{decode_ms:.2f} ms/token")
            )
    return rows


def qwen_vl_rows(runs: int) -> list[tuple]:
    """Qwen2-VL / Qwen2.5-VL (`grids=`, both grids of the tests): every decode step's logits
    after a prompt with both images against transformers' generate (quantized: the float file)."""
    rows = []
    for name, build in tq.BUILDERS.items():
        model = build()
        images = [tq.image(g, seed=2 + i) for i, g in enumerate(tq.GRIDS)]
        prompt = tq.prompt_for(tq.GRIDS)
        tokens, expected = tq.transformers_generate(model, images, prompt)
        ids, base = [prompt[-1]] + tokens, None
        for quant in QUANT:
            extra = {"quant_config": QUANT[quant](), "verify": False} if quant else {}
            edge = export_vlm(
                model, grids=tq.GRIDS, prefill_len=tq.PREFILL, cache_len=tq.CACHE, progress=False, **extra
            )
            cache, rope = qwen_vl.prefill_prompt(edge, images, np.array(prompt, np.int32), tq.IMAGE)
            step_logits = []
            for step in range(tq.STEPS):
                pos = len(prompt) - 1 + step
                inputs = [np.array([[ids[step]]], np.int32), np.array([pos], np.int32), *rope(pos), *cache]
                logits, *cache = edge.runtime.run(inputs, "decode")
                step_logits.append(logits[0, -1])
            reference = expected if quant is None else base
            error = max(max_relative_error(a, b) for a, b in zip(step_logits, reference))
            base = step_logits if quant is None else base
            decode_ms = _median_ms(runs, edge.runtime.run, [inputs[0], inputs[1], *rope(pos + 1), *cache], "decode")
            encode_ms = [
                _median_ms(
                    runs, edge.runtime.run, [qwen_vl.model_patches(model, im)[0].numpy()], qwen_vl.encoder_name(g)
                )
                for im, g in zip(images, tq.GRIDS)
            ]
            status = "exact (vs transformers' generate)" if quant is None else f"{quant} (vs float)"
            encoders = " / ".join(f"{qwen_vl.encoder_name(g)} ({ms:.2f} ms)" for g, ms in zip(tq.GRIDS, encode_ms))
            task = f"{encoders} + prefill + decode (rope_pos)"
            rows.append(
                (name, task, status, f"{error:.1e}", f"{len(edge) / 1024:.0f} KiB", f"{decode_ms:.2f} ms/token")
            )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--siglip2", action="store_true", help="only the SigLIP2 NaFlex row")
    parser.add_argument("--qwen-vl", action="store_true", help="only the Qwen2-VL / Qwen2.5-VL rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.siglip2:
        return print("| " + " | ".join(siglip2_rows(args.runs)[0]) + " |")
    rows = qwen_vl_rows if args.qwen_vl else lambda runs: embedder_rows(runs) + vlm_rows(runs) + qwen_vl_rows(runs)
    for row in rows(args.runs):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
