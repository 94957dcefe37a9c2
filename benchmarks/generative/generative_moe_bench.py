"""Mixture-of-experts forms in LiteRT: the same Qwen3-MoE config (4 layers, width 256, 8
experts, top-2; random weights) exported with experts="gather" and experts="dense";
prefill (32 tokens) and decode latency, interleaved, 1 thread, and the logit difference.

    python -m benchmarks.generative.generative_moe_bench
"""

import time
import warnings

import numpy as np
import torch
import transformers

from benchmarks.harness import median_ms
from litert_torch.edge_model import EdgeModel
from litert_torch.generative import export_generative

PREFILL, CACHE, ROUNDS = 32, 128, 30


def main():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        max_position_embeddings=512,
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    runtimes = {}
    for form in ("gather", "dense"):
        start = time.time()
        edge = export_generative(model, prefill_len=PREFILL, cache_len=CACHE, progress=False, experts=form)
        print(form, "export s", round(time.time() - start, 1), "bytes", len(edge), flush=True)
        runtimes[form] = EdgeModel(edge.model_content(), num_threads=1).runtime
    ids = torch.randint(0, cfg.vocab_size, (1, PREFILL + 1), generator=torch.Generator().manual_seed(1))
    cache = [np.zeros(s.shape, np.float32) for s in runtimes["gather"].signature("decode").inputs[2:]]
    inputs = {
        "prefill": [ids[:, :PREFILL].int().numpy(), np.arange(PREFILL, dtype=np.int32), *cache],
        "decode": [ids[:, PREFILL:].int().numpy(), np.array([PREFILL], np.int32), *cache],
    }
    calls = {(form, sig): (rt, args, sig) for form, rt in runtimes.items() for sig, args in inputs.items()}
    # interleaved, so load from other processes hits both forms
    medians = median_ms([lambda c=c: c[0].run(c[1], c[2]) for c in calls.values()], ROUNDS, warmup=1)
    for (form, sig), value in zip(calls, medians):
        print(f"{form:7s} {sig:8s} {value:.3f} ms")
    a, b = (runtimes[form].run(inputs["decode"], "decode")[0] for form in ("gather", "dense"))
    print("gather vs dense decode logits max abs diff", float(np.abs(a - b).max()))


if __name__ == "__main__":
    main()
