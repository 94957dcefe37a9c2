"""Mixture-of-experts forms in LiteRT: the same Qwen3-MoE config (4 layers, width 256, 8
experts, top-2; random weights) exported with experts="gather" and experts="dense";
prefill (32 tokens) and decode latency, interleaved, 1 thread, and the logit difference.

    .venv/bin/python benchmarks/generative_moe_bench.py
"""

import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.simplefilter("ignore")
from litert_torch.generative import export_generative
from litert_torch.edge_model import EdgeModel
torch.manual_seed(0)
cfg = transformers.Qwen3MoeConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_experts=8,
    num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=512)
m = transformers.Qwen3MoeForCausalLM(cfg).eval()
rts = {}
for form in ("gather", "dense"):
    t = time.time()
    e = export_generative(m, prefill_len=32, cache_len=128, progress=False, experts=form)
    print(form, "export s", round(time.time()-t, 1), "bytes", len(e), flush=True)
    rts[form] = EdgeModel(e.model_content(), num_threads=1).runtime
ids = torch.randint(0, 4096, (1, 33), generator=torch.Generator().manual_seed(1))
cache = [np.zeros(s.shape, np.float32) for s in rts["gather"].signature("decode").inputs[2:]]
pre = [ids[:, :32].int().numpy(), np.arange(32, dtype=np.int32), *cache]
dec = [ids[:, 32:].int().numpy(), np.array([32], np.int32), *cache]
times = {(f, s): [] for f in rts for s in ("prefill", "decode")}
for _ in range(3):
    for f, rt in rts.items(): rt.run(pre, "prefill"); rt.run(dec, "decode")
for _ in range(30):
    for f, rt in rts.items():
        for s, inp in (("prefill", pre), ("decode", dec)):
            t = time.perf_counter(); rt.run(inp, s); times[(f, s)].append((time.perf_counter() - t) * 1e3)
for k, v in times.items(): print(k, f"{statistics.median(v):.3f} ms")
a = rts["gather"].run(dec, "decode")[0]; b = rts["dense"].run(dec, "decode")[0]
print("gather vs dense decode logits max abs diff", float(np.abs(a - b).max()))
