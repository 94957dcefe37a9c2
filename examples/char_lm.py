"""Train a character-level language model on "tpu", export it with a KV cache, generate
text in LiteRT that matches PyTorch token for token.

    .venv/bin/python examples/char_lm.py                    # TinyLlama, 300 steps
    .venv/bin/python examples/char_lm.py --model qwen3      # transformers' Qwen3 (or llama)
    .venv/bin/python examples/char_lm.py --steps 30         # the quick form

Text: seven Shakespeare sonnets shipped in `examples/data/` (public domain); one token
per character. Models (random initial weights, nothing downloads):
- `tinyllama`: the minGPT-sized decoder in `litert_torch.generative` (RMSNorm, rotary
  embeddings, grouped-query attention, SwiGLU);
- `llama` / `qwen3`: `LlamaForCausalLM` / `Qwen3ForCausalLM` built from small configs,
  trained ("fine-tuned") the same way.
After training on the "tpu" device, `export_generative` converts the model straight
from the device into one .tflite with two signatures sharing the weights, `prefill`
and `decode`, whose KV cache is explicit inputs and outputs; `generate` runs the
greedy loop in LiteRT. Printed: the loss, both continuations of a prompt, whether they
agree, and the time per generated token in LiteRT and in PyTorch (with its cache).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, mean_loss, results_table, train  # noqa: E402

from converter.pipeline import cpu_view  # noqa: E402
from litert_torch.generative import TinyLlama, TinyLlamaConfig, export_generative, generate, reference_generate  # noqa: E402

TEXT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sonnets.txt")
MODELS = ("tinyllama", "llama", "qwen3")


class CharTokenizer:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.ids[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def build_model(name: str, vocab: int, context: int) -> nn.Module:
    if name == "tinyllama":
        return TinyLlama(
            TinyLlamaConfig(
                vocab_size=vocab, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, max_seq_len=context
            )
        )
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        tie_word_embeddings=False,
    )
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if name == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")


class NextTokenLoss:
    """Cross-entropy of the next character, for models returning logits or an HF output."""

    def __call__(self, output, targets):
        logits = getattr(output, "logits", output)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def windows(data: torch.Tensor, *, steps: int, batch_size: int, length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - length - 1, (batch_size,), generator=gen)
        chunk = torch.stack([data[s : s + length + 1] for s in starts.tolist()])
        yield chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def pytorch_ms_per_token(model: nn.Module, prompt: torch.Tensor, tokens: int) -> float:
    """PyTorch (CPU) decoding time per token, with a KV cache where the model has one."""
    if isinstance(model, TinyLlama):
        cache = model.empty_cache(len(prompt) + tokens)
        logits, cache = model(prompt[None], torch.arange(len(prompt)), cache)
        start = time.perf_counter()
        for pos in range(len(prompt), len(prompt) + tokens):
            logits, cache = model(logits[:, -1:].argmax(-1), torch.tensor([pos]), cache)
        return (time.perf_counter() - start) / tokens * 1e3
    out = model(prompt[None], use_cache=True)
    start = time.perf_counter()
    for _ in range(tokens):
        out = model(out.logits[:, -1:].argmax(-1), cache=out.cache, use_cache=True)
    return (time.perf_counter() - start) / tokens * 1e3


def run(
    model: str = "tinyllama",
    steps: int = 300,
    batch_size: int = 16,
    length: int = 64,
    lr: float = 3e-3,
    new_tokens: int = 40,
    prompt: str = "Shall I compare thee",
    seed: int = 0,
) -> dict:
    text = open(TEXT_PATH, encoding="utf-8").read()
    tokenizer = CharTokenizer(text)
    data = tokenizer.encode(text)
    context = 128
    torch.manual_seed(seed)
    lm = build_model(model, len(tokenizer.chars), context).to("tpu")
    losses = train(
        lm, windows(data, steps=steps, batch_size=batch_size, length=length, seed=seed), NextTokenLoss(), lr=lr
    )

    start = time.perf_counter()
    edge = export_generative(lm, prefill_len=16, cache_len=context)
    export_s = time.perf_counter() - start
    prompt_ids = tokenizer.encode(prompt)
    start = time.perf_counter()
    litert_ids = generate(edge, prompt_ids, new_tokens)
    litert_ms = (time.perf_counter() - start) / new_tokens * 1e3
    reference = cpu_view(lm).eval()
    torch_ids = reference_generate(reference, prompt_ids, new_tokens)
    return {
        "model": model,
        "steps": steps,
        "loss_start_end": mean_loss(losses),
        "export_s": export_s,
        "bytes": len(edge.model_content()),
        "prompt": prompt,
        "litert_text": tokenizer.decode(litert_ids),
        "pytorch_text": tokenizer.decode(torch_ids),
        "tokens_equal": int(np.sum(np.array(litert_ids) == np.array(torch_ids))),
        "new_tokens": new_tokens,
        "litert_ms_per_token": litert_ms,
        "pytorch_ms_per_token": pytorch_ms_per_token(reference, prompt_ids, new_tokens),
    }


def report(results: dict) -> None:
    start, end = results["loss_start_end"]
    console.print(
        f"[bold]{results['model']}[/] trained on tpu: {results['steps']} steps, loss {start:.2f} -> {end:.2f}; "
        f"exported in {results['export_s']:.1f} s ({results['bytes']:,} B, prefill + decode)"
    )
    rows = [
        [
            "PyTorch (CPU, greedy)",
            repr(results["prompt"] + results["pytorch_text"]),
            "reference",
            f"{results['pytorch_ms_per_token']:.2f} ms",
        ],
        [
            "LiteRT (prefill + decode)",
            repr(results["prompt"] + results["litert_text"]),
            f"{results['tokens_equal']}/{results['new_tokens']}",
            f"{results['litert_ms_per_token']:.2f} ms",
        ],
    ]
    console.print(results_table("Greedy generation", ["runtime", "text", "tokens equal", "per token"], rows))


def main(argv=None) -> dict:
    return cli(
        __doc__,
        run,
        report,
        argv,
        choices={"model": MODELS},
        model="tinyllama",
        steps=300,
        batch_size=16,
        lr=3e-3,
        new_tokens=40,
    )


if __name__ == "__main__":
    main()
