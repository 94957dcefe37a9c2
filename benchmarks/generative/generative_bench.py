"""Generative export benchmark: prefill and decode latency in LiteRT for small LMs.

Per model (seeded random weights, built in code): conversion seconds of
`export_generative` (both signatures), .tflite size, LiteRT latency of one `prefill`
call (a chunk of --prefill-len tokens) and one `decode` call (one token), both through
the signature runner with the whole KV cache passed in and returned, as `generate` does
(XNNPACK, --threads threads, median of --runs calls after warm-up); the same decode step
in PyTorch eager (the cache-wrapped module, interleaved with LiteRT's); decode tokens/s;
max relative error of prefill and decode logits against PyTorch; and whether greedy
generation of --new-tokens tokens matches PyTorch token for token.

    python -m benchmarks.generative.generative_bench
    python -m benchmarks.generative.generative_bench --models tiny_llama --json /tmp/gen.json
    python -m benchmarks.generative.generative_bench --decode-write both   # DYNAMIC_UPDATE_SLICE vs select decode write
    python -m benchmarks.generative.generative_bench --models hf_llama,hf_qwen3 \
        --anchor-python /tmp/anchor-venv/bin/python --clock cpu   # against litert-torch 0.10.0

With `--anchor-python` (an environment with litert-torch 0.10.0, see benchmarks/README.md)
the transformers models are also exported with the anchor's `export_hf`
(`anchor_generative.py`) and both files timed interleaved: prefill and decode ratios, and
the first-token ratio (our prefill, which returns the last position's logits, against the
anchor's prefill plus the decode call its runtime needs for those logits).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from benchmarks import anchors
from benchmarks.harness import CLOCKS, interleaved, machine, round_ratio, write_json
from litert_torch.edge_model import EdgeModel
from litert_torch.generative import (
    TinyLlama,
    TinyLlamaConfig,
    export_generative,
    generate,
    kv_cache,
    reference_generate,
    with_kv_cache,
)
from litert_torch.generative.export import attention_for_export
from litert_torch.generative.kv_cache import attention_bias
from runtimes.litert import LiteRTModel, max_relative_error

# "Small": 4 layers, width 256, 8 query / 4 kv heads of 32, vocabulary 4096 (about 7 M parameters).
SIZE = dict(vocab=4096, dim=256, layers=4, heads=8, kv_heads=4, hidden=688)


def tiny_llama() -> torch.nn.Module:
    cfg = TinyLlamaConfig(
        vocab_size=SIZE["vocab"],
        dim=SIZE["dim"],
        n_layers=SIZE["layers"],
        n_heads=SIZE["heads"],
        n_kv_heads=SIZE["kv_heads"],
        hidden_dim=SIZE["hidden"],
        max_seq_len=1024,
    )
    return TinyLlama(cfg)


def _hf(config_name: str, model_name: str) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=SIZE["vocab"],
        hidden_size=SIZE["dim"],
        intermediate_size=SIZE["hidden"],
        num_hidden_layers=SIZE["layers"],
        num_attention_heads=SIZE["heads"],
        num_key_value_heads=SIZE["kv_heads"],
        head_dim=SIZE["dim"] // SIZE["heads"],
        max_position_embeddings=1024,
    )
    return getattr(transformers, model_name)(cfg)


MODELS = {
    "tiny_llama": tiny_llama,
    "hf_llama": lambda: _hf("LlamaConfig", "LlamaForCausalLM"),
    "hf_qwen3": lambda: _hf("Qwen3Config", "Qwen3ForCausalLM"),
}


# What a call's time is (`harness.CLOCKS`): "wall" or "cpu" (this thread's CPU time: it runs
# LiteRT's kernels with --threads 1; robust to the load of other processes). Set from --clock.
clock = time.perf_counter


def export_with_decode_write(model, write: str, opts) -> tuple[EdgeModel, float]:
    kv_cache.DECODE_WRITE = write
    try:
        start = time.perf_counter()
        edge = export_generative(
            model,
            prefill_len=opts.prefill_len,
            cache_len=opts.cache_len,
            progress=False,
            prefill_logits=opts.prefill_logits,
        )
        seconds = time.perf_counter() - start
    finally:
        kv_cache.DECODE_WRITE = "update_slice"
    return EdgeModel(edge.model_content(), num_threads=opts.threads), seconds


def save_for_anchor(model, folder: str) -> None:
    """The model's weights and config, plus a word-level tokenizer over its vocabulary
    (export_hf insists on a tokenizer; nothing is downloaded)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="t1", eos_token="t2", unk_token="t0"
    ).save_pretrained(folder)


def export_anchor(model, opts, recipe: str = "none") -> dict:
    """Export `model` with the anchor's export_hf (in `opts.anchor_python`'s environment,
    prefill `opts.prefill_len`, cache `opts.cache_len`, quantization `recipe`): its report
    with "content" (the .tflite bytes), or {"error": ...} naming the anchor's last error line."""
    with tempfile.TemporaryDirectory() as work:
        save_for_anchor(model, work)
        out = os.path.join(work, "anchor.tflite")
        command = [
            opts.anchor_python,
            anchors.script("anchor_generative"),
            work,
            out,
            str(opts.prefill_len),
            str(opts.cache_len),
            recipe,
        ]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # else it imports this repo's litert_torch
        proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        report = json.loads(lines[-1])
        report["content"] = Path(out).read_bytes()
    return report


class AnchorSteps:
    """Runs the anchor's `prefill_{P}` and `decode` signatures as `generate` would: inputs
    fed by name (tokens, input_pos, the additive mask, the caches), caches carried over."""

    def __init__(self, content: bytes, prefill_len: int, cache_len: int, threads: int):
        self.runtime = LiteRTModel(content, num_threads=threads)
        self.prefill_key, self.cache_len = f"prefill_{prefill_len}", cache_len
        self.caches: dict = {}

    def inputs(self, key: str, tokens: np.ndarray, positions: np.ndarray) -> list:
        values = {
            "tokens": tokens,
            "input_pos": positions,
            "mask": attention_bias(torch.from_numpy(positions), self.cache_len).numpy()[None, None],
        }
        return [
            values[t.name] if t.name in values else self.caches.get(t.name, np.zeros(t.shape, t.dtype))
            for t in self.runtime.signature(key).inputs
        ]

    def run(self, key: str, inputs: list) -> dict:
        """Outputs by name; the caches among them are kept for the next call."""
        outputs = dict(zip(self.runtime.signature(key).output_names, self.runtime.run(inputs, key)))
        self.caches.update((k, v) for k, v in outputs.items() if k != "logits")
        return outputs


def run_anchor(name: str, model, ids: torch.Tensor, expected: np.ndarray, opts) -> dict:
    """Export `model` with the anchor, check its decode logits, and return its figures
    with callables for interleaved timing: "prefill", "decode" and "first_token" (its
    prefill returns no logits, so its runtime gets the first token's from a decode step
    after the prefill); {"error": ...} if it fails."""
    if not name.startswith("hf_"):
        return {"error": "the anchor's export_hf takes transformers models only"}
    P = opts.prefill_len
    report = export_anchor(model, opts)
    if "error" in report:
        return report
    content = report.pop("content")
    steps = AnchorSteps(content, P, opts.cache_len, opts.threads)
    prefill_in = steps.inputs(steps.prefill_key, ids[:, :P].int().numpy(), np.arange(P, dtype=np.int32))
    steps.run(steps.prefill_key, prefill_in)
    decode_in = steps.inputs("decode", ids[:, P:].int().numpy(), np.array([P], np.int32))
    outputs = steps.run("decode", decode_in)
    report.update(
        bytes=len(content),
        decode_rel_err=max_relative_error(outputs["logits"], expected[:, P:]),
        prefill=lambda: steps.runtime.run(prefill_in, steps.prefill_key),
        decode=lambda: steps.runtime.run(decode_in, "decode"),
        first_token=lambda: (steps.runtime.run(prefill_in, steps.prefill_key), steps.runtime.run(decode_in, "decode")),
    )
    return report


def measure(name: str, opts) -> dict:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    params = sum(p.numel() for p in model.parameters())
    edge, convert_s = export_with_decode_write(
        model, "update_slice" if opts.decode_write == "both" else opts.decode_write, opts
    )
    runtime = edge.runtime
    P = opts.prefill_len
    ids = torch.randint(0, SIZE["vocab"], (1, P + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids)
    expected = getattr(out, "logits", out).numpy()
    empty = [np.zeros(s.shape, s.dtype) for s in runtime.signature("prefill").inputs[2:]]
    prefill_in = [ids[:, :P].int().numpy(), np.arange(P, dtype=np.int32), *empty]
    outputs = runtime.run(prefill_in, "prefill")
    if opts.prefill_logits == "none":
        prefill_err, cache = None, outputs
    else:
        logits, *cache = outputs
        prefill_err = max_relative_error(logits, expected[:, P - logits.shape[1] : P])  # "last": position P-1
    decode_in = [ids[:, P:].int().numpy(), np.array([P], np.int32), *cache]
    logits, *_ = runtime.run(decode_in, "decode")
    decode_err = max_relative_error(logits, expected[:, P:])
    anchor = run_anchor(name, model, ids, expected, opts) if opts.anchor_python else None
    anchor_ok = bool(anchor) and "error" not in anchor

    prefills = [lambda: runtime.run(prefill_in, "prefill")]
    if anchor_ok:
        prefills.append(anchor.pop("prefill"))
        first_token = anchor.pop("first_token")
        if opts.prefill_logits != "none":  # our prefill alone gives the first token's logits
            prefills.append(first_token)
    prefill_samples = interleaved(prefills, opts.runs, clock)
    prefill_times = [statistics.median(t) for t in prefill_samples]
    prefill_ms = prefill_times[0]
    lm = with_kv_cache(model, opts.cache_len)
    torch_decode = [ids[:, P:].int(), torch.tensor([P], dtype=torch.int32), [torch.from_numpy(c) for c in cache]]
    decodes = [lambda: lm(*torch_decode), lambda: runtime.run(decode_in, "decode")]
    if opts.decode_write == "both":  # the same decode step writing with EQUAL + SELECT_V2
        select = export_with_decode_write(model, "select", opts)[0].runtime
        decodes.append(lambda: select.run(decode_in, "decode"))
    if anchor_ok:
        decodes.append(anchor.pop("decode"))
    with torch.no_grad(), attention_for_export(lm):
        decode_samples = interleaved(decodes, opts.runs, clock)
    decode_times = [statistics.median(t) for t in decode_samples]
    torch_ms, decode_ms = decode_times[:2]
    if anchor_ok:
        anchor.update(
            prefill_ms=prefill_times[1],
            decode_ms=decode_times[-1],
            prefill_ratio=round_ratio(prefill_samples[0], prefill_samples[1]),
            first_token_ratio=round_ratio(prefill_samples[0], prefill_samples[2]) if len(prefills) > 2 else None,
            decode_ratio=round_ratio(decode_samples[1], decode_samples[-1]),
            size_ratio=len(edge) / anchor["bytes"],
            convert_speedup=anchor["export_s"] / convert_s,
        )

    prompt = ids[0, :11]
    start = time.perf_counter()
    ours = generate(edge, prompt, opts.new_tokens)
    generate_s = time.perf_counter() - start
    matches = ours == reference_generate(model, prompt, opts.new_tokens)
    return dict(
        model=name,
        params=params,
        convert_s=convert_s,
        bytes=len(edge),
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        torch_decode_ms=torch_ms,
        decode_tok_s=1e3 / decode_ms,
        generate_s=generate_s,
        prefill_rel_err=prefill_err,
        decode_rel_err=decode_err,
        greedy_match=matches,
        decode_select_ms=decode_times[2] if opts.decode_write == "both" else None,
        anchor=anchor,
    )


def anchor_table(rows: list[dict]) -> Table:
    table = Table(
        title="Against litert-torch 0.10.0 export_hf (float32; latency ratios: median over rounds of ours / anchor, "
        "speed-up is anchor s / ours s; targets: latency <= 1.05, size <= 1.01)"
    )
    for col in (
        "model",
        "anchor export s",
        "speed-up",
        "anchor KiB",
        "size ratio",
        "anchor prefill ms",
        "prefill ratio",
        "first-token ratio",
        "anchor decode ms",
        "decode ratio",
        "anchor decode err",
    ):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        a = r["anchor"] or {}
        if "error" in a:
            table.add_row(r["model"], f"[red]{a['error']}[/red]", *[""] * 9)
        elif a:
            table.add_row(
                r["model"],
                f"{a['export_s']:.1f}",
                f"{a['convert_speedup']:.1f}x",
                f"{a['bytes'] / 1024:,.0f}",
                f"{a['size_ratio']:.3f}",
                f"{a['prefill_ms']:.2f}",
                f"{a['prefill_ratio']:.2f}",
                "-" if a["first_token_ratio"] is None else f"{a['first_token_ratio']:.2f}",
                f"{a['decode_ms']:.3f}",
                f"{a['decode_ratio']:.2f}",
                f"{a['decode_rel_err']:.1e}",
            )
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--prefill-len", type=int, default=32)
    parser.add_argument("--cache-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument(
        "--prefill-logits",
        choices=["last", "all", "none"],
        default="last",
        help="which positions' logits the prefill signature returns",
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time per call: wall clock, or this thread's CPU time (with --threads 1; robust to other load)",
    )
    parser.add_argument(
        "--decode-write",
        choices=["update_slice", "select", "both"],
        default="update_slice",
        help="how decode writes its token into the cache (both: time the two, interleaved)",
    )
    parser.add_argument(
        "--anchor-python",
        default=None,
        help="python of an environment with litert-torch 0.10.0 (e.g. /tmp/anchor-venv/bin/python): "
        "export the transformers models with its export_hf too and compare",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    opts = parser.parse_args(argv)
    names = [n.strip() for n in opts.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    warnings.filterwarnings("ignore")
    global clock
    clock = CLOCKS[opts.clock]
    torch.set_num_threads(opts.threads)  # PyTorch's decode step on as many threads as LiteRT's
    console = Console(width=160)
    rows = []
    for name in names:
        console.print(f"[dim]{name}...[/dim]")
        rows.append(measure(name, opts))

    table = Table(
        title=f"Generative export in LiteRT (prefill {opts.prefill_len} tokens, cache "
        f"{opts.cache_len}, {opts.threads} thread(s), decode write: {opts.decode_write})"
    )
    columns = [
        "model",
        "params M",
        "convert s",
        "KiB",
        "prefill ms",
        "decode ms",
        "torch decode ms",
        "decode tok/s",
        "prefill err",
        "decode err",
        f"greedy {opts.new_tokens}",
    ]
    if opts.decode_write == "both":
        columns.append("decode ms select")
    for col in columns:
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        table.add_row(
            r["model"],
            f"{r['params'] / 1e6:.2f}",
            f"{r['convert_s']:.2f}",
            f"{r['bytes'] / 1024:,.0f}",
            f"{r['prefill_ms']:.2f}",
            f"{r['decode_ms']:.3f}",
            f"{r['torch_decode_ms']:.3f}",
            f"{r['decode_tok_s']:.0f}",
            ("-" if r["prefill_rel_err"] is None else f"{r['prefill_rel_err']:.1e}"),
            f"{r['decode_rel_err']:.1e}",
            "match" if r["greedy_match"] else "[red]DIFFERS[/red]",
            *([f"{r['decode_select_ms']:.3f}"] if opts.decode_write == "both" else []),
        )
    console.print(table)
    if opts.anchor_python:
        console.print(anchor_table(rows))
    if opts.json:
        report = dict(
            settings=dict(vars(opts), json=str(opts.json)),
            size=SIZE,
            results=rows,
            environment=machine(),
        )
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(opts.json, report)
        console.print(f"wrote {opts.json}")
    return 0 if all(r["greedy_match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
