"""int4 generative export of a ~100M-parameter Llama config: file size, prefill and decode
latency in LiteRT, and logit agreement, float against `quantize.weight_only_int4()`
(int4 blockwise FULLY_CONNECTED weights with fp16 scales, int8 for the other weights).

    .venv/bin/python benchmarks/generative_quant_bench.py            # ~100M parameters
    .venv/bin/python benchmarks/generative_quant_bench.py --small    # ~8M, a quick look

Random weights (seeded), built from a transformers LlamaConfig; nothing downloads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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


def timed_ms(fn, runs: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--prefill-len", type=int, default=32)
    parser.add_argument("--cache-len", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    model = model_of(SMALL if opts.small else FULL)
    params = sum(p.numel() for p in model.parameters())
    P = opts.prefill_len
    ids = torch.randint(0, model.config.vocab_size, (1, P + 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits.numpy()[0]
    results = {"params": params}
    for name, config in (("float", None), ("int4", quantize.weight_only_int4())):
        start = time.perf_counter()
        edge = export_generative(
            model,
            prefill_len=P,
            cache_len=opts.cache_len,
            progress=False,
            verify=False,
            **({"quant_config": config} if config else {}),
        )
        convert_s = time.perf_counter() - start
        runtime = EdgeModel(edge.model_content(), num_threads=1).runtime
        cache = [np.zeros(s.shape, np.float32) for s in runtime.signature("decode").inputs[2:]]
        prefill_in = [ids[:, :P].int().numpy(), np.arange(P, dtype=np.int32), *cache]
        logits, *cache = runtime.run(prefill_in, "prefill")
        errors = [max_relative_error(logits[0, -1], expected[P - 1])]
        for pos in range(P, P + 8):
            decode_in = [ids[:, pos : pos + 1].int().numpy(), np.array([pos], np.int32), *cache]
            logits, *cache = runtime.run(decode_in, "decode")
            errors.append(max_relative_error(logits[0, -1], expected[pos]))
        results[name] = dict(
            bytes=len(edge),
            convert_s=convert_s,
            max_rel_err=max(errors),
            prefill_ms=timed_ms(lambda r=runtime, x=prefill_in: r.run(x, "prefill"), opts.runs),
            decode_ms=timed_ms(lambda r=runtime, x=decode_in: r.run(x, "decode"), opts.runs),
        )
        print(name, results[name], flush=True)
    results["size_ratio"] = results["int4"]["bytes"] / results["float"]["bytes"]
    print(json.dumps(results, indent=1))
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
