"""Export encoder-decoders (Whisper, T5) with `encode` and `decode` signatures, generate in
LiteRT, and compare with transformers: float32, dynamic int8 and int4 weights.

    .venv/bin/python examples/seq2seq_generate.py                       # whisper-tiny and t5-small shapes
    .venv/bin/python examples/seq2seq_generate.py --model whisper-tiny  # one of them
    .venv/bin/python examples/seq2seq_generate.py --shape tiny          # the quick form (tiny configs)

Models are built from transformers configs with the real architectures' sizes
(`whisper-tiny`: 4+4 layers, width 384, 80 mel bins, 3000 frames, vocabulary 51,865;
`t5-small`: 6+6 layers, width 512, 8 heads, relative position buckets, vocabulary
32,128) and random weights: nothing downloads. The source is random log-mel features
(Whisper) or random token ids (T5). `export_seq2seq` checks the cached model against the
model's own forward, then converts it; `generate_seq2seq` encodes once and decodes token
by token in LiteRT. Printed per variant: file size, encode time, decode time per token
(median),
how many greedy tokens equal transformers', and the largest logit error at any step (max
relative, along transformers' tokens).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, results_table  # noqa: E402

from litert_torch import quantize  # noqa: E402
from litert_torch.generative import (  # noqa: E402
    Seq2SeqSession,
    export_seq2seq,
    reference_generate_seq2seq,
    score_seq2seq,
)
from runtimes.litert import max_relative_error  # noqa: E402

MODELS = ("whisper-tiny", "t5-small", "all")
SHAPES = ("real", "tiny")

# Whisper's multilingual start: <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>
WHISPER_PROMPT = [50258, 50259, 50359, 50363]


def build(name: str, shape: str, seed: int = 0):
    """(model, source, decoder prompt, export options) for a model shape."""
    import transformers

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    real = shape == "real"
    if name == "whisper-tiny":
        sizes = (
            dict(d_model=384, encoder_layers=4, decoder_layers=4, heads=6, ffn=1536, vocab=51865, mels=80, source=1500)
            if real
            else dict(d_model=64, encoder_layers=2, decoder_layers=2, heads=4, ffn=128, vocab=512, mels=16, source=50)
        )
        config = transformers.WhisperConfig(
            vocab_size=sizes["vocab"],
            num_mel_bins=sizes["mels"],
            d_model=sizes["d_model"],
            encoder_layers=sizes["encoder_layers"],
            decoder_layers=sizes["decoder_layers"],
            encoder_attention_heads=sizes["heads"],
            decoder_attention_heads=sizes["heads"],
            encoder_ffn_dim=sizes["ffn"],
            decoder_ffn_dim=sizes["ffn"],
            max_source_positions=sizes["source"],
            max_target_positions=448 if real else 64,
            decoder_start_token_id=WHISPER_PROMPT[0] if real else 3,
            **({} if real else dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        )
        model = transformers.WhisperForConditionalGeneration(config).eval()
        features = torch.randn(sizes["mels"], 2 * sizes["source"], generator=gen)
        prompt = WHISPER_PROMPT if real else [3, 4, 5, 6]
        return model, features, prompt, dict(cache_len=64)
    if name == "t5-small":
        sizes = (
            dict(d_model=512, layers=6, heads=8, d_ff=2048, vocab=32128)
            if real
            else dict(d_model=64, layers=2, heads=4, d_ff=128, vocab=512)
        )
        config = transformers.T5Config(
            vocab_size=sizes["vocab"],
            d_model=sizes["d_model"],
            d_kv=64 if real else 16,
            d_ff=sizes["d_ff"],
            num_layers=sizes["layers"],
            num_decoder_layers=sizes["layers"],
            num_heads=sizes["heads"],
            decoder_start_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(config).eval()
        source = torch.randint(2, sizes["vocab"], (40,), generator=gen)
        return model, source, [0], dict(source_len=64, cache_len=64)
    raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")


VARIANTS = {
    "float32": None,
    "dynamic int8": quantize.dynamic_int8,
    "int4 (block 32)": lambda: quantize.weight_only_int4(32),
}


def run_model(name: str, shape: str, new_tokens: int, variants: tuple[str, ...]) -> list[dict]:
    model, source, prompt, options = build(name, shape)
    params = sum(p.numel() for p in model.parameters())
    want, want_rows = reference_generate_seq2seq(model, source, new_tokens, decoder_prompt=prompt, return_logits=True)
    teacher = prompt + want[:-1]  # every variant is scored along transformers' tokens
    rows = []
    for variant in variants:
        quant = VARIANTS[variant]
        start = time.perf_counter()
        edge = export_seq2seq(
            model, progress=False, verify=variant == "float32", quant_config=quant() if quant else None, **options
        )
        export_s = time.perf_counter() - start
        got = score_seq2seq(edge, source, teacher)[len(prompt) - 1 :]
        error = max(max_relative_error(g, w) for g, w in zip(got, want_rows))
        # greedy generation in LiteRT, timed: encode once, then one decode call per token
        start = time.perf_counter()
        session = Seq2SeqSession(edge, source)
        encode_ms = (time.perf_counter() - start) * 1e3
        for token in prompt[:-1]:
            session.step(token)
        tokens, token, times = [], prompt[-1], []
        for _ in range(new_tokens):
            start = time.perf_counter()
            token = int(np.argmax(session.step(token)))
            times.append(time.perf_counter() - start)
            tokens.append(token)
        decode_ms = statistics.median(times) * 1e3  # the median step: other processes share the machine
        rows.append(
            {
                "model": f"{name} ({shape})",
                "variant": variant,
                "params": params,
                "bytes": len(edge),
                "export_s": export_s,
                "encode_ms": encode_ms,
                "ms_per_token": decode_ms,
                "tokens_equal": int(sum(a == b for a, b in zip(tokens, want))),
                "new_tokens": new_tokens,
                "max_logit_error": error,
            }
        )
    return rows


def run(model: str = "all", shape: str = "real", new_tokens: int = 16, quantized: bool = True) -> dict:
    names = ("whisper-tiny", "t5-small") if model == "all" else (model,)
    variants = tuple(VARIANTS) if quantized else ("float32",)
    return {"rows": [row for name in names for row in run_model(name, shape, new_tokens, variants)]}


def report(results: dict) -> None:
    columns = ["model", "variant", "size", "encode", "per token", "tokens equal", "max logit err"]
    rows = [
        [
            r["model"],
            r["variant"],
            f"{r['bytes'] / 1e6:.1f} MB",
            f"{r['encode_ms']:.1f} ms",
            f"{r['ms_per_token']:.2f} ms",
            f"{r['tokens_equal']}/{r['new_tokens']}",
            f"{r['max_logit_error']:.1e}",
        ]
        for r in results["rows"]
    ]
    console.print(results_table("Encoder-decoder generation in LiteRT vs transformers", columns, rows))


def main(argv=None) -> dict:
    return cli(
        __doc__,
        run,
        report,
        argv,
        choices={"model": MODELS, "shape": SHAPES},
        model="all",
        shape="real",
        new_tokens=16,
        quantized=True,
    )


if __name__ == "__main__":
    main()
