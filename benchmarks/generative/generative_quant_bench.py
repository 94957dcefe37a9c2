"""int4 generative export of a ~100M-parameter Llama config: file size, prefill and decode
latency in LiteRT, and logit agreement, float against `quantize.weight_only_int4()`
(int4 blockwise FULLY_CONNECTED weights with fp16 scales, int8 for the other weights).

    python -m benchmarks.generative.generative_quant_bench            # ~100M parameters
    python -m benchmarks.generative.generative_quant_bench --small    # ~8M, a quick look
    python -m benchmarks.generative.generative_quant_bench --small --anchor-python /tmp/anchor-venv/bin/python

Random weights (seeded), built from a transformers LlamaConfig; nothing downloads.

With --anchor-python, the same model (same weights) is also exported by litert-torch
0.10.0's `export_hf` with its quantization recipe(s) `--anchor-recipe` (default
`dynamic_wi4b32_afp32`: int4 weights in blocks of 32 with float16 scales, the closest
to ours; ai_edge_quantizer applies it after conversion) and measured here beside ours:
size, logit error at the same steps, and prefill/decode latency with every model's
timed calls interleaved (ABBA) so that load from other processes hits all alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.generative.generative_bench import AnchorSteps, export_anchor
from benchmarks.harness import median_ms, write_json
from litert_torch import quantize
from litert_torch.edge_model import EdgeModel
from litert_torch.generative import export_generative
from runtimes.litert import max_relative_error

FULL = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=8,
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=64,
)
SMALL = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
)


def model_of(size: dict):
    import transformers

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.LlamaConfig(**size, max_position_embeddings=1024, tie_word_embeddings=False)
        return transformers.LlamaForCausalLM(cfg).eval()


def ours(model, config, ids: torch.Tensor, expected: np.ndarray, opts) -> tuple[dict, tuple]:
    """Export with our `quant_config` (None: float), check the prefill logits (unless
    --prefill-logits none) and 8 decode steps against PyTorch; figures and the (prefill, decode) callables to time."""
    P = opts.prefill_len
    start = time.perf_counter()
    edge = export_generative(
        model,
        prefill_len=P,
        cache_len=opts.cache_len,
        progress=False,
        verify=False,
        prefill_logits=opts.prefill_logits,
        **({"quant_config": config} if config else {}),
    )
    convert_s = time.perf_counter() - start
    runtime = EdgeModel(edge.model_content(), num_threads=opts.threads).runtime
    cache = [np.zeros(s.shape, np.float32) for s in runtime.signature("decode").inputs[2:]]
    prefill_in = [ids[:, :P].int().numpy(), np.arange(P, dtype=np.int32), *cache]
    if opts.prefill_logits == "none":
        cache, errors = runtime.run(prefill_in, "prefill"), []
    else:
        logits, *cache = runtime.run(prefill_in, "prefill")
        errors = [max_relative_error(logits[0, -1], expected[P - 1])]
    for pos in range(P, P + 8):
        decode_in = [ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache]
        logits, *cache = runtime.run(decode_in, "decode")
        errors.append(max_relative_error(logits[0, -1], expected[pos]))
    figures = dict(bytes=len(edge), convert_s=convert_s, max_rel_err=max(errors))
    return figures, (lambda: runtime.run(prefill_in, "prefill"), lambda: runtime.run(decode_in, "decode"))


def anchor(model, recipe: str, ids: torch.Tensor, expected: np.ndarray, opts) -> tuple[dict, tuple | None]:
    """The same through the anchor's export_hf with `recipe`. Its prefill signature
    returns only the caches, so the error covers the 8 decode steps."""
    P = opts.prefill_len
    report = export_anchor(model, opts, recipe)
    if "error" in report:
        return report, None
    content = report.pop("content")
    steps = AnchorSteps(content, P, opts.cache_len, opts.threads)
    prefill_in = steps.inputs(steps.prefill_key, ids[:, :P].int().numpy(), np.arange(P, dtype=np.int32))
    outputs = steps.run(steps.prefill_key, prefill_in)
    errors = [max_relative_error(outputs["logits"][0, -1], expected[P - 1])] if "logits" in outputs else []
    for pos in range(P, P + 8):
        decode_in = steps.inputs("decode", ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32))
        errors.append(max_relative_error(steps.run("decode", decode_in)["logits"][0, -1], expected[pos]))
    figures = dict(
        bytes=len(content), convert_s=report["export_s"], import_s=report["import_s"], max_rel_err=max(errors)
    )
    return figures, (
        lambda: steps.runtime.run(prefill_in, steps.prefill_key),
        lambda: steps.runtime.run(decode_in, "decode"),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--prefill-len", type=int, default=32)
    parser.add_argument("--cache-len", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--prefill-logits",
        choices=["last", "none"],
        default="last",
        help="none: our prefill returns only the caches, as the anchor's does (its last layer's "
        "attention output, MLP and lm_head are then dead code), for a like-for-like prefill",
    )
    parser.add_argument(
        "--anchor-python",
        default=None,
        help="python of an environment with litert-torch 0.10.0 (e.g. /tmp/anchor-venv/bin/python): "
        "export the same model with its export_hf and --anchor-recipe, measured beside ours",
    )
    parser.add_argument(
        "--anchor-recipe",
        default="dynamic_wi4b32_afp32",
        help="comma-separated quantization_recipe names for the anchor ('none': its float export)",
    )
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    model = model_of(SMALL if opts.small else FULL)
    params = sum(p.numel() for p in model.parameters())
    P = opts.prefill_len
    ids = torch.randint(0, model.config.vocab_size, (1, P + 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits.numpy()[0]
    results, timers = {"params": params}, {}
    for name, config in (("float", None), ("int4", quantize.weight_only_int4())):
        results[name], timers[name] = ours(model, config, ids, expected, opts)
        print(name, results[name], flush=True)
    recipes = [r.strip() for r in opts.anchor_recipe.split(",") if r.strip()] if opts.anchor_python else []
    for recipe in recipes:
        name = f"anchor {recipe}"
        results[name], timing = anchor(model, recipe, ids, expected, opts)
        if timing:
            timers[name] = timing
        print(name, results[name], flush=True)
    for which, ms in zip(
        ("prefill_ms", "decode_ms"), (median_ms([t[k] for t in timers.values()], opts.runs) for k in (0, 1))
    ):
        for name, value in zip(timers, ms):
            results[name][which] = value
    float_bytes = results["float"]["bytes"]
    for name in timers:
        results[name]["size_vs_float"] = results[name]["bytes"] / float_bytes
    results["size_ratio"] = results["int4"]["size_vs_float"]
    for name in timers:
        if name.startswith("anchor"):
            results[name].update(
                {
                    f"ours_int4 / anchor {k}": results["int4"][k] / results[name][k]
                    for k in ("bytes", "prefill_ms", "decode_ms")
                }
            )
    results["load_average"] = os.getloadavg()
    write_json("-", results)
    if opts.json:
        write_json(opts.json, results)
    return 1 if any("error" in results[f"anchor {r}"] for r in recipes) else 0


if __name__ == "__main__":
    sys.exit(main())
